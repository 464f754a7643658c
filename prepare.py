"""Raw text -> a BPE tokenizer trained on that text -> fixed-length token files for MLM.

    python prepare.py                                   # embedded corpus, no download
    python prepare.py --dataset=path/to/books.txt.gz    # local .txt[.gz/.bz2/.xz], .jsonl/.json, .parquet, or a folder
    python prepare.py --dataset=HuggingFaceFW/fineweb-edu --hf_config=sample-10BT --vocab_size=32768

Writes to out_dir: tokenizer.tiktoken (tiktoken's BPE ranks), train.bin and val.bin (seq_len-token sequences of the
documents, each followed by [SEP]) and, last, meta.json, which marks the work done. Documents stream: memory does not grow."""
import ast
import functools
import hashlib
import io
import itertools
import json
import logging
import lzma
import os
import platform
import shlex
import sys
import sysconfig
import threading
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from configurator import config_keys, configure  # first: it checks for the temporary folder torch's import needs
from cram import process, runtime
from cram.data import OPENERS, SPECIAL_TOKENS, TOKENIZER_FILE, bytes_to_unicode, load_tokens, make_encoding, token_dtype
from cram.files import (cannot_write, claim_folder, load_json, read_json, read_ranks, special_ids, text_encoding, unfound,
                        write_json, write_ranks)

# -----------------------------------------------------------------------------
dataset = "pydocs"      # 'pydocs' (embedded), a local file or folder, or a Hugging Face hub dataset name
hf_config = ""          # hub dataset configuration, e.g. 'sample-10BT'
hf_split = "train"
text_field = "text"     # the text column of .jsonl/.json/.parquet files and hub datasets
out_dir = ""            # default: data/<dataset name>
vocab_size = 8192       # >= 260: including the 4 special tokens; the reference uses 32768
seq_len = 128           # >= 2
val_fraction = 0.01     # (0, 1): share of documents held out for validation
tokenizer_train_chars = 500_000_000  # >= 1: train the tokenizer on at most this much text (the start of the corpus)
max_tokens = 0          # >= 0: stop after this many train tokens (0: the whole corpus)
max_compression = 1.5   # >= 0: drop documents with more tokens per character than this times the corpus median (0: off)
min_doc_chars = 20      # >= 0: drop shorter documents (blank lines, stubs)
dedup = True            # drop documents whose normalised text (lower case, no whitespace) came before
workers = 0             # >= 0: threads encoding in parallel (tiktoken releases the GIL); 0: all cores
progress_minutes = 1.0  # >= 0: write a progress record this often: a killed run redoes at most this much
# -----------------------------------------------------------------------------

SPLITS = ("train", "val")
PROGRESS_FILE = "progress.json"
STALE = (PROGRESS_FILE, "train.bin.tmp", "val.bin.tmp", "dedup.bin")  # an unfinished encoding (dedup.bin: with dedup)
TOKENIZER_SETTINGS = ("dataset", "hf_config", "hf_split", "text_field", "vocab_size", "tokenizer_train_chars")  # its text, size
LOCAL_SUFFIXES = (".txt", ".txt.gz", ".txt.bz2", ".txt.xz", ".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
# The most text the tokenizer, its trainer and the de-duplication see at once (text_file_documents, pieces).
MAX_DOC_CHARS = 1_000_000
COMPRESSORS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}  # the command-line tools of OPENERS' compressions
PYDOCS_PACKAGES = ("numpy", "torch")  # the project cannot run without them, so they are always there


# ---------------------------------------------------------------- sources
def pydocs_documents():
    """The documentation that ships with Python: pydoc's topics, then each source file's docstrings (sorted) of the
    standard library, numpy and torch: the same text wherever their versions (meta.json's) are, no download."""
    from pydoc_data.topics import topics
    for key in sorted(topics):
        yield topics[key]
    skip = {"__pycache__", "site-packages", "test", "tests", "testing", "idlelib", "lib2to3", "turtledemo"}
    for root in [sysconfig.get_paths()["stdlib"], *(os.path.dirname(__import__(p).__file__) for p in PYDOCS_PACKAGES)]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
            for filename in sorted(f for f in filenames if f.endswith(".py")):
                try:
                    tree = ast.parse(Path(dirpath, filename).read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError, ValueError):
                    continue
                docstrings = [ast.get_docstring(node) for node in ast.walk(tree) if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
                text = "\n\n".join(d for d in docstrings if d)
                if text:
                    yield text


def local_files(path):
    if os.path.isdir(path):
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(LOCAL_SUFFIXES))
        if not files:
            raise SystemExit(f"error: no {'/'.join(LOCAL_SUFFIXES)} files in folder {path}")
    elif not path.endswith(LOCAL_SUFFIXES):
        raise SystemExit(f"error: {path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)})")
    else:
        files = [path]
    for file in files:
        check_json_encoding(file)
    return files


def check_json_encoding(path):
    """A one-line error for a .json or .jsonl file in UTF-16 (by its byte-order mark), which datasets' JSON reader
    cannot read, with the command that converts it to UTF-8 in place (through its compressor if it has one)."""
    suffix = os.path.splitext(path)[1]
    try:
        utf16 = ".json" in os.path.basename(path) and text_encoding(path, OPENERS.get(suffix, open)) == "utf-16"
    except (OSError, EOFError, zlib.error, lzma.LZMAError):  # unreadable: its reader says so
        return
    if utf16:
        tool, quoted = COMPRESSORS.get(suffix), shlex.quote(path)
        convert = f"{tool} -dc {quoted} | iconv -f utf-16 -t utf-8 | {tool}" if tool else f"iconv -f utf-16 -t utf-8 {quoted}"
        raise SystemExit(f"error: {path} is UTF-16 text (its byte-order mark says so), and the JSON reader takes UTF-8 "
                         f"alone: convert it in place with {convert} > {quoted}.new && mv {quoted}.new {quoted}")


def text_file_documents(path, max_chars=MAX_DOC_CHARS):
    """A .txt file holds documents separated by blank lines; lines inside one are kept. A document
    reaching max_chars ends at the line before (a longer line is read in max_chars pieces), so no
    layout makes one huge document: memory stays flat, and held-out documents stay spread."""
    opener = OPENERS.get(os.path.splitext(path)[1], open)
    try:  # in the encoding its byte-order mark names, the mark dropped (Notepad's: not a character of the text)
        with opener(path, "rt", encoding=text_encoding(path, opener), errors="replace") as f:
            lines, chars = [], 0  # the file's lines, then a blank one that ends its last document
            for line in itertools.chain(iter(functools.partial(f.readline, max_chars), ""), ["\n"]):
                if line.strip() and chars + len(line) <= max_chars:
                    lines.append(line)
                    chars += len(line)
                    continue
                if lines:
                    yield "".join(lines).strip()
                lines, chars = ([line], len(line)) if line.strip() else ([], 0)
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:  # unreadable, truncated or damaged (compressed) files
        raise SystemExit(f"error: cannot read {path}: {e}")


def pieces(text, max_chars=MAX_DOC_CHARS):
    """text in pieces of at most max_chars, cut after a line end where there is one: what the encoder takes at once."""
    while len(text) > max_chars:
        cut = text.rfind("\n", 0, max_chars) + 1 or max_chars
        yield text[:cut]
        text = text[cut:]
    yield text


class RowStream:
    """The documents of a `datasets` streaming dataset: a hub dataset, or one .jsonl/.json/.parquet file. An interrupted
    preparation resumes it without reading again what was done (for a hub dataset, downloading it again): state() is
    datasets' state_dict() after the last document yielded, and calling with that state continues from there."""

    def __init__(self, where, text_field, *args, **kwargs):
        import datasets
        # its JSON loader logs a bad record by its row in a chunk of the file, beside bad_line's true line: not shown
        logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
        self.load = functools.partial(datasets.load_dataset, *args, streaming=True, **kwargs)
        self.where, self.text_field, self.rows = where, text_field, None

    def __call__(self, state=None):
        try:
            self.rows = self.load()
            if state:
                self.rows.load_state_dict(state)
            for i, row in enumerate(self.rows):
                problem = self.text_problem(row, self.text_field, not (i or state))
                if problem:  # said below, by the file's line where it has one
                    raise ValueError(problem)
                yield row[self.text_field] or ""  # null: an empty document (skipped)
        except Exception as e:  # datasets raises many types; the user needs one line, by the file's line where it has one
            raise SystemExit(f"error: {self.bad_line() or f'cannot read {self.where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}'}")

    def state(self):
        return self.rows.state_dict()

    @staticmethod
    def text_problem(row, field, first):
        """Why a record's `field` is not a document's text, or None (null, missing: an empty document; missing on the `first`
        record: the wrong --text_field), never a silent str(); the fix: another text column on the first, else the record."""
        texts = [k for k, v in row.items() if isinstance(v, str)] * first
        if field not in row or row[field] is None or isinstance(row[field], str):
            return f"no '{field}' field (fields: {', '.join(row)}); set --text_field=" if first and field not in row else None
        return f"field '{field}' holds {type(row[field]).__name__}, not text; " + (
            f"set --text_field= to its column of text ({', '.join(texts)})" if texts else "make it text (in JSON a string), or leave the record out")

    def bad_line(self):
        """'<file>:<line>: what is wrong' of a JSON-lines file's first bad record (the loader counts rows, not lines), or None."""
        try:
            with OPENERS.get(os.path.splitext(self.where)[1], open)(self.where, "rb") if ".jsonl" in os.path.basename(self.where) else io.BytesIO() as f:
                for n, line in enumerate(f, 1):
                    row = json.loads(line) if line.strip() else {self.text_field: None}
                    problem = self.text_problem(row, self.text_field, n == 1) if isinstance(row, dict) else "not a JSON object: mend or remove it"
                    if problem:
                        return f"{self.where}:{n}: {problem}"
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the parser's depth
            return f"{self.where}:{n} is not a JSON line: mend or remove it"
        except (OSError, EOFError, zlib.error, lzma.LZMAError):
            return None


def record_file(path, text_field="text"):
    """Rows of a .jsonl/.json/.parquet file, read (streaming, offline) by `datasets`."""
    return RowStream(path, text_field, "parquet" if path.endswith(".parquet") else "json", data_files=path, split="train")


def document_source(name, hf_config="", hf_split="train", text_field="text"):
    """(description, function returning a fresh document iterator) for --dataset; the other
    arguments are the settings of the same names (defaults: theirs)."""
    if name == "pydocs":
        versions = ", ".join(f"{pkg} {__import__(pkg).__version__}" for pkg in PYDOCS_PACKAGES)
        return f"pydocs (Python {platform.python_version()}, {versions})", pydocs_documents
    if os.path.exists(name):
        files = local_files(name)
        others = sorted({os.path.join(d, f) for d, _, fs in os.walk(name) for f in fs if f[0] != "."} - set(files))
        if others:  # a folder is never read in part silently
            print(f"reading {len(files)} files of {name}, not {len(others)} of other types: "
                  f"{', '.join(os.path.relpath(f, name) for f in others[:5])}{' ...' * (len(others) > 5)}")
        if len(files) == 1 and ".txt" not in os.path.basename(files[0]):
            return os.path.abspath(name), record_file(files[0], text_field)
        return os.path.abspath(name), lambda: itertools.chain.from_iterable(  # each file's documents in turn
            text_file_documents(p) if ".txt" in os.path.basename(p) else record_file(p, text_field)() for p in files)
    if name.endswith(LOCAL_SUFFIXES) or name.startswith((".", "/")) or name.count("/") > 1:
        raise unfound(name, f"error: file or folder not found: {name}")
    if not process.hub_reachable():
        raise SystemExit(f"error: '{name}' is not a local path and the Hugging Face hub cannot be reached; "
                         f"offline, use --dataset=pydocs (embedded) or a local .txt/.jsonl/.json/.parquet file or folder")
    return f"hub:{name}" + (f":{hf_config}" if hf_config else ""), RowStream(f"hub dataset {name}", text_field, name,
                                                                            hf_config or None, split=hf_split)


# ---------------------------------------------------------------- tokenizer
def train_bpe(texts, size):
    """A byte-level BPE of `size` tokens trained with `tokenizers` on an iterable of strings."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=sys.stderr.isatty(),  # its bars need a terminal
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer=trainer)
    return bpe


def bpe_ranks(bpe):
    """tiktoken ranks of a trained BPE: its ids (alphabet, then merges), which tiktoken's merging reproduces."""
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in bpe.get_vocab().items()}
    assert sorted(ranks.values()) == list(range(len(ranks))), "BPE ids are not contiguous"
    return ranks


def first_characters(documents, n_chars, digest):
    """The corpus' first documents until n_chars characters, each into `digest` (what the tokenizer trained on)."""
    chars = 0
    for doc in documents():
        digest.update(doc.encode() + b"\0")
        yield from pieces(doc)
        chars += len(doc)
        if chars >= n_chars:
            return


def load_or_train_tokenizer(documents, path, vocab_size, train_chars, local):
    """The BPE ranks an earlier run saved here if trained on the text this corpus starts with (a hub dataset's: not read
    twice), else a new BPE of the corpus' first train_chars characters, saved in tiktoken's format with that text's
    digest beside it (the special tokens take the ids after the BPE's)."""
    if os.path.exists(path) and os.path.exists(path + ".source"):
        record = load_json(path + ".source")[0]  # a damaged one (None, or of another shape) proves nothing: train again
        trained_on = record.get("digest") if isinstance(record, dict) else None
        if trained_on and local:  # the text it would train on now, read through: its digest is the point
            deque(first_characters(documents, train_chars, digest := hashlib.blake2b(digest_size=16)), maxlen=0)
        if trained_on and (not local or trained_on == digest.hexdigest()):
            print(f"reusing {path}")
            return read_ranks(path)
        print(f"note: {path} was trained on other text (or its record is damaged): training it again")
    print(f"training a {vocab_size}-token BPE on the corpus' first {train_chars:,} characters (all of it if shorter)")
    digest = hashlib.blake2b(digest_size=16)
    ranks = bpe_ranks(train_bpe(first_characters(documents, train_chars, digest), vocab_size - len(SPECIAL_TOKENS)))
    write_json(path + ".source", dict(digest=digest.hexdigest()))  # first: a tokenizer without one is not reused
    write_ranks(path, ranks)
    return ranks


# ---------------------------------------------------------------- token files
class SequenceWriter:
    """Token streams appended to a .tmp file in whole seq_len sequences, renamed by finish(); state() makes them durable
    and describes them, and a writer built from it continues the file, dropping what came after."""

    def __init__(self, path, dtype, seq_len, state=None):
        state = state or dict(bytes=0, pending=[], sequences=0)
        self.path, self.dtype, self.seq_len = path, dtype, seq_len
        self.file = open(path + ".tmp", "r+b" if state["bytes"] else "wb")
        self.file.truncate(state["bytes"])
        self.file.seek(state["bytes"])
        self.pending, self.sequences = np.asarray(state["pending"], dtype=dtype), state["sequences"]

    def add(self, *tokens):
        self.pending = np.concatenate([self.pending, *tokens], dtype=self.dtype)
        n = len(self.pending) // self.seq_len
        if n:
            try:
                self.file.write(self.pending[:n * self.seq_len].tobytes())
            except OSError as e:  # a full disk: the progress record says what is whole
                raise cannot_write(self.path + ".tmp", e)
            self.pending = self.pending[n * self.seq_len:]
            self.sequences += n

    def state(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        return dict(bytes=self.file.tell(), pending=self.pending.tolist(), sequences=self.sequences)

    def finish(self):  # the last partial sequence is dropped; the rest on the disk (state's fsync) before the rename
        self.state()
        self.file.close()
        os.replace(self.path + ".tmp", self.path)


class SeenTexts:
    """Exact de-duplication in 8 bytes a document: 64-bit hashes of the text (lower case, no whitespace) in a sorted
    array (the newest in a set merged in every million) and an append-only file, which a resumed preparation reads."""

    def __init__(self, path, size=0):
        self.file = open(path, "r+b" if size else "wb")
        self.file.truncate(size)
        self.file.seek(size)
        self.sorted = np.unique(np.fromfile(path, dtype="<u8", count=size // 8))
        self.recent, self.unwritten = set(), []

    @staticmethod
    def key(text):
        # lower case, whitespace deleted (bytes.translate: faster than split and join)
        digest = hashlib.blake2b(text.lower().encode().translate(None, b" \t\n\r\x0b\x0c"), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def add(self, key):
        """False when the text of this key was seen before, else remember it and return True."""
        i = np.searchsorted(self.sorted, np.uint64(key))
        if key in self.recent or (i < len(self.sorted) and int(self.sorted[i]) == key):
            return False
        self.recent.add(key)
        self.unwritten.append(key)
        if len(self.recent) >= 1_000_000:
            self.sorted = np.union1d(self.sorted, np.fromiter(self.recent, dtype=np.uint64))
            self.recent = set()
        return True

    def state(self):
        self.file.write(np.asarray(self.unwritten, dtype="<u8").tobytes())
        self.unwritten = []
        self.file.flush()
        os.fsync(self.file.fileno())
        return self.file.tell()

    def close(self):
        self.file.close()
        os.remove(self.file.name)


def read_progress(out_dir, dedup, seq_len, itemsize):
    """An interrupted preparation's last progress record, or None to start over (none, its files gone, or damaged)."""
    if not all(os.path.exists(os.path.join(out_dir, name)) for name in (STALE if dedup else STALE[:-1])):
        return None
    path = os.path.join(out_dir, PROGRESS_FILE)
    try:
        progress = json.loads(Path(path).read_text(encoding="utf-8"))
        problem = progress_problem(progress, out_dir, dedup, seq_len, itemsize)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        problem = f"{type(e).__name__}: {str(e)[:120]}"
    if problem:
        print(f"warning: {path} is damaged ({problem}): the encoding starts over (the tokenizer is kept)")
        return None
    return progress


def progress_problem(progress, out_dir, dedup, seq_len, itemsize):
    """What in a progress record disagrees with the files it describes, or None."""
    if type(progress["read"]) is not int or progress["read"] < 0:
        return "documents read"
    for split in SPLITS:
        writer, size = progress["writers"][split], os.path.getsize(os.path.join(out_dir, f"{split}.bin.tmp"))
        pending, tokens = writer["pending"], writer["sequences"] * seq_len + len(writer["pending"])
        if not writer["bytes"] == writer["sequences"] * seq_len * itemsize <= size or len(pending) >= seq_len or \
                not all(type(t) is int for t in pending) or progress["stats"][f"{split}_tokens"] != tokens:
            return f"{split} counts"
    dedup_bytes = progress["dedup_bytes"]
    if dedup and not (type(dedup_bytes) is int and 0 <= dedup_bytes <= os.path.getsize(os.path.join(
            out_dir, "dedup.bin")) and dedup_bytes % 8 == 0):
        return "dedup counts"
    return None


def median_tokens_per_char(documents, enc, min_doc_chars, n=1000, max_chars=5_000_000):
    """Tokens per character of the corpus' typical document (min_doc_chars or more): the median over its first n
    documents or max_chars characters (the same on a resume; bounded: whole books are not read twice)."""
    texts, chars = [], 0
    for text in documents():
        if text and len(text) >= min_doc_chars:  # (an empty record: nothing to measure)
            texts.append(next(pieces(text)))
            chars += len(text)
        if len(texts) == n or chars >= max_chars:
            break
    return float(np.median([len(ids) / len(t) for t, ids in zip(texts, enc.encode_ordinary_batch(texts))]))


# ---------------------------------------------------------------- the encoding pass
class TokenFiles:
    """What the encoding pass wrote and counted: the token files, meta.json's counts, the de-duplication memory and
    `read`, the documents consumed; built from a progress record, it continues there."""

    def __init__(self, out_dir, dtype, seq_len, sep_id, max_tokens_per_char, val_fraction, dedup, progress):
        self.progress_path, self.seq_len = os.path.join(out_dir, PROGRESS_FILE), seq_len
        self.max_tokens_per_char, self.val_fraction = max_tokens_per_char, val_fraction
        self.sep = np.array([sep_id], dtype=dtype)  # ends every document
        self.writers = {split: SequenceWriter(os.path.join(out_dir, f"{split}.bin"), dtype, seq_len,
                                              progress["writers"][split] if progress else None) for split in SPLITS}
        self.stats = progress["stats"] if progress else {
            "documents": 0, "short_documents": 0, "dropped_documents": 0, "dropped_tokens": 0, "duplicate_documents": 0,
            "duplicate_tokens": 0, "train_tokens": 0, "val_tokens": 0}
        self.seen = SeenTexts(os.path.join(out_dir, "dedup.bin"),
                              progress["dedup_bytes"] if progress else 0) if dedup else None
        self.read = progress["read"] if progress else 0  # documents consumed from the source

    def write_batch(self, batch, results, end, short):
        """An encoded batch of (source position, text) written in order, the position deciding the split; those that
        compress badly or came before dropped and counted (`short`: too short; `end`: the position after)."""
        for (index, text), (ids, key) in zip(batch, results):
            if self.max_tokens_per_char and len(ids) > self.max_tokens_per_char * len(text):
                self.stats["dropped_documents"] += 1
                self.stats["dropped_tokens"] += len(ids)
            elif self.seen and not self.seen.add(key):
                self.stats["duplicate_documents"] += 1
                self.stats["duplicate_tokens"] += len(ids)
            else:
                # val_fraction of the documents held out, spread evenly by source position: the filters do not move them
                split = "val" if int((index + 1) * self.val_fraction) > int(index * self.val_fraction) else "train"
                self.writers[split].add(ids, self.sep)
                self.stats[f"{split}_tokens"] += len(ids) + 1
        self.stats["documents"] += end - self.read
        self.stats["short_documents"] += short
        self.read = end

    def record(self, source_state):
        """What was written made durable, and a progress record of it with the source's place (a RowStream's state)."""
        write_json(self.progress_path, dict(
            read=self.read, stats=self.stats, dedup_bytes=self.seen.state() if self.seen else 0,
            writers={split: writer.state() for split, writer in self.writers.items()}, source_state=source_state))

    def finish(self):
        """Each split's token file renamed into place if every split holds a whole sequence, else a one-line error
        (nothing renamed, the progress record removed: check_folder); returns the counts, with the sequences of each split."""
        if not (self.writers["train"].sequences and self.writers["val"].sequences) and os.path.exists(self.progress_path):
            os.remove(self.progress_path)  # an encoding that cannot finish is no work to go on: its settings bind no more
        if self.writers["train"].sequences and not self.stats["val_tokens"]:
            raise SystemExit(f"error: no document was held out: {self.val_fraction:g} of {self.read:,} documents is "
                             f"none; raise --val_fraction, or separate the text's documents with blank lines")
        if not self.writers["train"].sequences or not self.writers["val"].sequences:
            raise SystemExit(f"error: too little text for one {self.seq_len}-token sequence in each split "
                             f"({self.stats['train_tokens']} train, {self.stats['val_tokens']} val tokens)")
        for split, writer in self.writers.items():
            writer.finish()
            self.stats[f"{split}_sequences"] = writer.sequences
        if self.seen:
            self.seen.close()
        return self.stats


def batches(texts, position, min_doc_chars):
    """The documents of `texts`, the first at source position `position`, in batches of 256 documents or 4M
    characters, as tuples (batch, end, short, last): batch holds the (source position, text) of each document kept,
    end is the source position after the batch, short counts the documents skipped for being shorter than
    min_doc_chars, and last marks the final batch, the rest of the source (maybe empty)."""
    batch, chars, short = [], 0, 0
    for text in texts:
        position += 1
        if len(text) < min_doc_chars:
            short += 1
        else:
            batch.append((position - 1, text))
            chars += len(text)
        if len(batch) == 256 or chars >= 4_000_000:
            yield batch, position, short, False
            batch, chars, short = [], 0, 0
    yield batch, position, short, True


def encode_document(enc, dedup, text):
    """A worker thread's per-document work: the token ids and, with dedup, the de-duplication key."""
    # encode_to_numpy with no special tokens allowed is encode_ordinary without a Python list per document
    ids = [enc.encode_to_numpy(piece, disallowed_special=()) for piece in pieces(text)]
    return ids[0] if len(ids) == 1 else np.concatenate(ids), SeenTexts.key(text) if dedup else None


def start_pool(workers):
    """A pool of `workers` threads, or of as many as could start (--pids-limit counts threads), said; none: this thread
    encodes. Probed by starting them all at once, each waiting for the last."""
    probe, ready, started = ThreadPoolExecutor(workers), threading.Event(), 0
    try:
        for started in range(workers):  # a waiting thread is busy: each submit starts a new one
            probe.submit(ready.wait)
        started = workers
    except RuntimeError:  # "can't start new thread"
        print(f"note: {started} of {workers} encoding threads could start here (a process limit?): encoding with "
              f"{started or 'this one'}")
    finally:
        ready.set()
        probe.shutdown(wait=True, cancel_futures=True)  # their slots free again for the pool below
    return ThreadPoolExecutor(started) if started else SimpleNamespace(map=map, shutdown=lambda **_: None)


def encode_corpus(documents, enc, special_ids, dtype, max_tokens_per_char, out_dir, settings):
    """Encode every document of `documents` (a function returning a fresh document iterator) into out_dir's train.bin
    and val.bin; returns the counts for meta.json. Documents with more than max_tokens_per_char tokens per character are
    dropped (0: none are); `settings`: prepare.py's of these names: workers, seq_len, val_fraction, min_doc_chars,
    dedup, max_tokens, progress_minutes. Resumes from the last progress record of an interrupted run; the result is byte
    for byte an uninterrupted run's. Batches go to the workers as they are read, each written (here, in order) while the
    next one encodes; a progress record (every progress_minutes) first writes every batch in flight, so it is exact."""
    s = settings
    progress = read_progress(out_dir, s["dedup"], s["seq_len"], np.dtype(dtype).itemsize)
    files = TokenFiles(out_dir, dtype, s["seq_len"], special_ids["[SEP]"], max_tokens_per_char, s["val_fraction"],
                       s["dedup"], progress)
    if progress:
        print(f"resuming an interrupted preparation after {files.read:,} documents "
              f"({files.stats['train_tokens']:,} train tokens)")
    encode = functools.partial(encode_document, enc, files.seen is not None)
    # the documents not read yet: a RowStream continues from its progress record's position; any other source is
    # read again and those skipped (cheap next to encoding)
    state = progress and progress.get("source_state")
    texts = documents(state) if state else itertools.islice(documents(), files.read, None)
    bar = process.progress(desc="encoding", unit=" docs", initial=files.read)
    pool = start_pool(s["workers"] or runtime.usable_cpus())
    jobs, last_record, stop = deque(), time.monotonic(), False
    try:
        for batch, end, short, last in batches(texts, files.read, s["min_doc_chars"]):
            jobs.append((batch, pool.map(encode, [text for _, text in batch]), end, short))
            due = time.monotonic() - last_record >= s["progress_minutes"] * 60
            while len(jobs) > (0 if due or last else 1) and not stop:  # the oldest, and none past max_tokens (0: no limit)
                files.write_batch(*jobs.popleft())
                stop = s["max_tokens"] and files.stats["train_tokens"] >= s["max_tokens"]
            bar.update(files.read - bar.n)
            bar.set_postfix(train_tokens=f"{files.stats['train_tokens']:,}")
            if stop or last:
                break
            if due:
                files.record(documents.state() if isinstance(documents, RowStream) else None)
                last_record = time.monotonic()
    finally:
        pool.shutdown(cancel_futures=True)
        bar.close()
    return files.finish()


# ---------------------------------------------------------------- main
def fingerprint(dataset):
    """What identifies a local corpus' content cheaply: its files' names and sizes and their first
    and last 64 KiB (None for the embedded corpus and hub datasets: their names say it)."""
    if not os.path.exists(dataset):
        return None
    digest = hashlib.blake2b(digest_size=8)
    for path in local_files(dataset):
        size = os.path.getsize(path)
        digest.update(os.fsencode(os.path.relpath(path, dataset)) + f" {size}".encode())  # a name's bytes as they are
        with open(path, "rb") as f:
            digest.update(f.read(65536))
            f.seek(max(0, size - 65536))
            digest.update(f.read(65536))
    return digest.hexdigest()


def check_folder(out_dir, settings, source):
    """Refuse a folder whose work depends on other settings (finished: any; unfinished, what a rerun continues: a progress
    record, any; a tokenizer, TOKENIZER_SETTINGS; none after a failed attempt, so its correction runs) or finished from
    another version of the corpus (`source`), or from a corpus its settings.json does not record (a folder of token files
    copied in is not this command's work); an unfinished one's stale encoding is removed, these settings recorded."""
    path, has = os.path.join(out_dir, "settings.json"), lambda *names: all(os.path.exists(os.path.join(out_dir, n)) for n in names)
    previous = read_json(path, f"delete {out_dir} and prepare again") if has("settings.json") else {}
    if not isinstance(previous, dict):
        raise SystemExit(f"error: {path} is damaged (not an object): delete {out_dir} and prepare again")
    unfinished = not has("meta.json")
    held = settings if not unfinished or has(PROGRESS_FILE) else TOKENIZER_SETTINGS * has(TOKENIZER_FILE, TOKENIZER_FILE + ".source")
    changed = ", ".join(k for k in held if k in previous and previous[k] != settings[k])
    if changed:
        raise SystemExit(f"error: {out_dir} was prepared with other settings ({changed}); use another --out_dir or delete it")
    if not unfinished and "source" not in previous:  # finished, but prepare.py's record of what from is not there
        raise SystemExit(f"error: {out_dir} holds prepared data without prepare.py's record of what it was prepared from "
                         f"(settings.json): it may be another corpus; delete {out_dir} to prepare this one there, or "
                         f"choose another --out_dir")
    moved = previous.get("source", source) != source
    if moved and not unfinished:
        raise SystemExit(f"error: {out_dir} was prepared from another version of this corpus (its files changed "
                         f"since): delete {out_dir} to prepare it again, or choose another --out_dir")
    if moved:
        print(f"note: the corpus changed since the unfinished preparation in {out_dir}: its encoding starts over")
        for name in filter(has, STALE):
            os.remove(os.path.join(out_dir, name))
    if unfinished:
        write_json(path, dict(settings, source=source))


def main():
    source, documents = document_source(dataset, hf_config, hf_split, text_field)
    name = "pydocs" if dataset == "pydocs" else os.path.basename(dataset.rstrip("/")).split(".")[0] or "corpus"
    out = out_dir or os.path.join("data", name)
    claim_folder(out)
    # what the prepared data depends on: every setting but where it goes and how fast it is made
    settings = {k: v for k, v in config_keys(globals()).items() if k not in ("out_dir", "workers", "progress_minutes")}
    version = fingerprint(dataset)
    check_folder(out, settings, f"{source} {version or ''}".strip())
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        for split in SPLITS:  # its token files against its meta.json: a one-line error if they disagree
            load_tokens(out, split)
        print(f"{out} is already prepared (delete it to start over)")
        return

    t0 = time.monotonic()
    ranks = load_or_train_tokenizer(documents, os.path.join(out, TOKENIZER_FILE), vocab_size, tokenizer_train_chars,
                                    local=not source.startswith("hub:"))
    specials = special_ids(len(ranks))
    enc = make_encoding(ranks, specials)
    if enc.n_vocab < vocab_size:
        print(f"note: the corpus only supports {enc.n_vocab} tokens (asked for {vocab_size})")
    t1 = time.monotonic()
    dtype = token_dtype(enc.n_vocab)
    # the reference's compression filter, relative to this corpus' median (why not its absolute 0.25: docs/data.md)
    median = median_tokens_per_char(documents, enc, min_doc_chars) if max_compression else 0.0
    stats = encode_corpus(documents, enc, specials, dtype, max_compression * median, out,
                          dict(settings, workers=workers, progress_minutes=progress_minutes))
    if fingerprint(dataset) != version:  # a download or `zcat >` still writing it: what was read is a prefix
        raise SystemExit(f"error: {dataset} changed while it was read (is it still being written?): nothing was "
                         f"finished; run the same command once it is complete (the encoding then starts over)")
    stats.update(median_tokens_per_char=round(median, 4), max_tokens_per_char=round(max_compression * median, 4))
    meta = dict(source=source, vocab_size=enc.n_vocab, n_regular=len(ranks), special_ids=specials,
                seq_len=seq_len, dtype=dtype, tokenizer_file=TOKENIZER_FILE, **stats, settings=settings,
                tokenizer_seconds=round(t1 - t0, 1), encode_seconds=round(time.monotonic() - t1, 1))
    write_json(meta_path, meta)
    for path in filter(os.path.exists, [os.path.join(out, n) for n in (PROGRESS_FILE, TOKENIZER_FILE + ".source")]):
        os.remove(path)  # the work is done: records no longer needed
    print(f"wrote {out}: {stats['train_sequences']:,} train and {stats['val_sequences']:,} val sequences "
          f"of {seq_len} tokens, vocabulary {enc.n_vocab}, in {time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    process.guarded(main, "what was finished is kept (the tokenizer once trained, the encoding up to its last progress "
                    "record, written every --progress_minutes); run the same command to continue")
