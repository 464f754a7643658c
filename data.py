"""Reading what prepare.py wrote: metadata, the tokenizer, token files; the training data's
order (rows_at: a pure function of the position in the run) and its masked micro-batches
(Batches, fixed-count MLM masking); fill-in examples; the runs' metrics.jsonl; and the file
writes every script uses: atomic writes, checkpoints.

Kept free of `datasets` so that training, benchmarking and fine-tuning run on machines
that only have torch, numpy and tiktoken.
"""
import base64
import errno
import functools
import json
import os
import pickle
import re
import shutil
import socket

import numpy as np
import torch

from model import saved_model_args

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
# GPT-2's pre-tokenisation regex; the `tokenizers` ByteLevel pre-tokeniser uses the same one,
# so a BPE trained there gives identical ids through tiktoken.
SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TOKENIZER_FILE = "tokenizer.tiktoken"
META_KEYS = ("vocab_size", "n_regular", "special_ids", "seq_len", "dtype", "tokenizer_file", "train_sequences",
             "val_sequences")  # what readers of meta.json rely on


def hub_reachable(timeout=3.0):
    """Whether the Hugging Face hub answers; False at once when the offline switches are set."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def cannot_write(path, e):
    """The one-line error for an OSError while writing `path`."""
    full = "the disk is full: free space and run the same command again; " if e.errno == errno.ENOSPC else ""
    return SystemExit(f"error: cannot write {path}: {e.strerror or e} ({full}what was written before is intact)")


def write_atomically(path, write):
    """write(tmp) writes the file at a temporary path; it replaces `path` only once complete and on
    the disk (fsync before the rename, and of the folder after it), so a crash or a power cut leaves
    the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise cannot_write(path, e)
    finally:  # a failed or interrupted write leaves nothing behind
        if os.path.exists(tmp):
            os.remove(tmp)
    try:  # the rename itself on the disk (POSIX; elsewhere a folder cannot be opened, and need not be)
        folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        os.fsync(folder)
        os.close(folder)
    except OSError:
        pass


LOCK_FILE = ".lock"
HELD = {}  # the folders this process has claimed, and their lock files: held until it ends


def check_writable(path, setting):
    """A one-line error unless a file can be written at `path`: checked before the work, not after."""
    folder = os.path.dirname(os.path.abspath(path))
    for where, kind in ((path, "a folder, not a file"), (folder, "a file, not a folder")):
        if os.path.exists(where) and os.path.isdir(where) == (where == path):
            raise SystemExit(f"error: {setting}: {where} is {kind}")
    try:
        os.makedirs(folder, exist_ok=True)
        open(path + ".tmp", "w").close()
        os.remove(path + ".tmp")
    except OSError as e:
        raise SystemExit(f"error: cannot write to {setting}={path}: {e.strerror or e}")


def claim_folder(path, setting="--out_dir", need_bytes=0):
    """Create the folder `path` if needed and lock it for this process, before any work: a one-line
    error when it cannot be written, has less than need_bytes free, or another process holds it.
    The lock is the kernel's (flock), released when the process ends however it ends, so a crash
    never leaves it behind."""
    check_writable(os.path.join(path, LOCK_FILE), setting)
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise SystemExit(f"error: {setting}={path} has {free / 1e9:.1f} GB free and this run needs about "
                         f"{need_bytes / 1e9:.1f} GB there: free space or choose another {setting}")
    if os.path.realpath(path) in HELD:
        return
    lock = open(os.path.join(path, LOCK_FILE), "a+")
    try:
        import fcntl
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no flock (Windows): no lock
        pass
    except OSError:
        lock.seek(0)
        raise SystemExit(f"error: {path} is in use by another process (pid {lock.read().strip() or '?'}): wait for "
                         f"it to end, or choose another {setting}")
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    HELD[os.path.realpath(path)] = lock


def write_json(path, obj):
    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
    write_atomically(path, dump)


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found: run `python prepare.py` first (or pass --data_dir=)")
    try:
        with open(path) as f:
            meta = json.load(f)
        missing = [k for k in META_KEYS if k not in meta]
    except (OSError, ValueError, TypeError) as e:
        raise SystemExit(f"error: cannot read {path}: {e}")
    if missing:
        raise SystemExit(f"error: {path} is damaged (no {', '.join(missing)}): delete {data_dir} and run prepare.py again")
    return meta


def write_ranks(path, ranks):
    """Save BPE ranks in tiktoken's text format: base64(token bytes) rank, one per line."""
    with open(path, "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")


def parse_ranks(text):
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in text.splitlines() if line.strip())}


def read_ranks(path):
    with open(path) as f:
        return parse_ranks(f.read())


def make_encoding(ranks, special_ids, name="cram"):
    import tiktoken
    return tiktoken.Encoding(name=name, pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special_ids)


def load_tokenizer(data_dir, meta=None):
    """The corpus' own tokenizer as a tiktoken.Encoding (use encode_ordinary for raw text)."""
    meta = meta or load_meta(data_dir)
    path = os.path.join(data_dir, meta["tokenizer_file"])
    if not os.path.isfile(path):
        raise SystemExit(f"error: tokenizer file {path} not found")
    return make_encoding(read_ranks(path), meta["special_ids"])


def load_tokens(data_dir, split, meta=None):
    """Memory-mapped (num_sequences, seq_len) array of token ids for 'train' or 'val'."""
    meta = meta or load_meta(data_dir)
    path = os.path.join(data_dir, f"{split}.bin")
    n = meta[f"{split}_sequences"]
    if not os.path.isfile(path) or os.path.getsize(path) != n * meta["seq_len"] * np.dtype(meta["dtype"]).itemsize:
        raise SystemExit(f"error: {path} is missing or does not match meta.json: the folder is damaged; delete it "
                         f"and run prepare.py again")
    return np.memmap(path, dtype=meta["dtype"], mode="r", shape=(n, meta["seq_len"]))


def get_batch(tokens, rows, device):
    """Sequences at the given row indices as an int64 tensor on device."""
    batch = torch.from_numpy(tokens[np.sort(rows)].astype(np.int64))
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch


def mask_tokens(idx, mask_rate, mask_id, n_regular, generator=None):
    """MLM corruption with a fixed count: exactly round(mask_rate * T) positions per row.

    Of the chosen positions 80% become [MASK], 10% a random regular token, 10% stay.
    A static count keeps tensor shapes fixed for torch.compile. Runs on idx's device.
    Returns (inputs, positions (B, k), labels (B, k)).
    """
    B, T = idx.shape
    k = max(1, round(mask_rate * T))
    scores = torch.rand(B, T, device=idx.device, generator=generator)
    positions = scores.topk(k, dim=1).indices
    labels = idx.gather(1, positions)
    rule = torch.rand(B, k, device=idx.device, generator=generator)
    random_tokens = torch.randint(0, n_regular, (B, k), device=idx.device, generator=generator)
    replacement = torch.where(rule < 0.8, torch.full_like(labels, mask_id),
                              torch.where(rule < 0.9, random_tokens, labels))
    inputs = idx.scatter(1, positions, replacement)
    return inputs, positions, labels


def save_checkpoint(path, state):
    write_atomically(path, lambda tmp: torch.save(state, tmp))  # a crash never leaves half a checkpoint


def load_checkpoint(path):
    """A checkpoint written by train.py, or a one-line error."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: checkpoint not found: {path}")
    try:
        # weights_only: tensors and plain containers only, so a file can never run code on loading
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        culprit = re.search(r"GLOBAL (\S+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
        if culprit:  # a pickle that names a function or class to call
            raise SystemExit(f"error: {path} was refused: it holds objects other than tensors and plain values "
                             f"({culprit.group(1)}), and loading those could run code")
        raise SystemExit(f"error: {path} is not a readable checkpoint ({type(e).__name__}: {str(e)[:200]})")
    if not isinstance(checkpoint, dict) or not {"model", "model_args", "meta", "tokenizer"} <= checkpoint.keys():
        raise SystemExit(f"error: {path} is not a checkpoint written by train.py")
    return checkpoint


def all_finite(state_dict):
    """Whether every floating-point tensor of a state dict is finite (no checkpoint holds one that is not)."""
    return all(v.isfinite().all() for v in state_dict.values() if v.is_floating_point())


def resume_checkpoint(path, resume, model_args, tokenizer_text, optim, data_dir):
    """The checkpoint train.py resumes (with resume=True), after checking it continues the same run:
    the same model, tokenizer and optimizer (the settings of those names), and finite weights. None
    for a fresh run, which refuses to overwrite one. The autocast dtype may change (a run moved to
    another GPU)."""
    if not resume:
        if os.path.exists(path):
            raise SystemExit(f"error: {path} exists: pass --resume=True to continue it, or choose another --out_dir")
        return None
    checkpoint = load_checkpoint(path)
    saved = saved_model_args(checkpoint["model_args"])
    if saved != model_args:
        changed = [k for k in model_args if saved[k] != model_args[k]]
        raise SystemExit(f"error: the checkpoint's model differs from this config in {', '.join(changed)}")
    if checkpoint["tokenizer"] != tokenizer_text:
        raise SystemExit(f"error: {path} trained with another tokenizer than {data_dir}'s: resume it with its own "
                         f"data, --data_dir={checkpoint.get('data_dir')}")
    trained_with = checkpoint.get("config", {}).get("optim", "adamw")
    if trained_with != optim:
        raise SystemExit(f"error: {path} trained with --optim={trained_with}: resume it with that optimizer (their "
                         f"states do not convert)")
    if not all_finite(checkpoint["model"]):
        raise SystemExit(f"error: {path} holds non-finite weights and cannot be resumed")
    return checkpoint


def repeat_warning(expected, train_tokens, basis):
    """A one-line warning when the run will train on more tokens than the data holds, else None;
    basis says where the expected count comes from."""
    if expected > train_tokens:
        return (f"warning: {basis} the run will train about {expected / 1e9:.2f}B tokens, {expected / train_tokens:.1f} "
                f"epochs of the {train_tokens / 1e9:.2f}B training tokens: repeated data overfits; prepare a larger "
                f"corpus (see the README)")
    return None


@torch.no_grad()
def fill_in(model, tokens, meta, enc, rt, n, seed):
    """n fill-in-the-blank lines: one word of each of n validation sequences spread over the split
    replaced by [MASK], beside the model's three likeliest tokens for it."""
    rng = np.random.default_rng(seed)
    n_regular, lines = meta["n_regular"], []
    model.eval()
    for ids in np.asarray(tokens[np.linspace(0, len(tokens) - 1, n).astype(int)], dtype=np.int64):
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


def append_metrics(path, fields):
    """One line of a run's metrics.jsonl (train.py's log and evaluation lines; read_metrics reads them)."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")
    except OSError as e:
        raise cannot_write(path, e)


def read_metrics(run):
    """The evaluations of one run, in order, one per step (for a step logged twice, the later line:
    a run resumed after a hard kill redoes the steps since its last checkpoint)."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found: is {run} the out_dir of a train.py run?")
    evals = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                raise SystemExit(f"error: {path}:{number} is not a JSON line")
            if record.get("kind") == "eval":
                evals[record["step"]] = record
    if not evals:
        raise SystemExit(f"error: {path} has no evaluation yet")
    return [evals[step] for step in sorted(evals)]


@functools.lru_cache(maxsize=2)
def epoch_order(n_rows, seed, epoch, order="shuffled"):
    """The permutation of the training rows that epoch `epoch` visits. order='file': the first
    epoch reads the file's own order (tools/curriculum.py's); repeats are shuffled."""
    if order == "file" and epoch == 0:
        return np.arange(n_rows)
    return np.random.default_rng((seed, epoch)).permutation(n_rows)


def rows_at(start, count, n_rows, seed, order="shuffled"):
    """Rows of the run's sequences start .. start + count - 1, where sequence i is row
    epoch_order(i // n_rows)[i % n_rows]: every epoch visits each row once, and a resumed run
    continues from the number of sequences consumed (the checkpoint's tokens / seq_len)."""
    parts = []
    while count > 0:
        epoch, offset = divmod(start, n_rows)
        take = min(count, n_rows - offset)
        parts.append(epoch_order(n_rows, seed, epoch, order)[offset:offset + take])
        start, count = start + take, count - take
    return np.concatenate(parts)


class Batches:
    """The masked micro-batches of one process. at(consumed, micro_step, mask_rate) is micro-batch
    `micro_step` of this rank in the global batch that starts after `consumed` sequences: ranks
    take disjoint slices, and rows and masks depend only on the place in the run's sequence
    order, so a resumed run or another rank count sees the same."""

    def __init__(self, tokens, meta, micro, rank, world, device, seed, order="shuffled"):
        self.tokens, self.micro, self.rank, self.world, self.device = tokens, micro, rank, world, device
        self.seed, self.order = seed, order
        self.mask_id, self.n_regular = meta["special_ids"]["[MASK]"], meta["n_regular"]
        self.generator = torch.Generator(device=device)

    def at(self, consumed, micro_step, mask_rate=0.25):
        start = consumed + (micro_step * self.world + self.rank) * self.micro
        idx = get_batch(self.tokens, rows_at(start, self.micro, len(self.tokens), self.seed, self.order), self.device)
        self.generator.manual_seed(int(np.random.default_rng((self.seed, start)).integers(2 ** 62)))
        return mask_tokens(idx, mask_rate, self.mask_id, self.n_regular, self.generator)


def load_run_data(path):
    """meta.json, the train and val tokens and the tokenizer's text (checkpoints carry it, so
    fine-tuning needs nothing else); a one-line error names the command that prepares `path`."""
    if not os.path.isfile(os.path.join(path, "meta.json")):
        how = "python prepare.py config/prepare_fineweb.py" if path.rstrip("/") == "data/fineweb-edu" else \
            f"python prepare.py --out_dir={path} --dataset=..."
        raise SystemExit(f"error: {path} is not prepared (no meta.json): run `{how}` first, or for a few minutes on "
                         f"the embedded corpus `python prepare.py && python train.py config/train_quickstart.py`")
    meta = load_meta(path)
    with open(os.path.join(path, meta["tokenizer_file"])) as f:
        tokenizer_text = f.read()
    return meta, load_tokens(path, "train", meta), load_tokens(path, "val", meta), tokenizer_text


def benchmark_tokens(data_dir, vocab_size, seq_len, seed):
    """(tokens, where from): data_dir's prepared sequences when they match the shape, else random
    regular tokens."""
    try:
        meta = load_meta(data_dir)
        if meta["vocab_size"] == vocab_size and meta["seq_len"] == seq_len:
            return load_tokens(data_dir, "train", meta), data_dir
    except SystemExit:
        pass
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size - len(SPECIAL_TOKENS), (4096, seq_len)).astype(np.uint16), "random tokens"


class RandomBatches:
    """batch_at(micro_step): a masked micro-batch of random rows, as train.py's step takes it."""

    def __init__(self, tokens, vocab, micro, rt, mask_rate=0.25, seed=0):
        self.tokens, self.vocab, self.micro, self.device, self.mask_rate = tokens, vocab, micro, rt.device, mask_rate
        self.rng = np.random.default_rng(seed)

    def __call__(self, micro_step):
        idx = get_batch(self.tokens, self.rng.integers(0, len(self.tokens), self.micro), self.device)
        return mask_tokens(idx, self.mask_rate, self.vocab - 1, self.vocab - len(SPECIAL_TOKENS))


def bytes_to_unicode():
    """The byte-level BPE alphabet: printable characters stand for themselves, the other
    bytes are shifted past 255, so every byte is one visible unicode character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, shift = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shift)
            shift += 1
    return chars


@torch.no_grad()
def evaluate(model, tokens, meta, batch, rt, n_sequences, mask_rate=0.25):
    """Validation MLM loss and masked-token accuracy on the first n_sequences, with fixed masks
    (mask_rate of every row: train.py's eval_mask_rate, the same whatever the training recipe)."""
    model.eval()
    generator = torch.Generator(device=rt.device).manual_seed(1234)
    n = min(n_sequences, len(tokens))
    loss_sum, correct, predicted = 0.0, 0, 0
    for start in range(0, n, batch):
        idx = get_batch(tokens, np.arange(start, min(n, start + batch)), rt.device)
        inputs, positions, labels = mask_tokens(idx, mask_rate, meta["special_ids"]["[MASK]"],
                                                meta["n_regular"], generator)
        with rt.autocast():
            loss, hits = model(inputs, positions, labels)
        loss_sum += loss.item() * labels.numel()
        correct += hits.item()
        predicted += labels.numel()
    model.train()
    return loss_sum / predicted, correct / predicted
