"""Data preparation's speed: prepare.py's encoding pass against raw tiktoken on the same text.

    python tools/bench_prepare.py --corpus=books.txt.gz --data_dir=data/books --repeats=3

The pass (reading and decompressing the corpus, its compression median, encoding, de-duplication
hashing, writing the token files into a temporary folder) against tiktoken's raw batch encoder
over the same documents already in memory, at its best (256 whole documents a call), on the same
threads, in alternating rounds (A B A B: a shared machine drifts). data_dir gives the tokenizer.
"""
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up; first, for torch's temporary folder)
import prepare  # noqa: E402
from cram.data import load_tokenizer  # noqa: E402
from cram.files import load_meta  # noqa: E402
from cram.process import guarded  # noqa: E402
from measure import alternate, spread  # noqa: E402

# -----------------------------------------------------------------------------
corpus = ""             # the text to encode: a file or folder in prepare.py's formats
data_dir = "data/pydocs"  # a prepared folder whose tokenizer encodes it
max_chars = 0           # >= 0: only the corpus' first documents up to this many characters (0: all)
repeats = 3             # >= 1: alternating rounds
# -----------------------------------------------------------------------------


class FirstDocuments:
    """documents(): the corpus' documents, stopping after max_chars characters (0: all)."""

    def __init__(self, documents, max_chars):
        self.documents, self.max_chars = documents, max_chars

    def __call__(self):
        chars = 0
        for text in self.documents():
            if self.max_chars and chars >= self.max_chars:
                return
            chars += len(text)
            yield text


def raw_tiktoken(enc, texts, threads):
    start = time.perf_counter()
    for i in range(0, len(texts), 256):  # prepare.py also caps a batch at 4M characters
        enc.encode_ordinary_batch(texts[i:i + 256], num_threads=threads)
    return time.perf_counter() - start


def encoding_pass(documents, enc, meta, threads):
    """prepare.py's pass with the settings the folder was prepared with (its meta.json's; the whole corpus,
    whatever its max_tokens), into a temporary folder."""
    out, s = tempfile.mkdtemp(), meta["settings"]
    try:
        start = time.perf_counter()
        median = prepare.median_tokens_per_char(documents, enc, s["min_doc_chars"]) if s["max_compression"] else 0.0
        prepare.encode_corpus(documents, enc, meta["special_ids"], meta["dtype"], s["max_compression"] * median, out,
                              dict(s, workers=threads, seq_len=meta["seq_len"], max_tokens=0, progress_minutes=1.0))
        return time.perf_counter() - start
    finally:
        shutil.rmtree(out)


def main():
    if not corpus:
        raise SystemExit("error: give --corpus=<file or folder> to encode")
    enc, meta, threads = load_tokenizer(data_dir), load_meta(data_dir), os.cpu_count() or 1
    documents = FirstDocuments(prepare.document_source(corpus)[1], max_chars)
    texts = list(documents())
    n_bytes = sum(len(t.encode()) for t in texts)
    print(f"# {corpus}: {len(texts):,} documents, {n_bytes / 1e6:,.1f} MB of text | {data_dir}'s tokenizer "
          f"({enc.n_vocab} tokens) | {threads} threads | {time.strftime('%Y-%m-%d')}")
    times = alternate({"raw tiktoken": lambda: raw_tiktoken(enc, texts, threads),
                       "prepare.py's encoding pass": lambda: encoding_pass(documents, enc, meta, threads)}, repeats)
    print(f"\n| | MB/s, median (min-max) of {repeats} alternating rounds |\n|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {spread([n_bytes / 1e6 / t for t in seconds], '{:.1f}')} |")
    ratios = [r / p for r, p in zip(times["raw tiktoken"], times["prepare.py's encoding pass"])]
    print(f"\nthe pass at {spread([100 * r for r in ratios], '{:.0f}%')} of raw tiktoken's speed (per round)")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "nothing to keep: a benchmark only prints (its preparations go to a temporary folder)")
