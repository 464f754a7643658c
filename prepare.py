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
import importlib.util
import json
import os
import platform
import sys
import sysconfig
import time

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
max_tokens_per_char = 0.0  # the reference's filter drops documents above 0.25 (0: keep all)
min_doc_chars = 20      # drop shorter documents (blank lines, stubs)
# -----------------------------------------------------------------------------

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


def record_documents(path):
    """Rows of a .jsonl/.json/.parquet file, read (streaming, offline) by `datasets`."""
    import datasets
    builder = "parquet" if path.endswith(".parquet") else "json"
    rows = datasets.load_dataset(builder, data_files=path, split="train", streaming=True)
    for row in rows:
        if text_field not in row:
            raise SystemExit(f"error: {path} has no '{text_field}' field (fields: {', '.join(row)}); set --text_field=")
        yield row[text_field] or ""  # null text: an empty document, skipped


def hub_documents(name):
    import datasets
    try:
        rows = datasets.load_dataset(name, hf_config or None, split=hf_split, streaming=True)
        for row in rows:
            yield row[text_field]
    except KeyError:
        raise SystemExit(f"error: hub dataset {name} has no '{text_field}' field; set --text_field=")
    except Exception as e:  # datasets raises many types; the user needs one line
        raise SystemExit(f"error: cannot stream hub dataset {name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def document_source(name):
    """(description, function returning a fresh document iterator) for --dataset."""
    if name == "pydocs":
        versions = f"Python {platform.python_version()}, " + ", ".join(
            f"{pkg} {__import__(pkg).__version__}" for pkg, _ in pydocs_roots()[1:])
        return f"pydocs ({versions})", pydocs_documents
    if os.path.exists(name):
        files = local_files(name)

        def documents():
            for path in files:
                yield from (text_file_documents if ".txt" in os.path.basename(path) else record_documents)(path)
        return os.path.abspath(name), documents
    if name.endswith(LOCAL_SUFFIXES) or name.startswith((".", "/")) or name.count("/") > 1:
        raise SystemExit(f"error: file or folder not found: {name}")
    if not hub_reachable():
        raise SystemExit(f"error: '{name}' is not a local path and the Hugging Face hub cannot be reached; "
                         f"offline, use --dataset=pydocs (embedded) or a local .txt/.jsonl/.json/.parquet file or folder")
    return f"hub:{name}" + (f":{hf_config}" if hf_config else ""), lambda: hub_documents(name)


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
    """Appends token streams to a .tmp file in whole seq_len sequences; finish() renames it."""

    def __init__(self, path, dtype):
        self.path, self.dtype = path, dtype
        self.file = open(path + ".tmp", "wb")
        self.pending = np.empty(0, dtype=dtype)
        self.sequences = 0

    def add(self, tokens):
        self.pending = np.concatenate([self.pending, np.asarray(tokens, dtype=self.dtype)])
        n = len(self.pending) // seq_len
        if n:
            self.file.write(self.pending[:n * seq_len].tobytes())
            self.pending = self.pending[n * seq_len:]
            self.sequences += n

    def finish(self):  # the last partial sequence is dropped
        self.file.close()
        os.replace(self.path + ".tmp", self.path)

    def discard(self):
        self.file.close()
        os.remove(self.path + ".tmp")


def is_validation(doc_index):
    """Spread val_fraction of the documents evenly over the corpus (deterministic)."""
    return int((doc_index + 1) * val_fraction) > int(doc_index * val_fraction)


def encode_corpus(documents, enc, special_ids, dtype):
    sep = special_ids["[SEP]"]
    writers = {split: SequenceWriter(os.path.join(out_dir, f"{split}.bin"), dtype) for split in ("train", "val")}
    stats = {"documents": 0, "dropped_documents": 0, "train_tokens": 0, "val_tokens": 0}
    bar = tqdm(desc="encoding", unit=" docs")
    batch, doc_index = [], 0

    def flush(batch):
        nonlocal doc_index
        for text, ids in zip(batch, enc.encode_ordinary_batch(batch, num_threads=os.cpu_count() or 1)):
            if max_tokens_per_char and len(ids) > max_tokens_per_char * len(text):
                stats["dropped_documents"] += 1
                continue
            split = "val" if is_validation(doc_index) else "train"
            doc_index += 1
            ids.append(sep)
            writers[split].add(ids)
            stats[f"{split}_tokens"] += len(ids)
        stats["documents"] += len(batch)
        bar.update(len(batch))
        bar.set_postfix(train_tokens=f"{stats['train_tokens']:,}")

    try:
        for text in documents():
            if len(text) < min_doc_chars:
                continue
            batch.append(text)
            if len(batch) == 256:
                flush(batch)
                batch = []
                if max_tokens and stats["train_tokens"] >= max_tokens:
                    break
        if batch:
            flush(batch)
    except BaseException:  # errors and Ctrl-C: no half-written token files
        for writer in writers.values():
            writer.discard()
        raise
    finally:
        bar.close()
    for split, writer in writers.items():
        writer.finish()
        stats[f"{split}_sequences"] = writer.sequences
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
                    max_tokens_per_char=max_tokens_per_char, min_doc_chars=min_doc_chars)
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
    stats = encode_corpus(documents, enc, special_ids, dtype)
    if stats["train_sequences"] == 0 or stats["val_sequences"] == 0:
        raise SystemExit(f"error: too little text for one {seq_len}-token sequence in each split "
                         f"({stats['train_tokens']} train, {stats['val_tokens']} val tokens)")
    meta = dict(source=source, vocab_size=enc.n_vocab, n_regular=n_regular, special_ids=special_ids,
                seq_len=seq_len, dtype=dtype, tokenizer_file=TOKENIZER_FILE, **stats, settings=settings,
                tokenizer_seconds=round(t1 - t0, 1), encode_seconds=round(time.time() - t1, 1))
    write_json(meta_path, meta)
    print(f"wrote {out_dir}: {stats['train_sequences']:,} train and {stats['val_sequences']:,} val sequences "
          f"of {seq_len} tokens, vocabulary {enc.n_vocab}, in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
