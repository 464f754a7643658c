"""End to end as a user runs it: prepare.py and train.py as scripts, on a tiny corpus."""
import gzip
import itertools
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

import prepare
from conftest import TINY_MODEL, assert_one_line_error, run_script
from cram.data import load_tokenizer, load_tokens
from cram.files import load_meta
from train import rows_at


def test_prepare_writes_token_files(prepared):
    meta = load_meta(prepared)
    assert meta["vocab_size"] == 384 and meta["dtype"] == "uint16" and meta["seq_len"] == 32
    assert meta["special_ids"] == {"[PAD]": 380, "[CLS]": 381, "[SEP]": 382, "[MASK]": 383}
    train, val = load_tokens(prepared, "train"), load_tokens(prepared, "val")
    assert train.shape == (meta["train_sequences"], 32) and len(val) > 0
    assert meta["train_tokens"] // 32 == meta["train_sequences"]  # only the last partial sequence is dropped
    assert (np.asarray(train) == 382).sum() > 100  # documents joined by [SEP]
    text = load_tokenizer(prepared).decode(np.asarray(train[:4]).ravel().tolist())
    assert "[SEP]" in text and " the " in text.lower()


def test_prepare_twice_does_not_redo_work(prepared, corpus_file):
    files = lambda: {p.name: p.stat().st_mtime_ns for p in prepared.iterdir() if p.name != ".lock"}  # noqa: E731
    before = files()
    proc = run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={prepared}", "--vocab_size=384",
                      "--seq_len=32", "--val_fraction=0.05")
    assert "already prepared" in proc.stdout
    assert before == files()
    assert not list(prepared.glob("*.tmp"))
    proc = run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={prepared}", "--vocab_size=600",
                      "--seq_len=32", "--val_fraction=0.05", check=False)
    assert_one_line_error(proc, "other settings", "vocab_size")


def test_prepare_reads_jsonl_and_parquet(tmp_path, corpus_file):
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = corpus_file.read_text().split("\n\n")
    # the .jsonl ends with an empty record, which --min_doc_chars=0 keeps as a document of no text
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs + [""])))
    pq.write_table(pa.table({"body": docs}), tmp_path / "docs.parquet")
    for name, n_docs, extra in (("docs.jsonl", len(docs) + 1, ["--min_doc_chars=0"]), ("docs.parquet", len(docs), [])):
        out = tmp_path / f"out_{name}"
        run_script("prepare.py", f"--dataset={tmp_path / name}", "--text_field=body", f"--out_dir={out}",
                   "--vocab_size=300", "--seq_len=32", *extra)
        assert load_meta(out)["documents"] == n_docs
    proc = run_script("prepare.py", f"--dataset={tmp_path / 'docs.jsonl'}", f"--out_dir={tmp_path / 'x'}",
                      "--vocab_size=300", check=False)
    assert_one_line_error(proc, "no 'text' field", "--text_field")
    (tmp_path / "numbers.jsonl").write_text("".join(json.dumps({"text": i}) + "\n" for i in range(50)))
    proc = run_script("prepare.py", f"--dataset={tmp_path / 'numbers.jsonl'}", f"--out_dir={tmp_path / 'n'}",
                      "--vocab_size=300", check=False)
    assert_one_line_error(proc, "field 'text' holds int, not text")


def write_records(path, records):
    """A .jsonl (or .jsonl.gz) corpus with a blank line after each record: its line numbers are not the loader's rows."""
    text = "".join(f"{r}\n\n" for r in records).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)


def test_a_bad_record_is_said_by_its_line_with_the_fix_that_works(tmp_path, corpus_file):
    """Issue 93. A malformed .jsonl record was said by the loader's row ("row 368" for line 715), a record whose text is
    a number with advice to set --text_field=, which was not the fix. Named: each is said by the file's line, with a
    fix that, followed, works (the number written as text); unnamed: a list for the text, the same file gzipped."""
    docs = corpus_file.read_text().split("\n\n")
    records = [json.dumps({"text": d}) for d in docs]
    for name, bad, said in (("c.jsonl", '{"text": 42}', "field 'text' holds int, not text; make it text (in JSON a string)"),
                            ("c.jsonl", '{"text": ["a"]}', "field 'text' holds list, not text; make it text (in JSON a string)"),
                            ("c.jsonl", '{"text": "cut short', "is not a JSON line: mend or remove it"),
                            ("c.jsonl.gz", '{"text": "cut short', "is not a JSON line: mend or remove it")):
        write_records(tmp_path / name, records[:300] + [bad] + records[300:])
        proc = run_script("prepare.py", f"--dataset={tmp_path / name}", f"--out_dir={tmp_path / 'out' / name}",
                          "--vocab_size=300", "--seq_len=32", check=False)
        assert_one_line_error(proc, f"{tmp_path / name}:601", said)
    write_records(tmp_path / "c.jsonl", records[:300] + [json.dumps({"text": "42"})] + records[300:])  # the advice followed
    run_script("prepare.py", f"--dataset={tmp_path / 'c.jsonl'}", f"--out_dir={tmp_path / 'out' / 'c.jsonl'}",
               "--vocab_size=300", "--seq_len=32")
    assert load_meta(tmp_path / "out" / "c.jsonl")["documents"] == len(docs) + 1


def test_a_failed_preparation_never_refuses_its_correction(tmp_path, corpus_file):
    """Issue 93. A failed attempt's advice, followed in the same --out_dir, was refused ("prepared with other settings"):
    settings.json was written before the work. Named: records whose text is in `content` (--text_field=, also after
    --text_field=id, whose line names the column); unnamed: "no document was held out: raise --val_fraction" once a
    progress record was written (an encoding that cannot finish binds no setting)."""
    docs = corpus_file.read_text().split("\n\n")
    path, out = tmp_path / "corpus.jsonl", tmp_path / "out"
    prepare_ = ["prepare.py", f"--dataset={path}", f"--out_dir={out}", "--vocab_size=300", "--seq_len=32"]
    write_records(path, (json.dumps({"id": i, "content": d}) for i, d in enumerate(docs)))
    assert_one_line_error(run_script(*prepare_, check=False), "no 'text' field", "set --text_field=")
    assert_one_line_error(run_script(*prepare_, "--text_field=id", check=False),
                          f"{path}:1: field 'id' holds int, not text; set --text_field= to its column of text (content)")
    run_script(*prepare_, "--text_field=content")
    assert load_meta(out)["settings"]["text_field"] == "content"
    shutil.rmtree(out)
    write_records(path, (json.dumps({"text": d}) for d in docs))
    proc = run_script(*prepare_, "--val_fraction=0.001", "--progress_minutes=0", check=False)
    assert_one_line_error(proc, "no document was held out", "raise --val_fraction")
    run_script(*prepare_, "--val_fraction=0.05", "--progress_minutes=0")
    assert load_meta(out)["settings"]["val_fraction"] == 0.05


def test_a_corpus_folder_is_read_whole_or_its_other_files_are_named(tmp_path, corpus_file):
    """A folder of .txt, .txt.bz2 and .txt.xz files (as archives come) gives the same documents as the same
    texts uncompressed; a file of another kind in it (a .pdf, a .md) is named in a line, not left out silently."""
    import bz2
    import lzma
    docs = corpus_file.read_text().split("\n\n")
    parts = ["\n\n".join(docs[i::3]) + "\n" for i in range(3)]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    for i, text in enumerate(parts):
        (plain / f"part{i}.txt").write_text(text)
    (packed / "part0.txt").write_text(parts[0])
    (packed / "part1.txt.bz2").write_bytes(bz2.compress(parts[1].encode()))
    (packed / "part2.txt.xz").write_bytes(lzma.compress(parts[2].encode()))
    (packed / "notes.md").write_text("# not a corpus file")
    (packed / "scan.pdf").write_bytes(b"%PDF-1.4")
    common = ["--vocab_size=300", "--seq_len=32"]
    run_script("prepare.py", f"--dataset={plain}", f"--out_dir={tmp_path / 'a'}", *common)
    out = run_script("prepare.py", f"--dataset={packed}", f"--out_dir={tmp_path / 'b'}", *common).stdout
    assert f"reading 3 files of {packed}, not 2 of other types: notes.md, scan.pdf" in out
    a, b = load_meta(tmp_path / "a"), load_meta(tmp_path / "b")
    assert a["documents"] == b["documents"] == len(docs) and a["train_sequences"] == b["train_sequences"]
    assert (tmp_path / "a" / "train.bin").read_bytes() == (tmp_path / "b" / "train.bin").read_bytes()


def test_prepare_bad_sources(tmp_path):
    assert_one_line_error(run_script("prepare.py", "--dataset=HuggingFaceFW/fineweb-edu", check=False),
                   "cannot be reached", "--dataset=pydocs")
    assert_one_line_error(run_script("prepare.py", f"--dataset={tmp_path / 'missing.txt'}", check=False), "not found")
    assert_one_line_error(run_script("prepare.py", "--vocab_sise=100", check=False), "unknown config key 'vocab_sise'")
    # too little text for one sequence in each split: nothing that could pass for prepared data is left
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("The cat saw the river.\n\nA dog liked the sea.\n")
    out = tmp_path / "tiny"
    assert_one_line_error(run_script("prepare.py", f"--dataset={tiny}", f"--out_dir={out}", "--vocab_size=300",
                                     "--seq_len=32", check=False), "too little text for one 32-token sequence")
    assert not {"train.bin", "val.bin", "meta.json"} & {p.name for p in out.iterdir()}


def test_embedded_corpus_is_deterministic():
    first = list(itertools.islice(prepare.pydocs_documents(), 150))
    assert first == list(itertools.islice(prepare.pydocs_documents(), 150))
    assert sum(map(len, first)) > 200_000 and "function" in " ".join(first)


def final_line(stdout):
    match = re.search(r"final: step (\d+) \| val loss ([\d.]+) \(at init ([\d.]+)\)", stdout)
    assert match, stdout
    return int(match.group(1)), float(match.group(2)), float(match.group(3))


def test_train_learns_checkpoints_and_resumes(prepared, tmp_path):
    out = tmp_path / "run"
    common = ["train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL, "--eval_interval_minutes=0.1"]
    proc = run_script(*common, "--budget_hours=0.006")
    steps, loss, init_loss = final_line(proc.stdout)
    assert loss < 0.6 * init_loss, proc.stdout
    assert re.search(r"step \d+ \| loss [\d.]+ \| lr [\d.e+-]+ \| batch \d+ \| [\d,]+ tok/s", proc.stdout)
    n_val = json.load(open(prepared / "meta.json"))["val_sequences"]  # 60: under TINY_MODEL's 64, so each evaluation says so
    assert (f"| on all {n_val} sequences\n" in proc.stdout) == (n_val < 64), proc.stdout

    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == steps and ckpt["final"] and 0.006 * 3600 <= ckpt["elapsed"] < 0.006 * 3600 + 5
    assert ckpt["tokenizer"] == (prepared / "tokenizer.tiktoken").read_text()
    # what the model learned, in words: a masked word of the validation text and its top guesses
    fill_ins = re.findall(r"^fill in: \.\.\..* ____ ?.*\.\.\. -> ('.*' [\d.]+, ){2}'.*' [\d.]+ \(true: '.*'\)$",
                          proc.stdout, re.M)
    assert len(fill_ins) == 3, proc.stdout
    # every log and evaluation line is in metrics.jsonl
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [m for m in metrics if m["kind"] == "train"]
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert len(logged) == len(re.findall(r"^step \d+ \|", proc.stdout, re.M)) > 0
    assert len(evals) == len(re.findall(r"^eval ", proc.stdout, re.M)) >= 2
    assert evals[0]["step"] == 0 and evals[-1]["step"] == steps and evals[-1]["val_loss"] == pytest.approx(loss, abs=1e-4)
    assert {"elapsed", "tokens", "loss", "lr", "batch", "tokens_per_s", "mfu"} <= logged[0].keys()
    assert {m["mask_rate"] for m in logged} == {0.25}  # the rate each logged step trained at (the default, throughout)
    before = (out / "metrics.jsonl").read_text()

    # a fresh run must not overwrite the checkpoint
    assert_one_line_error(run_script(*common, "--budget_hours=0.006", check=False), "--resume=True")
    # resuming with a longer budget continues the step count, the clock and the schedule
    proc = run_script(*common, "--budget_hours=0.008", "--resume=True")
    assert f"resuming {out / 'ckpt.pt'} at step {steps}" in proc.stdout
    resumed_steps, resumed_loss, resumed_init = final_line(proc.stdout)
    assert resumed_steps > steps and resumed_init == init_loss and resumed_loss < 0.6 * init_loss
    first_log = re.search(r"step (\d+) \| loss [\d.]+ \| lr ([\d.e+-]+) \|", proc.stdout)
    assert int(first_log.group(1)) > steps
    # at 0.006/0.008 = 75% of the new budget the triangle is at its peak, then falls
    assert float(first_log.group(2)) > 0.8 * 3e-3
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == resumed_steps and ckpt["elapsed"] >= 0.008 * 3600
    after = (out / "metrics.jsonl").read_text()
    assert after.startswith(before) and json.loads(after.splitlines()[-1])["step"] == resumed_steps  # appended

    assert_one_line_error(run_script(*common, "--resume=True", "--n_layers=3", check=False), "differs", "n_layers")


def test_train_bad_input(prepared, tmp_path):
    assert_one_line_error(run_script("train.py", f"--data_dir={tmp_path / 'nothing'}", check=False), "prepare.py")
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert_one_line_error(run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", "--resume=True",
                              *TINY_MODEL, check=False), "not a readable checkpoint")
    assert_one_line_error(run_script("train.py", f"--data_dir={prepared}", "--lr_schedule=no_such_schedule", "--max_steps=1", f"--out_dir={tmp_path}/x",
                              check=False), "lr_schedule must be one of")
    assert_one_line_error(run_script("train.py", f"--data_dir={prepared}", "--data_order=no_such_order", "--max_steps=1", f"--out_dir={tmp_path}/y",
                              check=False), "data_order must be one of")


def test_torchrun_two_processes(prepared, tmp_path):
    """Multi-GPU code path (DDP, rank-0 clock, gradient sync) on two CPU processes with gloo."""
    import os
    import subprocess
    import sys
    from conftest import ROOT
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL,
                           "--max_steps=6", "--batch_size=64", "--batch_ramp_start=32"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device: cpu, float32 x2" in proc.stdout and "batch 32 |" in proc.stdout  # the ramp's start, 16 a rank
    assert final_line(proc.stdout)[0] == 6
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["step"] == 6


def test_prepare_failure_leaves_no_partial_files_and_reuses_the_tokenizer(tmp_path, corpus_file):
    import gzip
    whole = gzip.compress(corpus_file.read_bytes())
    data = tmp_path / "books.txt.gz"
    data.write_bytes(whole[: len(whole) // 2])  # a truncated download
    out = tmp_path / "out"
    args = ["prepare.py", f"--dataset={data}", f"--out_dir={out}", "--vocab_size=300", "--seq_len=32",
            "--tokenizer_train_chars=20000"]  # the tokenizer reads only the intact start
    assert_one_line_error(run_script(*args, check=False), "cannot read", "books.txt.gz")
    data.write_bytes(whole[:10] + b"\xff" * 64)  # a damaged deflate stream (zlib's error, not gzip's)
    assert_one_line_error(run_script(*args, check=False), "cannot read", "invalid block type")
    # only work in progress is left: no token file or meta.json that could pass for finished
    assert not {"train.bin", "val.bin", "meta.json"} & {p.name for p in out.iterdir()}
    data.write_bytes(whole)
    proc = run_script(*args)
    assert "reusing" in proc.stdout and load_meta(out)["documents"] == len(corpus_file.read_text().split("\n\n"))
    assert not list(out.glob("*.tmp")) and not (out / "progress.json").exists()


def test_prepare_killed_midway_resumes_to_identical_files(tmp_path):
    """SIGKILL at any moment, then the same command: the token files are byte for byte those of
    an uninterrupted run, and only the work since the last progress record is redone."""
    import os
    import subprocess
    import sys
    import time
    from conftest import ROOT, synthetic_corpus
    docs = []
    for i, doc in enumerate(synthetic_corpus(n_docs=25000, seed=1)):
        docs.append(doc)
        if i % 5 == 4:  # duplicates all along, so the de-duplication state must survive the kill
            docs.append(docs[-4])
    corpus = tmp_path / "big.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    args = ["prepare.py", f"--dataset={corpus}", "--vocab_size=300", "--seq_len=32", "--val_fraction=0.05",
            "--tokenizer_train_chars=50000", "--progress_minutes=0", "--workers=1"]
    run_script(*args, f"--out_dir={tmp_path / 'whole'}")
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, *args, f"--out_dir={out}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.time() + 120
        while not (out / "progress.json").exists() or json.loads((out / "progress.json").read_text())["read"] < 5000:
            assert time.time() < deadline and proc.poll() is None, "the preparation ended before it could be killed"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    assert not (out / "meta.json").exists()
    resumed = run_script(*args, f"--out_dir={out}").stdout
    assert "resuming an interrupted preparation after" in resumed
    for name in ("tokenizer.tiktoken", "train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    counts = ("documents", "short_documents", "duplicate_documents", "dropped_documents", "train_tokens", "val_tokens",
              "train_sequences", "val_sequences")
    assert [load_meta(out)[k] for k in counts] == [load_meta(tmp_path / "whole")[k] for k in counts]
    assert load_meta(out)["duplicate_documents"] == 5000
    assert not (out / "progress.json").exists() and not list(out.glob("*.tmp"))


def test_prepare_cleaning_counts(tmp_path, corpus_file):
    """Exact duplicates (up to case and spacing) and documents that compress far worse than the
    corpus' median are dropped, and meta.json counts both."""
    import random
    docs = corpus_file.read_text().strip().split("\n\n")
    rng = random.Random(0)
    garbage = ["".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(200)) for _ in range(3)]
    repeats = [docs[i].lower().replace(". ", ".  ") for i in (5, 50, 100)]
    data = tmp_path / "dirty.txt"
    data.write_text("\n\n".join(docs[:200] + garbage + repeats + docs[200:]) + "\n")
    out = tmp_path / "out"
    run_script("prepare.py", f"--dataset={data}", f"--out_dir={out}", "--vocab_size=384", "--seq_len=32")
    meta = load_meta(out)
    assert meta["duplicate_documents"] == 3 and meta["dropped_documents"] == 3
    assert 0.1 < meta["median_tokens_per_char"] < 1 and meta["max_tokens_per_char"] == pytest.approx(
        1.5 * meta["median_tokens_per_char"], abs=1e-3)
    tokens = np.concatenate([np.asarray(load_tokens(out, split)).ravel() for split in ("train", "val")])
    assert meta["train_tokens"] + meta["val_tokens"] - len(tokens) < 32 * 2  # only the partial sequences
    run_script("prepare.py", f"--dataset={data}", f"--out_dir={tmp_path / 'raw'}", "--vocab_size=384",
               "--seq_len=32", "--dedup=False", "--max_compression=0")
    raw = load_meta(tmp_path / "raw")
    assert raw["duplicate_documents"] == raw["dropped_documents"] == 0
    removed = meta["dropped_documents"] + meta["duplicate_documents"]  # each kept document also carries a [SEP]
    assert raw["train_tokens"] + raw["val_tokens"] == (meta["train_tokens"] + meta["val_tokens"] + meta["dropped_tokens"]
                                                       + meta["duplicate_tokens"] + removed)


def test_curriculum_tool_sorts_blocks_by_sentence_ends(tmp_path, corpus_file, monkeypatch):
    """tools/curriculum.py: the same sequences, each block of `block` sorted by sentence-ending tokens,
    most first; a kill while a block is written loses nothing and the next run finishes the pass; and
    train.py's data_order='file' reads that order in the first epoch."""
    import shutil
    import curriculum  # tools/curriculum.py
    plain_dir, sorted_dir = tmp_path / "plain", tmp_path / "sorted"
    run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={plain_dir}", "--vocab_size=300", "--seq_len=32")
    shutil.copytree(plain_dir, sorted_dir)
    run_script("tools/curriculum.py", f"--data_dir={sorted_dir}", "--block=50")
    meta = load_meta(sorted_dir)
    plain, rows = np.asarray(load_tokens(plain_dir, "train")), np.asarray(load_tokens(sorted_dir, "train"))
    enc = load_tokenizer(sorted_dir)
    ends = curriculum.sentence_end_ids(enc)
    assert ends[enc.encode_ordinary(" river.")[-1]] and not ends[meta["special_ids"]["[SEP]"]]
    assert meta["curriculum_blocks"] == -(-len(rows) // 50) >= 3 and meta["curriculum_block"] == 50
    assert meta["sentence_end_token_ids"] == ends.sum()
    assert {k: v for k, v in meta.items() if not k.startswith(("curriculum", "sentence_end"))} == load_meta(plain_dir)
    for start in range(0, len(rows), 50):
        counts = ends[rows[start:start + 50]].sum(axis=1)
        assert (np.diff(counts) <= 0).all() and counts[0] > counts[-1]
        block = plain[start:start + 50]  # the same rows, ties in the file's order
        assert (rows[start:start + 50] == block[np.argsort(-ends[block].sum(axis=1), kind="stable")]).all()
    assert not list(sorted_dir.glob("*.tmp"))
    assert "already sorted in blocks of 50" in run_script("tools/curriculum.py", f"--data_dir={sorted_dir}",
                                                          "--block=50").stdout
    for args, error in (("--block=64", "already sorted in blocks of 50"), ("--block=0", "block must be >= 1")):
        assert_one_line_error(run_script("tools/curriculum.py", f"--data_dir={sorted_dir}", args, check=False), error)
    assert_one_line_error(run_script("tools/curriculum.py", f"--data_dir={tmp_path}", check=False), "run `python prepare.py`")

    # killed while block 2 was being written: train.bin is untouched, the copy holds 2 blocks and a cut one
    killed = tmp_path / "killed"
    shutil.copytree(plain_dir, killed)

    def killed_at_block_2(rows, ends):
        if rows.shape == plain[100:150].shape and (rows == plain[100:150]).all():
            raise KeyboardInterrupt
        return block_sort(rows, ends)
    block_sort = curriculum.sort_block
    monkeypatch.setattr(curriculum, "sort_block", killed_at_block_2)
    monkeypatch.setattr(curriculum, "data_dir", str(killed))
    monkeypatch.setattr(curriculum, "block", 50)
    with pytest.raises(KeyboardInterrupt):
        curriculum.main()
    copy = killed / "train.bin.curriculum-50.tmp"
    with open(copy, "ab") as f:
        f.write(bytes(25 * 32 * 2))
    assert (killed / "train.bin").read_bytes() == plain.tobytes() and load_meta(killed) == load_meta(plain_dir)
    proc = run_script("tools/curriculum.py", f"--data_dir={killed}", "--block=50")
    assert "continuing the sorted copy at block 2 of" in proc.stdout  # from the last whole block (redone)
    assert (killed / "train.bin").read_bytes() == rows.tobytes() and load_meta(killed) == meta
    assert not copy.exists()
    # killed after meta.json recorded the pass, before the rename: the next run renames the copy
    shutil.copy(plain_dir / "train.bin", killed / "train.bin")
    shutil.copy(sorted_dir / "train.bin", copy)
    assert "already sorted" in run_script("tools/curriculum.py", f"--data_dir={killed}", "--block=50").stdout
    assert (killed / "train.bin").read_bytes() == rows.tobytes() and not copy.exists()

    n = len(rows)
    first = rows_at(0, n + 10, n, seed=0, order="file")
    assert (first[:n] == np.arange(n)).all() and (rows_at(n - 5, 15, n, seed=0, order="file") == first[n - 5:]).all()
    assert (first[n:] != np.arange(10)).any()  # the second epoch is shuffled
    assert not (rows_at(0, n, n, seed=0) == np.arange(n)).all()


def test_prepare_resumes_a_stream_from_its_state(tmp_path, monkeypatch):
    """A .jsonl file or hub dataset (both `datasets` streams) resumes from the state_dict() in the
    progress record, not by reading the stream again from its start; the files are the same."""
    from conftest import synthetic_corpus
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in synthetic_corpus(n_docs=3000, seed=2)))
    stream = prepare.record_file(str(data))
    first = list(itertools.islice(stream(), 1000))
    assert next(stream(stream.state())) == next(itertools.islice(stream(), 1000, None)) != first[-1]

    for key, value in dict(dataset=str(data), vocab_size=300, seq_len=32, tokenizer_train_chars=50000,
                           progress_minutes=0, workers=1).items():
        monkeypatch.setattr(prepare, key, value)
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "whole"))
    prepare.main()
    write_json, records, states = prepare.write_json, [], []

    def killed_at_the_fourth_record(path, obj):
        if path.endswith(prepare.PROGRESS_FILE):
            records.append(obj)
            if len(records) == 4:
                raise KeyboardInterrupt
        write_json(path, obj)
    monkeypatch.setattr(prepare, "write_json", killed_at_the_fourth_record)
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "killed"))
    with pytest.raises(KeyboardInterrupt):
        prepare.main()
    assert records[2]["read"] == 768 and records[2]["source_state"]
    monkeypatch.setattr(prepare, "write_json", write_json)
    call = prepare.RowStream.__call__
    monkeypatch.setattr(prepare.RowStream, "__call__", lambda self, state=None: states.append(state) or call(self, state))
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "killed"))
    prepare.main()
    assert states[-1] == records[2]["source_state"]  # the encoding pass continued the stream from its state
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert load_meta(tmp_path / "killed")["documents"] == load_meta(tmp_path / "whole")["documents"] == 3000

    # max_tokens stops after the first batch of 256 documents that reaches it: a prefix of the whole
    monkeypatch.setattr(prepare, "max_tokens", 20000)
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "capped"))
    prepare.main()
    capped = load_meta(tmp_path / "capped")
    assert capped["documents"] % 256 == 0 and 20000 <= capped["train_tokens"] < 20000 + 256 * 200
    assert (tmp_path / "whole" / "train.bin").read_bytes().startswith((tmp_path / "capped" / "train.bin").read_bytes())
    # also where the batch that reaches it is one of the last two, still in flight when the source ends
    whole = load_meta(tmp_path / "whole")
    monkeypatch.setattr(prepare, "max_tokens", int(0.9 * whole["train_tokens"]))
    monkeypatch.setattr(prepare, "progress_minutes", 60)  # no record: a batch stays in flight while the next is read
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "capped_late"))
    prepare.main()
    late = load_meta(tmp_path / "capped_late")
    assert late["documents"] % 256 == 0 and 0.9 * whole["train_tokens"] <= late["train_tokens"] < whole["train_tokens"]


def test_progress_in_a_log_file_is_plain_lines(corpus_file, pretrained, tmp_path, capsys):
    """Output that is not a terminal (nohup ... > log) gets plain progress lines, never tqdm's
    carriage returns, which pile up there as one endless line."""
    from cram import process
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures", "glue")
    for args in (["prepare.py", f"--dataset={corpus_file}", f"--out_dir={tmp_path / 'data'}", "--vocab_size=300",
                  "--seq_len=32"],
                 ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={fixtures}", "--tasks=rte",
                  "--epochs=1", f"--out_json={tmp_path / 'glue.json'}"]):
        proc = run_script(*args)
        assert "\r" not in proc.stdout + proc.stderr
    bar = process.LogProgress(total=4, desc="rte seed 0", unit=" steps", initial=0, every=0)
    bar.set_postfix(loss="0.693")
    bar.update()
    line = capsys.readouterr().err
    assert line.startswith("rte seed 0: 1/4 steps (25%), ") and "min left, loss=0.693" in line and "\r" not in line


def test_the_laptop_path_goes_from_raw_text_to_a_glue_table_and_resumes(corpus_file, tmp_path):
    """tools/laptop.sh on tiny settings: prepare, train, fine-tune every task; stopped (SIGTERM to
    the whole process group) once RTE's seeds are scored, the same command finishes the rest and
    redoes nothing that finished: not the preparation, not the training, not RTE."""
    import os
    import shutil
    import signal
    import subprocess
    import time
    from conftest import ROOT
    glue = tmp_path / "glue"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "glue"), glue)
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", DATA_DIR=str(tmp_path / "data"), OUT_DIR=str(out),
               PREPARE_ARGS="--vocab_size=300 --seq_len=32 --tokenizer_train_chars=100000",
               TRAIN_ARGS=" ".join([*TINY_MODEL, "--max_steps=20", "--fill_in_examples=0"]),
               GLUE_ARGS="--epochs=1 --device=cpu")
    command = ["bash", "tools/laptop.sh", str(corpus_file), str(glue)]
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.time() + 300
    while True:
        try:
            if len(json.loads((out / "glue.json").read_text())["tasks"]["rte"]["seeds"]) == 3:
                break
        except (OSError, ValueError, KeyError):
            pass
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode != 0
    rte = json.loads((out / "glue.json").read_text())["tasks"]["rte"]
    ckpt = (out / "ckpt.pt").read_bytes()
    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "is already prepared" in rerun.stdout and "has spent this budget" in rerun.stdout
    assert "rte: done earlier" in rerun.stdout and (out / "ckpt.pt").read_bytes() == ckpt
    results = json.loads((out / "glue.json").read_text())
    assert results["tasks"]["rte"] == rte and sorted(results["tasks"]) == ["cola", "mrpc", "qnli", "rte", "sst2", "stsb", "wnli"]
    table = rerun.stdout.split("GLUE dev scores of")[1]
    assert "| sst2 | accuracy (1 seed, 1 epoch) |" in table and "| rte | accuracy (median of 3 seeds, 1 epoch) |" in table


def test_a_log_file_gets_each_line_as_it_is_printed(prepared, tmp_path):
    """stdout to a file is block-buffered by default: a run's lines would reach `nohup ... > log` in
    8 KB bursts. Every script's lines are flushed line by line: the first evaluation is in the log
    while the run still trains (PYTHONUNBUFFERED, which the tests' other runs set, is left out)."""
    import os
    import subprocess
    import sys
    import time
    from conftest import ROOT
    log_path = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}",
                                 *TINY_MODEL, "--budget_hours=1.0", "--log_interval=100000"], cwd=ROOT,
                                env=dict(env, OMP_NUM_THREADS="1"), stdout=log, stderr=subprocess.STDOUT)
    try:  # two short lines, then silence: block-buffered, they would wait for the end of the run
        deadline = time.time() + 60
        while "eval  step 0" not in log_path.read_text():
            assert proc.poll() is None and time.time() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()


def test_a_wall_clock_stepped_back_stops_no_progress_record_or_line(tmp_path, monkeypatch, capsys):
    """Durations are timed on the monotonic clock: with the wall clock running backwards (NTP stepping it, a VM
    restored), preparation still writes its progress records, and a log's progress lines still come."""
    import time
    from conftest import synthetic_corpus
    from cram import process
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(synthetic_corpus(n_docs=1000, seed=3)) + "\n")
    backwards = itertools.count(2e9, -1.0)
    monkeypatch.setattr(time, "time", lambda: next(backwards))
    for key, value in dict(dataset=str(corpus), vocab_size=300, seq_len=32, tokenizer_train_chars=50000,
                           progress_minutes=0, workers=1, out_dir=str(tmp_path / "data")).items():
        monkeypatch.setattr(prepare, key, value)
    records, write_json = [], prepare.write_json
    monkeypatch.setattr(prepare, "write_json", lambda path, obj: records.append(path) or write_json(path, obj))
    prepare.main()
    assert any(path.endswith(prepare.PROGRESS_FILE) for path in records)
    bar = process.LogProgress(4, "counting", "steps", 0, every=0.0)
    bar.update()
    assert "counting: 1/4" in capsys.readouterr().err
