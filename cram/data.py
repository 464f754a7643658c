"""The token files that prepare.py wrote and their tokenizer, read and checked; reading rows onto the device; random
batches for the benchmarks and the memory probe; the fill-in examples. Which rows a training step reads, and how
validation is scored, are in train.py. Training, benchmarks and fine-tuning need only torch, numpy and tiktoken here,
not `datasets`."""
import bz2
import collections
import contextlib
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
    """The sequences of the given rows, in the order given, as an int64 tensor (len(rows), seq_len) on device. The file
    is read in ascending row order (scattered rows, but never backwards), and the rows are put back in the order asked."""
    rows = np.asarray(rows)
    order = np.argsort(rows, kind="stable")
    batch = np.empty((len(rows), tokens.shape[1]), dtype=np.int64)
    batch[order] = tokens[rows[order]]
    return to_device(torch.from_numpy(batch), device)


def to_device(tensor, device):
    """On a GPU from pinned memory without waiting (a copy from pageable memory waits for the device's queue)."""
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tensor.to(device)


def repeat_warning(expected, train_tokens, basis):
    """A one-line warning, in the data's unit (B, M or k), where the run trains more tokens than it holds (`basis`)."""
    scale, unit = next(((s, u) for s, u in ((1e9, "B"), (1e6, "M")) if train_tokens >= s), (1e3, "k"))
    return (f"warning: {basis} the run will train about {expected / scale:.2f}{unit} tokens, {expected / train_tokens:.1f} "
            f"epochs of the {train_tokens / scale:.2f}{unit} training tokens: repeated tokens are worth less than new ones "
            f"(little past about 16 epochs); prepare a larger corpus (see the README)") if expected > train_tokens else None


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


# What a run trains on: meta.json (with each split's digest), the train and val tokens, and the tokenizer's text
RunData = collections.namedtuple("RunData", "meta train val tokenizer_text")


def load_run_data(path):
    """The RunData in folder `path`, each part checked, or a line on how to prepare it. A digest hashes the count and
    4,096 rows first, last and spread between (a resume compares them)."""
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
    return RunData(dict(meta, digests=digests), train, val, tokenizer_text)


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
