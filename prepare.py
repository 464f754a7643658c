"""Raw text -> a BPE tokenizer trained on that text -> fixed-length token files for MLM.

    python prepare.py                                   # embedded corpus, no download
    python prepare.py --dataset=path/to/books.txt.gz    # local .txt[.gz], .jsonl/.json, .parquet, or a folder
    python prepare.py --dataset=HuggingFaceFW/fineweb-edu --hf_config=sample-10BT --vocab_size=32768

Writes to out_dir: tokenizer.tiktoken (BPE ranks in tiktoken's format), train.bin and val.bin
(flat arrays of seq_len-token sequences: documents joined by [SEP], cut into fixed lengths)
and meta.json, which is written last and marks the work as done. Documents are streamed and
tokens written as they come, so memory does not grow with the corpus.
"""
import ast
import gzip
import hashlib
import importlib.util
import itertools
import json
import os
import platform
import re
import sys
import sysconfig
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

from configurator import configure
from data import (SPECIAL_TOKENS, TOKENIZER_FILE, hub_reachable, make_encoding, read_ranks, write_atomically,
                  write_json, write_ranks)

# -----------------------------------------------------------------------------
dataset = "pydocs"      # 'pydocs' (embedded), a local file or folder, or a Hugging Face hub dataset name
hf_config = ""          # hub dataset configuration, e.g. 'sample-10BT'
hf_split = "train"
text_field = "text"     # the text column of .jsonl/.json/.parquet files and hub datasets
out_dir = ""            # default: data/<dataset name>
vocab_size = 8192       # including the 4 special tokens; the reference uses 32768
seq_len = 128
val_fraction = 0.01     # share of documents held out for validation
tokenizer_train_chars = 500_000_000  # train the tokenizer on at most this much text (the start of the corpus)
max_tokens = 0          # stop after this many train tokens (0: the whole corpus)
max_compression = 1.5   # drop documents with more tokens per character than this times the corpus median (0: off)
min_doc_chars = 20      # drop shorter documents (blank lines, stubs)
dedup = True            # drop documents whose normalised text (lower case, no whitespace) came before
workers = 0             # threads encoding in parallel (tiktoken releases the GIL); 0: all cores
progress_minutes = 1.0  # write a progress record this often: a killed run redoes at most this much
curriculum = False      # the reference's order: within each block of train sequences, those with the most sentence ends first
curriculum_block = 65536  # train sequences sorted together: bounds the memory (8M tokens, 16-32 MB) and keeps the curriculum mild
# -----------------------------------------------------------------------------

PROGRESS_FILE = "progress.json"
CURRICULUM_JOURNAL = "curriculum.tmp"  # a sorted block, kept until it is safely in train.bin.tmp
# a token ends a sentence when its bytes end with . ! or ?, then maybe closing quotes or brackets (ASCII or UTF-8 ’ ”)
SENTENCE_END = re.compile(rb"[.!?](?:[\"')\]]|\xe2\x80[\x99\x9d])*$")
LOCAL_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
PYDOCS_PACKAGES = ("numpy", "torch")  # the project cannot run without them, so they are always there


# ---------------------------------------------------------------- sources
def pydocs_roots():
    """Source trees of the embedded corpus: the standard library, then numpy and torch."""
    roots = [("stdlib", sysconfig.get_paths()["stdlib"])]
    for name in PYDOCS_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:
            roots.append((name, os.path.dirname(spec.origin)))
    return roots


def pydocs_documents():
    """The English documentation that ships with Python: pydoc's topic pages, then the
    docstrings of every module of the standard library, numpy and torch (one document per
    source file, files in sorted order). The same text on every machine with the same
    Python/numpy/torch versions (recorded in meta.json), and no download."""
    from pydoc_data.topics import topics
    for key in sorted(topics):
        yield topics[key]
    skip = {"__pycache__", "site-packages", "test", "tests", "testing", "idlelib", "lib2to3", "turtledemo"}
    for _, root in pydocs_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
            for filename in sorted(f for f in filenames if f.endswith(".py")):
                try:
                    with open(os.path.join(dirpath, filename), encoding="utf-8") as f:
                        tree = ast.parse(f.read())
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
        return files
    if not path.endswith(LOCAL_SUFFIXES):
        raise SystemExit(f"error: {path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)})")
    return [path]


def text_file_documents(path):
    """A .txt file holds documents separated by blank lines; lines inside one are kept."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            lines = []
            for line in f:
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield "".join(lines).strip()
                    lines = []
            if lines:
                yield "".join(lines).strip()
    except (OSError, EOFError) as e:  # unreadable or truncated (gzip) files
        raise SystemExit(f"error: cannot read {path}: {e}")


def text_of(row, where):
    """The text field of a record; null is an empty document (skipped), anything else but a
    string is an error rather than a silent str() of it."""
    text = row[text_field]
    if text is not None and not isinstance(text, str):
        raise SystemExit(f"error: {where}: field '{text_field}' holds {type(text).__name__}, not text; "
                         f"set --text_field= to the text column")
    return text or ""


class RowStream:
    """The documents of a `datasets` streaming dataset: a hub dataset, or one .jsonl/.json/.parquet
    file. An interrupted preparation resumes it without reading again what was done (for a hub
    dataset, downloading it again): state() is datasets' state_dict() after the last document
    yielded, and calling with that state continues from there."""

    def __init__(self, load, where):
        self.load, self.where, self.rows = load, where, None

    def __call__(self, state=None):
        try:
            self.rows = self.load()
            if state:
                self.rows.load_state_dict(state)
            for row in self.rows:
                if text_field not in row:
                    raise SystemExit(f"error: {self.where} has no '{text_field}' field (fields: {', '.join(row)}); "
                                     f"set --text_field=")
                yield text_of(row, self.where)
        except Exception as e:  # datasets raises many types; the user needs one line
            raise SystemExit(f"error: cannot read {self.where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def state(self):
        return self.rows.state_dict()


def record_file(path):
    """Rows of a .jsonl/.json/.parquet file, read (streaming, offline) by `datasets`."""
    import datasets
    builder = "parquet" if path.endswith(".parquet") else "json"
    return RowStream(lambda: datasets.load_dataset(builder, data_files=path, split="train", streaming=True), path)


def hub_dataset(name):
    import datasets
    return RowStream(lambda: datasets.load_dataset(name, hf_config or None, split=hf_split, streaming=True),
                     f"hub dataset {name}")


def document_source(name):
    """(description, function returning a fresh document iterator) for --dataset."""
    if name == "pydocs":
        versions = f"Python {platform.python_version()}, " + ", ".join(
            f"{pkg} {__import__(pkg).__version__}" for pkg, _ in pydocs_roots()[1:])
        return f"pydocs ({versions})", pydocs_documents
    if os.path.exists(name):
        files = local_files(name)
        if len(files) == 1 and ".txt" not in os.path.basename(files[0]):
            return os.path.abspath(name), record_file(files[0])

        def documents():
            for path in files:
                yield from text_file_documents(path) if ".txt" in os.path.basename(path) else record_file(path)()
        return os.path.abspath(name), documents
    if name.endswith(LOCAL_SUFFIXES) or name.startswith((".", "/")) or name.count("/") > 1:
        raise SystemExit(f"error: file or folder not found: {name}")
    if not hub_reachable():
        raise SystemExit(f"error: '{name}' is not a local path and the Hugging Face hub cannot be reached; "
                         f"offline, use --dataset=pydocs (embedded) or a local .txt/.jsonl/.json/.parquet file or folder")
    return f"hub:{name}" + (f":{hf_config}" if hf_config else ""), hub_dataset(name)


# ---------------------------------------------------------------- tokenizer
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


def train_bpe(texts, size):
    """A byte-level BPE of `size` tokens trained with `tokenizers` on an iterable of strings."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=True,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer=trainer)
    return bpe


def bpe_ranks(bpe):
    """tiktoken ranks of a trained BPE. Its ids (alphabet, then merges in order) become the
    ranks, so tiktoken's lowest-rank-first merging reproduces the same ids."""
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in bpe.get_vocab().items()}
    assert sorted(ranks.values()) == list(range(len(ranks))), "BPE ids are not contiguous"
    return ranks


def train_tokenizer(documents, path):
    """Train the corpus' tokenizer on its first tokenizer_train_chars characters and save it
    in tiktoken's format; the special tokens will take the ids after the BPE's."""
    def limited_text():
        chars = 0
        for doc in documents():
            yield doc
            chars += len(doc)
            if chars >= tokenizer_train_chars:
                return

    print(f"training a {vocab_size}-token BPE on up to {tokenizer_train_chars:,} characters")
    ranks = bpe_ranks(train_bpe(limited_text(), vocab_size - len(SPECIAL_TOKENS)))
    write_atomically(path, lambda tmp: write_ranks(tmp, ranks))
    return ranks


# ---------------------------------------------------------------- token files
class SequenceWriter:
    """Appends token streams to a .tmp file in whole seq_len sequences; finish() renames it.
    state() makes what was written durable and describes it; a writer built from that state
    continues the same file, dropping whatever was written after the state was taken."""

    def __init__(self, path, dtype, state=None):
        self.path, self.dtype = path, dtype
        if state:
            self.file = open(path + ".tmp", "r+b")
            self.file.truncate(state["bytes"])
            self.file.seek(state["bytes"])
        else:
            self.file = open(path + ".tmp", "wb")
        self.pending = np.asarray(state["pending"] if state else [], dtype=dtype)
        self.sequences = state["sequences"] if state else 0

    def add(self, *tokens):
        self.pending = np.concatenate([self.pending, *tokens], dtype=self.dtype)
        n = len(self.pending) // seq_len
        if n:
            self.file.write(self.pending[:n * seq_len].tobytes())
            self.pending = self.pending[n * seq_len:]
            self.sequences += n

    def state(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        return dict(bytes=self.file.tell(), pending=self.pending.tolist(), sequences=self.sequences)

    def finish(self):  # the last partial sequence is dropped
        self.file.close()
        os.replace(self.path + ".tmp", self.path)


def is_validation(doc_index):
    """Spread val_fraction of the documents evenly over the corpus (deterministic): by position in
    the source, so the filters do not move the held-out documents."""
    return int((doc_index + 1) * val_fraction) > int(doc_index * val_fraction)


class SeenTexts:
    """Exact de-duplication in 8 bytes per document: 64-bit hashes of the text, lower-cased and
    without whitespace, in a sorted array, the newest in a set merged into it every million. The
    hashes also go to an append-only file, so an interrupted preparation resumes with the same memory."""

    def __init__(self, path, size=0):
        self.file = open(path, "r+b" if size else "wb")
        self.file.truncate(size)
        self.file.seek(size)
        self.sorted = np.unique(np.fromfile(path, dtype="<u8", count=size // 8))
        self.recent, self.unwritten = set(), []

    @staticmethod
    def key(text):
        # lower case, whitespace deleted (bytes.translate: a tenth of the time of split and join)
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


def read_progress(path, splits):
    """The last progress record of an interrupted preparation with these settings, or None
    (then it starts over) when there is none or its files are gone."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        progress = json.load(f)
    files = [f"{split}.bin.tmp" for split in splits] + (["dedup.bin"] if dedup else [])
    if not all(os.path.exists(os.path.join(out_dir, name)) for name in files):
        return None
    return progress


def sentence_end_ids(enc):
    """A lookup table over the vocabulary: True for the tokens that end a sentence."""
    ends = np.zeros(enc.n_vocab, dtype=bool)
    for token in range(enc.n_vocab):
        ends[token] = token not in enc.special_tokens_set and bool(SENTENCE_END.search(enc.decode_single_token_bytes(token)))
    return ends


def sort_by_sentence_ends(path, dtype, ends, start, journaled, record):
    """The curriculum, in place on the finished train token file: each block of curriculum_block
    sequences is sorted by its count of sentence-ending tokens, most first (stable, so ties keep
    the corpus order). Blocks from `start` on are sorted, one in memory at a time; the number of
    blocks is returned. A sorted block goes to a journal file before it overwrites its place, and
    record(block, journaled) notes each step, so a kill mid-write is repaired from the journal on
    resuming (journaled: the record says block `start` was being overwritten)."""
    row_bytes = seq_len * np.dtype(dtype).itemsize
    block_bytes = curriculum_block * row_bytes
    n_blocks = -(-os.path.getsize(path) // block_bytes)
    journal = os.path.join(out_dir, CURRICULUM_JOURNAL)

    def write_block(f, i, data):
        f.seek(i * block_bytes)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        record(i + 1, False)

    with open(path, "r+b") as f:
        if journaled:  # killed while block `start` was being overwritten: its sorted copy is whole
            with open(journal, "rb") as j:
                write_block(f, start, j.read())
            start += 1
        for i in tqdm(range(start, n_blocks), desc="curriculum", unit=" blocks", initial=start, total=n_blocks):
            f.seek(i * block_bytes)
            rows = np.frombuffer(f.read(block_bytes), dtype=dtype).reshape(-1, seq_len)
            data = rows[np.argsort(-ends[rows].sum(axis=1), kind="stable")].tobytes()
            with open(journal, "wb") as j:
                j.write(data)
                j.flush()
                os.fsync(j.fileno())
            record(i, True)
            write_block(f, i, data)
    if os.path.exists(journal):
        os.remove(journal)
    return n_blocks


def median_tokens_per_char(documents, enc, n=1000, max_chars=5_000_000):
    """Tokens per character of the corpus' typical document: the median over its first n
    documents or max_chars characters, whichever comes first (deterministic, so a resumed
    preparation finds the same; bounded, so a corpus of whole books is not read twice)."""
    texts, chars = [], 0
    for text in documents():
        if len(text) >= min_doc_chars:
            texts.append(text)
            chars += len(text)
        if len(texts) == n or chars >= max_chars:
            break
    return float(np.median([len(ids) / len(t) for t, ids in zip(texts, enc.encode_ordinary_batch(texts))]))


def encode_corpus(documents, enc, special_ids, dtype, max_tokens_per_char):
    """Encode and write every document, resuming an interrupted run from its last progress record:
    the files are cut back to what that record says was written, the source is read again up to
    the documents it had consumed (cheap next to encoding; a RowStream instead continues from the
    position the record holds), and the result is byte for byte what an uninterrupted run writes.
    A record is written every progress_minutes."""
    sep = np.array([special_ids["[SEP]"]], dtype=dtype)  # ends every document
    splits = ("train", "val")
    progress_path = os.path.join(out_dir, PROGRESS_FILE)
    progress = read_progress(progress_path, splits)
    writers = {split: SequenceWriter(os.path.join(out_dir, f"{split}.bin"), dtype,
                                     progress["writers"][split] if progress else None) for split in splits}
    stats = progress["stats"] if progress else {
        "documents": 0, "short_documents": 0, "dropped_documents": 0, "dropped_tokens": 0, "duplicate_documents": 0,
        "duplicate_tokens": 0, "train_tokens": 0, "val_tokens": 0}
    seen = SeenTexts(os.path.join(out_dir, "dedup.bin"), progress["dedup_bytes"] if progress else 0) if dedup else None
    read = progress["read"] if progress else 0  # documents consumed from the source
    if progress:
        print(f"resuming an interrupted preparation after {read:,} documents ({stats['train_tokens']:,} train tokens)")
    bar = tqdm(desc="encoding", unit=" docs", initial=read)
    last_record = time.time()

    def encode(text):  # on a worker thread: all the per-document work, so it runs beside the encoding
        # encode_to_numpy with no special tokens allowed is encode_ordinary without a Python list per document
        return enc.encode_to_numpy(text, disallowed_special=()), seen.key(text) if seen else None

    def write(job):  # a batch submitted to the workers, in source order; the position decides the split
        nonlocal read
        batch, results, end, short = job
        for (index, text), (ids, key) in zip(batch, results):
            if max_compression and len(ids) > max_tokens_per_char * len(text):
                stats["dropped_documents"] += 1
                stats["dropped_tokens"] += len(ids)
                continue
            if seen and not seen.add(key):
                stats["duplicate_documents"] += 1
                stats["duplicate_tokens"] += len(ids)
                continue
            split = "val" if is_validation(index) else "train"
            writers[split].add(ids, sep)
            stats[f"{split}_tokens"] += len(ids) + 1
        stats["documents"] += end - read
        stats["short_documents"] += short
        read = end

    def record(**place):  # place: the source's (source_state) or, once encoding is done, the sorting pass'
        write_json(progress_path, dict(read=read, stats=stats, dedup_bytes=seen.state() if seen else 0,
                                       writers={split: w.state() for split, w in writers.items()}, **place))

    # a record with sorted_blocks was taken after the last document: encoding is done
    encoded = bool(progress) and "sorted_blocks" in progress
    if encoded:
        texts = ()
    elif progress and progress.get("source_state"):
        texts = documents(progress["source_state"])
    else:
        texts = itertools.islice(documents(), read, None)
    # Batches of 256 documents or 4M characters (a few whole books; a tenth of a second of work)
    # go to the workers as they are read, and each is written (here, in order) while the next one
    # encodes: reading, writing and encoding overlap. `read` counts the documents written; a record
    # first writes every batch in flight, so it is exact.
    pool = ThreadPoolExecutor(workers or os.cpu_count() or 1)
    jobs, batch, chars, position, short, stop = deque(), [], 0, read, 0, False
    try:
        for text in texts:
            position += 1
            if len(text) < min_doc_chars:
                short += 1
            else:
                batch.append((position - 1, text))
                chars += len(text)
            if len(batch) == 256 or chars >= 4_000_000:
                jobs.append((batch, pool.map(encode, [text for _, text in batch]), position, short))
                batch, chars, short = [], 0, 0
                due = time.time() - last_record >= progress_minutes * 60
                while len(jobs) > (0 if due else 1) and not stop:
                    write(jobs.popleft())
                    stop = bool(max_tokens) and stats["train_tokens"] >= max_tokens  # the batches after are not written
                bar.update(read - bar.n)
                bar.set_postfix(train_tokens=f"{stats['train_tokens']:,}")
                if stop:
                    break
                if due:
                    record(source_state=documents.state() if isinstance(documents, RowStream) else None)
                    last_record = time.time()
        if not stop:
            jobs.append((batch, pool.map(encode, [text for _, text in batch]), position, short))
            while jobs:
                write(jobs.popleft())
    finally:
        pool.shutdown(cancel_futures=True)
        bar.close()
    if not writers["train"].sequences or not writers["val"].sequences:  # before anything is renamed into place
        raise SystemExit(f"error: too little text for one {seq_len}-token sequence in each split "
                         f"({stats['train_tokens']} train, {stats['val_tokens']} val tokens)")
    if curriculum:
        step = dict(sorted_blocks=progress["sorted_blocks"], journaled=progress["journaled"]) if encoded else \
            dict(sorted_blocks=0, journaled=False)
        if not encoded:
            record(**step)  # the whole train file is now durable, and encoding is never redone
        ends = sentence_end_ids(enc)
        stats["curriculum_blocks"] = sort_by_sentence_ends(
            writers["train"].path + ".tmp", dtype, ends, step["sorted_blocks"], step["journaled"],
            lambda block, journaled: record(sorted_blocks=block, journaled=journaled))
        stats["sentence_end_token_ids"] = int(ends.sum())
    for split, writer in writers.items():
        writer.finish()
        stats[f"{split}_sequences"] = writer.sequences
    if seen:
        seen.close()
    return stats


def main():
    global out_dir
    source, documents = document_source(dataset)
    name = "pydocs" if dataset == "pydocs" else os.path.basename(dataset.rstrip("/")).split(".")[0] or "corpus"
    out_dir = out_dir or os.path.join("data", name)
    os.makedirs(out_dir, exist_ok=True)
    settings = dict(dataset=dataset, hf_config=hf_config, hf_split=hf_split, text_field=text_field,
                    vocab_size=vocab_size, seq_len=seq_len, val_fraction=val_fraction,
                    tokenizer_train_chars=tokenizer_train_chars, max_tokens=max_tokens,
                    max_compression=max_compression, min_doc_chars=min_doc_chars, dedup=dedup)
    if curriculum:  # only when on, so data prepared before the option existed still matches its settings
        settings.update(curriculum=True, curriculum_block=curriculum_block)
    settings_path = os.path.join(out_dir, "settings.json")
    if os.path.exists(settings_path):
        with open(settings_path) as f:
            previous = json.load(f)
        if previous != settings:
            changed = ", ".join(k for k in settings if previous.get(k) != settings[k])
            raise SystemExit(f"error: {out_dir} holds data prepared with other settings ({changed}); "
                             f"use another --out_dir or delete it")
    else:
        write_json(settings_path, settings)
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        print(f"{out_dir} is already prepared (delete it to start over)")
        return

    t0 = time.time()
    tokenizer_path = os.path.join(out_dir, TOKENIZER_FILE)
    if os.path.exists(tokenizer_path):
        ranks = read_ranks(tokenizer_path)
        print(f"reusing {tokenizer_path}")
    else:
        ranks = train_tokenizer(documents, tokenizer_path)
    n_regular = len(ranks)
    if n_regular + len(SPECIAL_TOKENS) < vocab_size:
        print(f"note: the corpus only supports {n_regular + len(SPECIAL_TOKENS)} tokens (asked for {vocab_size})")
    special_ids = {tok: n_regular + i for i, tok in enumerate(SPECIAL_TOKENS)}
    enc = make_encoding(ranks, special_ids)
    t1 = time.time()
    dtype = "uint16" if enc.n_vocab <= 2 ** 16 else "uint32"
    # the reference's compression filter kept documents under 0.25 tokens per character with its
    # 32k lower-cased WordPiece; byte-level BPE compresses by the vocabulary size and the text, so
    # the limit is relative: a multiple of this corpus' own median (1.5x removes the worst tail;
    # the absolute 0.25 would remove 20% of English books at 32k and 55% of pydocs at 8k)
    median = median_tokens_per_char(documents, enc) if max_compression else 0.0
    stats = encode_corpus(documents, enc, special_ids, dtype, max_compression * median)
    stats.update(median_tokens_per_char=round(median, 4), max_tokens_per_char=round(max_compression * median, 4))
    meta = dict(source=source, vocab_size=enc.n_vocab, n_regular=n_regular, special_ids=special_ids,
                seq_len=seq_len, dtype=dtype, tokenizer_file=TOKENIZER_FILE, **stats, settings=settings,
                tokenizer_seconds=round(t1 - t0, 1), encode_seconds=round(time.time() - t1, 1))
    write_json(meta_path, meta)
    progress_path = os.path.join(out_dir, PROGRESS_FILE)
    if os.path.exists(progress_path):  # the work is done: the record is no longer needed
        os.remove(progress_path)
    print(f"wrote {out_dir}: {stats['train_sequences']:,} train and {stats['val_sequences']:,} val sequences "
          f"of {seq_len} tokens, vocabulary {enc.n_vocab}, in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
