"""The data a run reads: the token files prepare.py wrote and their tokenizer; the training data's order (rows_at, a
function of the position in the run alone) and the masked micro-batches of each step (Batches); the validation score
(Validation) and the fill-in examples. Training, benchmarks and fine-tuning need only torch, numpy and tiktoken here,
not `datasets`."""
import bz2
import contextlib
import functools
import gzip
import hashlib
import lzma
import os
import re

import numpy as np
import torch

from model import mask_tokens
from .files import SPECIAL_TOKENS, load_meta, parse_ranks, special_ids, unfound  # noqa: F401  (SPECIAL_TOKENS: the scripts take it from here)

# GPT-2's pre-tokenisation regex, `tokenizers`' ByteLevel one too: a BPE trained there gives the same ids through tiktoken
SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TOKENIZER_FILE = "tokenizer.tiktoken"
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}  # a text file's compression, by its last suffix


def make_encoding(ranks, special_ids):
    import tiktoken
    return tiktoken.Encoding(name="cram", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special_ids)


def read_tokenizer(data_dir, meta):
    """(the tokenizer file's text, its ranks), checked against meta.json: as many tokens as n_regular."""
    path = os.path.join(data_dir, meta["tokenizer_file"])
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: cannot read the tokenizer {path} ({e}): delete {data_dir} and run prepare.py again")
    ranks = parse_ranks(text, path)
    if len(ranks) != meta["n_regular"]:
        raise SystemExit(f"error: {path} holds {len(ranks)} tokens but meta.json says {meta['n_regular']}: {data_dir} "
                         f"mixes two preparations; delete it and run prepare.py again")
    return text, ranks


def load_tokenizer(data_dir, meta=None):
    """The corpus' own tokenizer as a tiktoken.Encoding (use encode_ordinary for raw text)."""
    meta = meta or load_meta(data_dir)
    return make_encoding(read_tokenizer(data_dir, meta)[1], meta["special_ids"])


def load_tokens(data_dir, split, meta=None):
    """The (sequences, seq_len) token ids of 'train' or 'val', memory-mapped, checked against meta.json and every id
    below the vocabulary size (one pass, not a GPU's opaque device-side assert at the first bad id)."""
    meta = meta or load_meta(data_dir)
    path, n = os.path.join(data_dir, f"{split}.bin"), meta[f"{split}_sequences"]
    if not os.path.isfile(path) or os.path.getsize(path) != n * meta["seq_len"] * np.dtype(meta["dtype"]).itemsize:
        raise unfound(path, f"error: {path} is missing or does not match meta.json: the folder is damaged; delete "
                            f"it and run prepare.py again")
    tokens = np.memmap(path, dtype=meta["dtype"], mode="r", shape=(n, meta["seq_len"]))
    for start in range(0, n, 1 << 20):
        if tokens[start:start + (1 << 20)].max() >= meta["vocab_size"]:
            raise SystemExit(f"error: {path} holds token ids at or above the vocabulary size {meta['vocab_size']} "
                             f"(rows {start} to {min(n, start + (1 << 20)) - 1}): the folder is damaged; delete it "
                             f"and run prepare.py again")
    return tokens


def get_batch(tokens, rows, device):
    """The sequences of the given rows, in row order (sorted: a sequential read), as an int64 tensor on device."""
    return to_device(torch.from_numpy(tokens[np.sort(rows)].astype(np.int64)), device)


def to_device(tensor, device):
    """On a GPU from pinned memory without waiting (a copy from pageable memory waits for the device's queue)."""
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tensor.to(device)


def repeat_warning(expected, train_tokens, basis):
    """A one-line warning, in the data's unit (B, M or k), where the run trains more tokens than it holds (`basis`)."""
    scale, unit = next(((s, u) for s, u in ((1e9, "B"), (1e6, "M")) if train_tokens >= s), (1e3, "k"))
    return (f"warning: {basis} the run will train about {expected / scale:.2f}{unit} tokens, {expected / train_tokens:.1f} "
            f"epochs of the {train_tokens / scale:.2f}{unit} training tokens: repeated data overfits; prepare a larger "
            f"corpus (see the README)") if expected > train_tokens else None


@torch.no_grad()
def fill_in(model, tokens, meta, enc, rt, n, seed):
    """n fill-in-the-blank lines: a word of n validation sequences as [MASK], beside the model's three likeliest."""
    rng = np.random.default_rng(seed)
    n_regular, lines = meta["n_regular"], []
    model.eval()
    for ids in np.asarray(tokens[np.linspace(0, len(tokens) - 1, min(n, len(tokens))).astype(int)], dtype=np.int64):
        words = [i for i in range(8, len(ids) - 4) if ids[i] < n_regular and
                 re.fullmatch(r" [A-Za-z]{3,}", enc.decode([int(ids[i])]))]
        if not words:
            continue
        pos = words[rng.integers(len(words))]
        inputs = torch.tensor(ids, device=rt.device)[None]
        inputs[0, pos] = meta["special_ids"]["[MASK]"]
        with rt.autocast():
            logits = model.logits(model.encode(inputs)[:, pos]).float()
        probs, top = logits[0, :n_regular].softmax(-1).topk(3)
        context = f"{enc.decode(ids[max(0, pos - 16):pos].tolist())} ____{enc.decode(ids[pos + 1:pos + 6].tolist())}"
        guesses = ", ".join(f"{enc.decode([t])!r} {p:.2f}" for t, p in zip(top.tolist(), probs.tolist()))
        lines.append(f"fill in: ...{' '.join(context.split())}... -> {guesses} (true: {enc.decode([int(ids[pos])])!r})")
    model.train()
    return lines


@functools.lru_cache(maxsize=2)
def epoch_order(n_rows, seed, epoch, order="shuffled"):
    """The rows epoch `epoch` visits, in an order shuffled by (seed, epoch). With order='file' the first epoch keeps
    the file's order (tools/curriculum.py writes files meant to be read so)."""
    return np.arange(n_rows) if order == "file" and epoch == 0 else np.random.default_rng((seed, epoch)).permutation(n_rows)


def rows_at(start, count, n_rows, seed, order="shuffled"):
    """The rows of the run's sequences number `start` to start + count - 1. The run's sequence i is row
    epoch_order(i // n_rows)[i % n_rows]: every epoch reads every row once, in its own order. The answer depends on
    the position alone, so a resumed run reads on from the sequences consumed (the checkpoint's tokens / seq_len)."""
    parts = []
    while count > 0:
        epoch, offset = divmod(start, n_rows)
        take = min(count, n_rows - offset)
        parts.append(epoch_order(n_rows, seed, epoch, order)[offset:offset + take])
        start, count = start + take, count - take
    return np.concatenate(parts)


def mask_keys(seed, numbers):
    """The keys model.mask_tokens draws rows' masks from, as an int64 tensor: each row's number (its place in the run,
    or a validation row's index) xor a 62-bit salt drawn from `seed`. Distinct numbers get distinct keys, and another
    seed other keys."""
    return torch.from_numpy(np.asarray(numbers, dtype=np.int64) ^ int(np.random.default_rng(seed).integers(2 ** 62)))


class Batches:
    """The training batches of one process (`rank` of `world`). Each micro-batch's rows depend only on its place in the run, so a resumed run, or
    one on more processes, reads exactly the rows the same place would have had. Each row's mask depends only on the
    run's seed and the row's place in the run, so the masks come back too. A row is masked the same way at any
    micro-batch, on any number of processes and on any kind of device. (Validation masks its rows so too, by index.)"""

    def __init__(self, tokens, meta, rank, world, device, seed, order="shuffled"):
        self.tokens, self.rank, self.world, self.device, self.seed, self.order = tokens, rank, world, device, seed, order
        self.mask_id, self.n_regular = meta["special_ids"]["[MASK]"], meta["n_regular"]

    def step(self, consumed, sizes, masking):
        """This process's masked micro-batches of one step, as a list of (inputs, positions, labels).
        `consumed` is how many sequences the run has trained on before this step, and `sizes` the sizes of this
        process's micro-batches (train.micro_batch_sizes; every process cuts the step alike). The step's sequences are
        the next ones of the data order (rows_at). Each micro-batch is spread over the processes: rank r reads the
        r-th slice of it. Each row is masked by model.mask_tokens with its own key (mask_keys), made of the run's seed
        and the row's place in the run, so a row's mask does not depend on how the step is cut."""
        starts = consumed + self.world * np.cumsum([0, *sizes[:-1]])  # each micro-batch's first sequence on rank 0
        return [self.micro_batch(int(start) + self.rank * size, size, masking) for start, size in zip(starts, sizes)]

    def micro_batch(self, start, size, masking):
        """The `size` sequences from place `start` of the run, read and masked."""
        rows = rows_at(start, size, len(self.tokens), self.seed, self.order)
        places = start + np.argsort(rows, kind="stable")  # each row's place in the run, in get_batch's (sorted) order
        keys = to_device(mask_keys(self.seed, places), self.device)
        return mask_tokens(get_batch(self.tokens, rows, self.device), masking, self.mask_id, self.n_regular, keys=keys)


def load_run_data(path):
    """(meta.json with each split's digest, the train and val tokens, the tokenizer's text), each checked, or a line on how
    to prepare; a digest hashes the count and 4,096 rows first, last and spread between (a resume compares them)."""
    if not os.path.isfile(os.path.join(path, "meta.json")):
        how = "python prepare.py config/prepare_fineweb.py" if path.rstrip("/") == "data/fineweb-edu" else \
            f"python prepare.py --out_dir={path} --dataset=..."
        raise unfound(os.path.join(path, "meta.json"), f"error: {path} is not prepared (no meta.json): run `{how}` "
                      f"first, or for a few minutes on the embedded corpus `python prepare.py && python train.py "
                      f"config/train_quickstart.py`")
    meta = load_meta(path)
    tokenizer_text = read_tokenizer(path, meta)[0]
    train, val = load_tokens(path, "train", meta), load_tokens(path, "val", meta)
    digests = {split: hashlib.blake2b(b"%d:" % len(t) + t[:4096].tobytes() + t[np.linspace(0, len(t) - 1, 4096).astype(int)]
                                      .tobytes() + t[-4096:].tobytes(), digest_size=8).hexdigest()
               for split, t in (("train", train), ("val", val))}
    return dict(meta, digests=digests), train, val, tokenizer_text


def random_tokens(vocab_size, seq_len, seed=0, rows=4096):
    """`rows` sequences of random regular tokens (no special ones), for a step whose values do not matter."""
    tokens = np.random.default_rng(seed).integers(0, vocab_size - len(SPECIAL_TOKENS), (rows, seq_len))
    return tokens.astype(token_dtype(vocab_size))


def benchmark_tokens(data_dir, vocab_size, seq_len, seed):
    """(tokens, where from): data_dir's prepared sequences when they match the shape, else random regular tokens."""
    with contextlib.suppress(SystemExit):  # no usable data there
        meta = load_meta(data_dir)
        if meta["vocab_size"] == vocab_size and meta["seq_len"] == seq_len:
            return load_tokens(data_dir, "train", meta), data_dir
    return random_tokens(vocab_size, seq_len, seed), "random tokens"


def token_dtype(vocab_size):
    """The integer type token files hold for a vocabulary: two bytes a token where the ids fit."""
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


class RandomBatches:
    """batches(n): n masked micro-batches of random rows, as model.Trainer.step takes them."""

    def __init__(self, tokens, vocab, micro, rt, mask_rate, seed=0):
        self.tokens, self.vocab, self.micro, self.device, self.mask_rate = tokens, vocab, micro, rt.device, mask_rate
        self.rng = np.random.default_rng(seed)

    def __call__(self, n):
        n_regular = self.vocab - len(SPECIAL_TOKENS)
        return [mask_tokens(get_batch(self.tokens, self.rng.integers(0, len(self.tokens), self.micro), self.device),
                            self.mask_rate, special_ids(n_regular)["[MASK]"], n_regular) for _ in range(n)]


def bytes_to_unicode():
    """The byte-level BPE alphabet: each byte one visible character (printable ones themselves, the rest past 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))  # the others, in order
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


VALIDATION_SEED = 1234  # validation's masks come from this seed and each row's index, never from the run's seed


def validation_batch(tokens, rows, mask_rate, meta):
    """The validation rows `rows`, masked, as (inputs, positions, labels) on the CPU. Each row's mask is drawn from its
    own key, made of VALIDATION_SEED and the row's index alone (mask_keys). So a row is masked the same way in every
    evaluation, whatever the micro-batch, the device, the number of processes or the number of rows evaluated."""
    rows = np.asarray(rows, dtype=np.int64)
    idx = torch.from_numpy(np.asarray(tokens[rows], dtype=np.int64))  # (B, T)
    return mask_tokens(idx, mask_rate, meta["special_ids"]["[MASK]"], meta["n_regular"], keys=mask_keys(VALIDATION_SEED, rows))


class Validation:
    """The validation rows and what scoring them needs: the model, the data's meta.json, how many rows go through the
    model at a time (`batch`) and the runtime (device and precision)."""

    def __init__(self, model, tokens, meta, batch, rt):
        self.model, self.tokens, self.meta, self.batch, self.rt = model, tokens, meta, batch, rt

    @torch.no_grad()
    def score(self, n_sequences, mask_rate):
        """The validation loss and masked-token accuracy over the first n_sequences rows. Every row keeps its own fixed
        mask (validation_batch), so the result does not depend on the batch or the device. The model is in eval mode
        meanwhile (no dropout; forward counts its correct predictions) and back in training mode after."""
        n = min(n_sequences, len(self.tokens))
        loss_sum, correct, predicted = 0.0, 0, 0
        self.model.eval()
        try:
            for start in range(0, n, self.batch):
                masked = validation_batch(self.tokens, range(start, min(n, start + self.batch)), mask_rate, self.meta)
                inputs, positions, labels = (to_device(t, self.rt.device) for t in masked)
                with self.rt.autocast():
                    loss, hits = self.model(inputs, positions, labels)
                loss_sum += loss.item() * labels.numel()  # the batch's mean loss, weighted by its masked tokens
                correct += hits.item()
                predicted += labels.numel()
        finally:
            self.model.train()
        return loss_sum / predicted, correct / predicted
