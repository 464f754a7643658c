"""Get ready for the first GPU call: its carry folder built here, checked, and the call printed to paste.

    python tools/gpu_call.py --corpus=books.txt.gz --glue_dir=glue_data

A lent GPU gives a session 15 device-minutes, starts bare, and receives only the working tree (tracked
and untracked files that git does not ignore) plus the ignored paths a call names in `carry`, 64 MiB in
all. So everything the call needs that costs CPU time is made here, on any CPU, before a GPU is lent:
  - <carry_dir>/corpus: the corpus prepared by prepare.py (a 32k vocabulary, sequences of 128), as many
    train tokens as fit beside the tree and GLUE (uint16: 2 bytes a token), unless max_tokens says
  - or, with carry_text, <carry_dir>/corpus.txt.xz: the corpus's text from its start, xz-compressed, as much as fits
    (English books: about 1.8 times the tokens of the uint16 files), which the call prepares on the GPU machine
    (tools/gpu_report.py's prepare phase, at this vocabulary and sequence length: about half a minute on 16 cores)
  - <carry_dir>/glue: GLUE's RTE, MRPC, STS-B and SST-2 (train.tsv and dev.tsv), copied from glue_dir
Then it checks what the call will find: the prepared data as train.py reads it (meta.json, the token
files' sizes, every id below the vocabulary, the tokenizer) at the vocabulary and sequence length asked
for, and the tree plus the carry folder within limit_mib; and prints the device call (command, carry,
timeout_s): tools/gpu_report.py's phases (the health check and the transfer phase, or another), ended by
its own deadline a minute or more before timeout_s, its files copied into $OUT as each piece finishes
(docs/gpu.md, "The first GPU session"). A rerun keeps a prepared corpus that passes the checks, and a
carried text that reads whole (whatever --corpus says then); delete the folder to remake it.
"""
import functools
import glob
import json
import lzma
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.data import OPENERS, load_run_data  # noqa: E402
from cram.files import write_atomically  # noqa: E402
from cram.process import guarded  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gpu_report import PHASES  # noqa: E402  (the phases a call may name)

# -----------------------------------------------------------------------------
corpus = ""                # the text to prepare (prepare.py's local formats: .txt.gz, .jsonl, ...); its start is used
glue_dir = ""              # a GLUE folder in the original layout: its RTE, MRPC, STS-B and SST-2 folders are carried
carry_dir = "data/gpu_call"  # a git-ignored folder of this repository (data/ is): the call's one carried path
max_tokens = 0             # >= 0: train tokens to prepare; 0: as many as fit limit_mib beside the tree and GLUE
vocab_size = 32768         # >= 260: the carried data's vocabulary (docs/gpu.md's plan assumes 32768)
seq_len = 128              # >= 2: its sequence length
tokenizer_train_chars = 120_000_000  # >= 1: text the tokenizer trains on: about the text 28M tokens come from
limit_mib = 64.0           # > 0: what a device call sends at most: the working tree and the carried paths
carry_text = False         # carry the text (xz) and prepare it on the GPU machine, not token files: more tokens a MiB
phases = "health,transfer"  # the call's tools/gpu_report.py phases: health,transfer (the first call), or health,grid
                           # (fine-tuning's rate and epochs at the transfer run's width: with --deadline_minutes=9 --timeout_s=600)
transfer_minutes = 3.5     # > 0: the call's pretraining budget (train.py's budget rule picks the shape and batch)
deadline_minutes = 8.0     # > 0: the call's own deadline: everything it started has ended by then
stop_grace_s = 15.0        # > 0: SIGTERM to SIGKILL for a script stopped at the deadline (train.py saves on it)
timeout_s = 540            # [1, 600]: the device call's limit, at least a minute above the deadline
# -----------------------------------------------------------------------------
TEXT_FILES = (".txt", *(".txt" + suffix for suffix in OPENERS))  # the corpora carry_text takes: prepare.py's text files
TEXT_CHUNK = 8_000_000     # carry_text's characters compressed at once, a core each (xz's streams concatenate)
GLUE_FOLDERS = ("RTE", "MRPC", "STS-B", "SST-2")  # what the transfer phase fine-tunes (stsb, mrpc, rte, sst2)
GLUE_FILES = ("train.tsv", "dev.tsv")
MIB = 2 ** 20
SPARE_BYTES = 2 * MIB      # kept free: the tree grows with the commits made before the call
OTHER_BYTES = 1 * MIB      # beside the token files: the tokenizer (about 0.4 MiB at 32k) and meta.json
VAL_SHARE = 0.02           # validation tokens per train token, at most (prepare.py holds out 1% of documents)
OVERSHOOT = 1_000_000      # train tokens prepare.py may write past max_tokens: it stops after a whole batch of
                           # documents, up to 4M characters
BESIDE_PRETRAINING = 4.5   # minutes the call needs besides pretraining (docs/gpu.md's estimates): health, start-up,
                           # fine-tuning, the margins


def git_files():
    """Paths (relative to the repository) of the files that travel: tracked, and untracked but not ignored."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"error: {ROOT} is not a git checkout (git ls-files failed): a device call sends a checkout")
    return sorted({p for p in listed.decode().split("\0") if p})


def bytes_under(paths, base):
    """Bytes of the files among `paths` (relative to base; a folder counts all it holds), links as links."""
    total = 0
    for path in paths:
        full = os.path.join(base, path)
        if os.path.isdir(full) and not os.path.islink(full):
            total += sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(full) for f in files)
        elif os.path.lexists(full):
            total += os.lstat(full).st_size
    return total


def tree_bytes():
    """What every call sends besides its carried paths: the files git lists, and shared/ if the checkout has one."""
    return bytes_under(git_files(), ROOT) + bytes_under(["shared"], ROOT)


def check_inputs(carry):
    """One-line errors for what the call could not use, before any work."""
    unknown = [p for p in phases.split(",") if p not in PHASES]
    if unknown:
        raise SystemExit(f"error: --phases={phases} names {', '.join(unknown)}: not among tools/gpu_report.py's "
                         f"{', '.join(PHASES)}")
    if deadline_minutes * 60 + 60 > timeout_s or timeout_s > 600:
        raise SystemExit(f"error: --timeout_s={timeout_s} must be at least a minute above --deadline_minutes="
                         f"{deadline_minutes:g} ({deadline_minutes * 60 + 60:.0f} s) and at most 600 (a call's limit)")
    relative = os.path.relpath(carry, ROOT)
    if relative.startswith(".."):
        raise SystemExit(f"error: --carry_dir={carry_dir} is outside the repository {ROOT}: a call carries its paths")
    if subprocess.run(["git", "check-ignore", "-q", relative], cwd=ROOT).returncode != 0:
        raise SystemExit(f"error: --carry_dir={carry_dir} is not ignored by git: name a folder under data/ (ignored), "
                         f"or it would travel twice")
    missing = [os.path.join(f, n) for f in GLUE_FOLDERS for n in GLUE_FILES
               if not os.path.isfile(os.path.join(glue_dir, f, n))]
    if not glue_dir or missing:
        raise SystemExit(f"error: --glue_dir={glue_dir!r} lacks {', '.join(missing) or 'everything'}: give a GLUE "
                         f"folder in the original layout")
    done = os.path.join(carry, "corpus.txt.xz" if carry_text else os.path.join("corpus", "meta.json"))
    other = os.path.join(carry, "corpus" if carry_text else "corpus.txt.xz")  # the other form would travel too
    if os.path.exists(other):
        raise SystemExit(f"error: {other} is there from a call {'without' if carry_text else 'with'} --carry_text: "
                         f"delete it (a call's 64 MiB carry one form of the corpus)")
    if carry_text and max_tokens:
        raise SystemExit("error: --max_tokens is for the token files; --carry_text=True carries as much text as fits")
    if carry_text and not os.path.isfile(done) and not corpus.endswith(TEXT_FILES):
        raise SystemExit(f"error: --carry_text=True takes a text file ({', '.join(TEXT_FILES)}), not --corpus={corpus}")
    if not os.path.isfile(done) and not (corpus and os.path.exists(corpus)):
        raise SystemExit(f"error: --corpus={corpus!r} is not there: give the text to prepare")
    if transfer_minutes + BESIDE_PRETRAINING > deadline_minutes:
        print(f"warning: --transfer_minutes={transfer_minutes:g} leaves under {BESIDE_PRETRAINING:g} minutes of "
              f"--deadline_minutes={deadline_minutes:g} for the rest (docs/gpu.md): fine-tuning may be cut")


def copy_glue(carry):
    """GLUE_FOLDERS' GLUE_FILES into <carry>/glue, each whole or not at all (a cut one would travel); returns their bytes."""
    for folder in GLUE_FOLDERS:
        for name in GLUE_FILES:
            write_atomically(os.path.join(carry, "glue", folder, name),
                             functools.partial(shutil.copyfile, os.path.join(glue_dir, folder, name)))
    return bytes_under(["glue"], carry)


def tokens_to_prepare(fixed_bytes):
    """max_tokens, or if 0 the most train tokens whose files (2 bytes a token, with validation and the
    tokenizer) fit limit_mib beside fixed_bytes; a one-line error where they do not fit."""
    room = limit_mib * MIB - fixed_bytes - SPARE_BYTES - OTHER_BYTES
    fit = int(room / (2 * (1 + VAL_SHARE))) - OVERSHOOT
    if fit < (max_tokens or 1_000_000):
        raise SystemExit(f"error: the working tree and GLUE take {fixed_bytes / MIB:.1f} MiB of {limit_mib:g}: no room "
                         f"for the corpus's {max_tokens or 1_000_000:,} train tokens (room for {max(fit, 0):,}; remove "
                         f"untracked files, or ask for fewer)")
    return max_tokens or fit


def prepare(data, tokens):
    """prepare.py's corpus into `data` (max tokens), unless it is prepared already."""
    if os.path.isfile(os.path.join(data, "meta.json")):
        print(f"{data} is prepared already: checking it")
        return
    args = [sys.executable, os.path.join(ROOT, "prepare.py"), f"--dataset={corpus}", f"--out_dir={data}",
            f"--vocab_size={vocab_size}", f"--seq_len={seq_len}", f"--max_tokens={tokens}",
            f"--tokenizer_train_chars={tokenizer_train_chars}"]
    print("$ " + " ".join(args[1:]), flush=True)
    if subprocess.run(args, cwd=ROOT).returncode != 0:
        raise SystemExit(f"error: prepare.py failed (above); fix it and run this again (delete {data} to start over)")


def carry_corpus_text(path, room):
    """`path`: the corpus's text from its start, in xz streams of TEXT_CHUNK characters compressed on every core, as
    many as fit `room` bytes; one there already is kept. Returns its characters and bytes."""
    if os.path.isfile(path):
        print(f"{path} is there already: checking it")
        try:
            with lzma.open(path, "rt", encoding="utf-8") as f:
                chars = sum(map(len, iter(lambda: f.read(TEXT_CHUNK), "")))
        except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: {path} is damaged ({e}): delete it and run this again")
        return chars, os.path.getsize(path)
    for stale in glob.glob(glob.escape(path) + ".*.tmp"):  # a killed run's (SIGKILL): it would travel with the call
        os.remove(stale)
    counts = [0, 0]  # characters, bytes
    write_atomically(path, lambda tmp: compress_text(tmp, room, counts))  # whole, or not there: a rerun keeps only a finished file
    return tuple(counts)


def read_chunks(source, n):
    """Up to n chunks of TEXT_CHUNK characters of the corpus; a damaged one (a cut .gz) is one line that says so."""
    try:
        return [t for t in (source.read(TEXT_CHUNK) for _ in range(n)) if t]
    except (OSError, EOFError, ValueError) as e:  # (gzip's cut file: EOFError; bz2's garbled one: OSError)
        raise SystemExit(f"error: cannot read --corpus={corpus}: {e}: give a whole text file")


def compress_text(path, room, counts):
    """carry_corpus_text's writing at `path`: counts gets the characters and bytes written."""
    full, cores = False, min(len(os.sched_getaffinity(0)), 8)
    filters = [dict(id=lzma.FILTER_LZMA2, preset=9, dict_size=2 * TEXT_CHUNK)]  # a chunk's text (xz -9 would take 64 MiB)
    with OPENERS.get(os.path.splitext(corpus)[1], open)(corpus, "rt", encoding="utf-8", errors="replace") as source, \
            open(path, "wb") as out, ThreadPoolExecutor(cores) as pool:
        while not full:
            texts = read_chunks(source, cores)
            packed = pool.map(lambda text: lzma.compress(text.encode("utf-8"), filters=filters), texts)  # (frees the GIL)
            for text, data in zip(texts, packed):
                full = full or counts[1] + len(data) > room
                if not full:
                    out.write(data)
                    counts[0], counts[1] = counts[0] + len(text), counts[1] + len(data)
            full = full or not texts
    if not counts[1]:  # (a SystemExit: write_atomically removes the empty file and passes it on)
        raise SystemExit(f"error: no room for {TEXT_CHUNK:,} characters of the corpus beside the working tree and GLUE")


def check_data(data):
    """The prepared data as train.py will read it, at the vocabulary and sequence length asked for: its train tokens."""
    meta, train, _, _ = load_run_data(data)  # meta.json, the token files' sizes and ids, the tokenizer: one-line errors
    wrong = [f"{k} {meta[k]} (not {want})" for k, want in (("vocab_size", vocab_size), ("seq_len", seq_len))
             if meta[k] != want]
    if wrong:
        raise SystemExit(f"error: {data} has {', '.join(wrong)}: delete it and run this again")
    return train.size


def the_call(carry):
    """The device call: its command, carry and timeout_s."""
    where = os.path.relpath(carry, ROOT)
    data = (f"--corpus={where}/corpus.txt.xz --data_dir=data/gpu_prepared \"--prepare_args=--vocab_size={vocab_size} "
            f"--seq_len={seq_len} --tokenizer_train_chars={tokenizer_train_chars}\"") if carry_text else f"--data_dir={where}/corpus"
    command = (f"PYTHONUNBUFFERED=1 python3 tools/gpu_report.py --phases={phases} --device=cuda "
               f"{data} --glue_dir={where}/glue --transfer_minutes={transfer_minutes:g} "
               f"--deadline_minutes={deadline_minutes:g} --stop_grace_s={stop_grace_s:g} --copy_to=$OUT")
    return dict(command=command, carry=[where], timeout_s=timeout_s)


def main():
    carry = os.path.abspath(carry_dir)
    check_inputs(carry)
    tree = tree_bytes()
    glue = copy_glue(carry)
    if carry_text:
        chars, size = carry_corpus_text(os.path.join(carry, "corpus.txt.xz"), limit_mib * MIB - tree - glue - SPARE_BYTES)
        what = f"{chars / 1e6:,.1f}M characters of text in {size / MIB:.1f} MiB of xz, which the call prepares"
    else:
        prepare(os.path.join(carry, "corpus"), tokens_to_prepare(tree + glue))
        tokens = check_data(os.path.join(carry, "corpus"))
        what = f"{tokens / 1e6:.1f}M train tokens (vocabulary {vocab_size}, sequences of {seq_len})"
    total = tree + bytes_under([""], carry)
    if total > limit_mib * MIB:
        raise SystemExit(f"error: the working tree ({tree / MIB:.1f} MiB) and {carry_dir} ({(total - tree) / MIB:.1f} "
                         f"MiB) are {total / MIB:.1f} MiB, over a call's {limit_mib:g}: delete {carry_dir}/corpus and "
                         f"run this with a smaller --max_tokens")
    print(f"ready: {carry_dir} with the working tree is {total / MIB:.1f} MiB of {limit_mib:g}: {what}, GLUE's "
          f"{', '.join(GLUE_FOLDERS)}")
    print("the device call (the session's first; then give the machine back; docs/gpu.md, \"The first GPU session\"):")
    print(json.dumps(the_call(carry)))


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "a rerun keeps the prepared corpus that passes the checks")
