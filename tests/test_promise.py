"""The one-line promise at every entry point, class by class: a bad file, a signal or a fault of
the machine gets one line ('error: ...', or the signal's 'stopped by ...'), a non-zero status, no
traceback, and every file that was there before is byte for byte as it was. Each class has one
mechanism (named in its banner) and a table of cases here."""
import fnmatch
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_MODEL, run_script, spawn, synthetic_corpus

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue")


def snapshot(*folders):
    """{path: bytes} of every file under the folders."""
    files = {}
    for folder in map(str, folders):
        for d, _, names in os.walk(folder):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    files[os.path.join(d, name)] = f.read()
    return files


def assert_kept(proc, before, status=1, first="error:", *fragments):
    """The promise: exit status, one last line on stderr starting with `first` (holding each
    fragment), no traceback, and every file of `before` unchanged."""
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])
    assert lines and lines[-1].startswith(first) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    for path, content in before.items():
        assert os.path.isfile(path), f"{path} is gone"
        with open(path, "rb") as f:
            assert f.read() == content, f"{path} changed"


def copy_run(pretrained, folder):
    """A run folder of the tiny pretrained checkpoint: ckpt.pt and metrics.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(pretrained, folder / "ckpt.pt")
    shutil.copy(pretrained.parent / "metrics.jsonl", folder / "metrics.jsonl")
    return folder


# ------------------------------------------------------------------ 1. preparation's memory does not follow the text's layout
def peak_rss_mib(*args):
    """Run a script in a child process; (its CompletedProcess, its peak resident memory in MiB)."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(p.returncode); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
             "sys.stderr.write(p.stdout + p.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    code, kib = proc.stdout.split()
    assert int(code) == 0, proc.stderr[-2000:]
    return proc, int(kib) / 1024


def test_a_corpus_without_blank_lines_prepares_in_flat_memory(tmp_path):
    """One paragraph per line and no blank line, a common layout, was read as one document: 1.1 GB
    for 10 MB. Documents are now cut at prepare.MAX_DOC_CHARS, so 10x the text costs about the same
    memory, and the held-out documents are spread over it."""
    text = "\n".join(synthetic_corpus(n_docs=40000, seed=3))  # ~12 MB
    peaks = {}
    for size in (1_200_000, 12_000_000):
        corpus = tmp_path / f"lines{size}.txt"
        corpus.write_text(text[:size])
        out = tmp_path / f"data{size}"
        _, peaks[size] = peak_rss_mib("prepare.py", f"--dataset={corpus}", f"--out_dir={out}", "--vocab_size=300",
                                      "--seq_len=32", "--val_fraction=0.5", "--tokenizer_train_chars=200000",
                                      "--workers=1")
        meta = json.loads((out / "meta.json").read_text())
        assert meta["val_sequences"] > 0 and meta["train_sequences"] > 0
    assert peaks[12_000_000] < peaks[1_200_000] + 150, peaks


# ------------------------------------------------------------------ 2. Ctrl-C and SIGTERM anywhere: process.guarded
def start(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return spawn([sys.executable, *map(str, args)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)


def stop_when(proc, ready, signum, timeout=240):
    """Send signum once ready(stdout so far) holds; returns the CompletedProcess-like result."""
    out, deadline = [], time.time() + timeout
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    while not ready("".join(out)):
        assert proc.poll() is None, f"ended before the signal: {''.join(out)[-1500:]}{proc.stderr.read()[-1500:]}"
        assert time.time() < deadline, "not ready in time"
        time.sleep(0.05)
    proc.send_signal(signum)
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), stderr)


def big_corpus(tmp_path, mib=24):
    corpus = tmp_path / "big.txt"
    docs = synthetic_corpus(n_docs=mib * 3400, seed=5)
    corpus.write_text("\n\n".join(docs))
    return corpus


def exists_with_bytes(path):
    return lambda out: os.path.exists(path) and os.path.getsize(path) > 0


SIGNALS = {  # case -> (arguments (tmp_path, prepared, pretrained), when to send the signal, what the stop line says)
    "train.py during the first evaluation": (
        lambda t, p, c: ["train.py", f"--data_dir={p}", f"--out_dir={t / 'run'}", *TINY_MODEL, "--n_layers=8",
                      "--d_model=512", "--n_heads=8", "--d_ffn=2048", "--eval_sequences=4096"],
        lambda t: (lambda out: "model:" in out), "keeps the last checkpoint"),
    "prepare.py training the tokenizer": (
        lambda t, p, c: ["prepare.py", f"--dataset={big_corpus(t)}", f"--out_dir={t / 'data'}", "--vocab_size=2048"],
        lambda t: (lambda out: "training a" in out), "run the same command to continue"),
    "prepare.py encoding": (
        lambda t, p, c: ["prepare.py", f"--dataset={big_corpus(t)}", f"--out_dir={t / 'data'}", "--vocab_size=300",
                      "--tokenizer_train_chars=100000", "--workers=1", "--progress_minutes=0"],
        lambda t: exists_with_bytes(t / "data" / "train.bin.tmp"), "up to its last progress record"),
    "finetune_glue.py": (
        lambda t, p, c: ["finetune_glue.py", f"--checkpoint={c}",
                      f"--glue_dir={FIXTURES}", "--tasks=rte,mrpc", "--seeds=20", "--device=cpu",
                      f"--out_json={t / 'glue.json'}"],
        lambda t: exists_with_bytes(t / "glue.json"), "run(s) finished so far are in"),
    "tools/compare.py": (
        lambda t, p, c: ["tools/compare.py", "--variants=crammed", f"--out_dir={t / 'compare'}", "--budget_minutes=5",
                      f"--train_args=--data_dir={p} {' '.join(TINY_MODEL)}"],
        lambda t: (lambda out: "training crammed" in out), "finished runs are kept"),
}


OTHER_SIGNALS = {signal.SIGTERM: "finetune_glue.py", signal.SIGHUP: "prepare.py encoding",
                 signal.SIGUSR1: "tools/compare.py"}  # each tried on one case: the mechanism is the same for all


@pytest.mark.parametrize("signum", [signal.SIGINT, *OTHER_SIGNALS], ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("case", SIGNALS)
def test_a_signal_anywhere_is_one_line_and_a_status(case, signum, prepared, pretrained, tmp_path):
    if signum != signal.SIGINT and OTHER_SIGNALS[signum] != case:
        pytest.skip("one signal per case keeps the suite short: the mechanism is the same for all")
    args, ready, fragment = SIGNALS[case]
    proc = stop_when(start(*args(tmp_path, prepared, pretrained)), ready(tmp_path), signum)
    assert_kept(proc, {}, 128 + signum, f"stopped by {signal.Signals(signum).name}", fragment)
    assert not (tmp_path / "run" / "ckpt.pt").exists()  # train.py: nothing trained, nothing saved


def test_a_signal_during_a_finished_run_s_last_evaluation_ends_at_once_and_keeps_its_save(prepared, tmp_path):
    """The loop is over and the finished run has saved: a stop during the final evaluation (a long one here) ends the
    process at once with its line and status, not silently with 0, and the checkpoint is the finished run's."""
    run = tmp_path / "run"
    args = ["train.py", f"--data_dir={prepared}", f"--out_dir={run}", *TINY_MODEL, "--n_layers=8", "--d_model=512",
            "--n_heads=8", "--d_ffn=2048", "--eval_sequences=4096", "--max_steps=1"]
    proc = stop_when(start(*args), exists_with_bytes(run / "ckpt.pt"), signal.SIGINT)
    assert_kept(proc, {}, 128 + signal.SIGINT, "stopped by SIGINT", "keeps the last checkpoint")
    checkpoint = torch.load(run / "ckpt.pt", map_location="cpu", weights_only=True)
    assert checkpoint["final"] and checkpoint["step"] == 1
    assert "final:" not in proc.stdout


def test_finetuning_stopped_between_tasks_continues_without_redoing_them(pretrained, tmp_path):
    """SIGTERM once RTE's seeds are in glue.json, then the same command: RTE is not fine-tuned again,
    the others are, and glue.json holds them all. (Three tasks after RTE: a signal that came after
    the process's very end would find Python's own handlers, restored at its exit.)"""
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}", "--tasks=rte,mrpc,stsb,cola",
            "--seeds=2", "--epochs=3", "--device=cpu", f"--out_json={tmp_path / 'glue.json'}"]

    def rte_done(out):
        try:
            return len(json.loads((tmp_path / "glue.json").read_text())["tasks"]["rte"]["seeds"]) == 2
        except (OSError, ValueError, KeyError):
            return False
    stopped = stop_when(start(*args), rte_done, signal.SIGTERM)
    assert stopped.returncode == 143
    rte = json.loads((tmp_path / "glue.json").read_text())["tasks"]["rte"]
    rerun = run_script(*args)
    assert "rte: done earlier" in rerun.stdout and re.search(r"on (mrpc, )?stsb, cola with", rerun.stdout)
    results = json.loads((tmp_path / "glue.json").read_text())
    assert results["tasks"]["rte"] == rte and all(results["tasks"][t]["seeds"] == [0, 1] for t in ("mrpc", "stsb", "cola"))
    assert all(f"| {t} |" in rerun.stdout for t in ("rte", "mrpc", "stsb", "cola"))


# ------------------------------------------------------------------ 3. every file cram reads is checked first
def damaged_checkpoint(pretrained, path, damage):
    ckpt = torch.load(pretrained)
    damage(ckpt)
    torch.save(ckpt, path)
    return path


CHECKPOINTS = {  # what is done to a checkpoint -> what the error says
    "weights of another shape": (lambda c: c["model_args"].update(n_layers=3), "do not fit its model_args"),
    "an unknown model_args field": (lambda c: c["model_args"].update(no_such_field=2), "unknown model_args field(s) no_such_field"),
    "a zero field": (lambda c: c["model_args"].update(d_model=0), "d_model must be >= 1"),
    "a field of the wrong type": (lambda c: c["model_args"].update(glu="yes"), "glu='yes' is not bool"),
    "no special_ids": (lambda c: c["meta"].pop("special_ids"), "no special_ids"),
    "a garbage tokenizer": (lambda c: c.update(tokenizer="not base64 at all\n"), "ckpt.pt's tokenizer is damaged"),
    "another vocabulary's tokenizer": (lambda c: c.update(tokenizer="\n".join(c["tokenizer"].splitlines()[:300])),
                                       "mixes two vocabularies"),
}


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_a_damaged_checkpoint_is_named_by_every_reader(case, pretrained, prepared, tmp_path):
    damage, fragment = CHECKPOINTS[case]
    run = tmp_path / "run"
    run.mkdir()
    damaged_checkpoint(pretrained, run / "ckpt.pt", damage)
    before = snapshot(tmp_path)
    for args in (["tools/export.py", f"--checkpoint={run / 'ckpt.pt'}"],
                 ["finetune_glue.py", f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte"],
                 ["train.py", f"--data_dir={prepared}", f"--out_dir={run}", *TINY_MODEL, "--resume=True"]):
        assert_kept(run_script(*args, check=False), before, 1, "error:", "ckpt.pt", fragment)
        after = snapshot(tmp_path)
        after.pop(str(run / ".lock"), None)  # train.py's lock on its out_dir
        assert after.keys() == before.keys()  # nothing else written
    assert not (run / "hf").exists()  # the export wrote no broken folder


def rewrite_meta(folder, **fields):
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(fields)
    (folder / "meta.json").write_text(json.dumps(meta))


def put_big_id(folder):
    tokens = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r+")
    tokens[77] = 60000


PREPARED = {  # what is done to a prepared folder -> what the error says
    "a vocabulary the tokenizer does not have": (lambda f: rewrite_meta(f, vocab_size=404, n_regular=400,
                                                 special_ids={"[PAD]": 400, "[CLS]": 401, "[SEP]": 402, "[MASK]": 403}),
                                                 "holds 380 tokens but meta.json says 400"),
    "token ids past the vocabulary": (put_big_id, "token ids at or above the vocabulary size 384"),
    "an unknown dtype": (lambda f: rewrite_meta(f, dtype="float64"), "dtype 'float64'"),
    "an empty train.bin": (lambda f: (rewrite_meta(f, train_sequences=0), (f / "train.bin").write_bytes(b"")),
                           "no sequences"),
    "no tokenizer file": (lambda f: (f / "tokenizer.tiktoken").unlink(), "cannot read the tokenizer"),
    "meta.json nested past the parser's depth": (
        lambda f: (f / "meta.json").write_text('{"source": ' + "[" * 100000 + "]" * 100000 + "}"),
        "meta.json is damaged (RecursionError"),
}


@pytest.mark.parametrize("case", PREPARED)
def test_damaged_prepared_data_is_named_before_training(case, prepared, tmp_path):
    damage, fragment = PREPARED[case]
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    damage(data)
    before = snapshot(data)
    proc = run_script("train.py", f"--data_dir={data}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL, check=False)
    assert_kept(proc, before, 1, "error:", fragment)
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "ckpt.pt").exists()


def test_a_metrics_line_cut_by_a_kill_is_tolerated_and_ended_by_the_resume(pretrained, prepared, tmp_path):
    run = copy_run(pretrained, tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "eval", "step": 61, "val_lo')  # a kill mid-line
    run_script("tools/compare.py", f"--runs={run}", f"--png={tmp_path / 'plot.png'}")
    run_script("tools/export.py", f"--checkpoint={run / 'ckpt.pt'}")
    run_script("train.py", f"--data_dir={prepared}", f"--out_dir={run}", *TINY_MODEL, "--resume=True",
               "--max_steps=65", "--fill_in_examples=0")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and json.loads(lines[-1])["step"] == 65  # the cut line is gone


def test_a_fresh_metrics_log_starts_at_its_first_line(tmp_path, monkeypatch):
    """A fresh run that fails before its first line leaves an earlier metrics.jsonl as it was; each line also goes to
    W&B's run when it is on; a resumed run appends."""
    from cram.files import MetricsLog
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(log=lambda fields, step: calls.append(step)))
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "eval", "step": 7}\n')  # an earlier run's
    log = MetricsLog(str(path), True, wandb=True)
    assert path.read_text() == '{"kind": "eval", "step": 7}\n' and calls == []
    log.write(dict(kind="eval", step=0))
    log.write(dict(kind="train", step=10))
    assert calls == [0, 10]
    MetricsLog(str(path), False).write(dict(kind="train", step=20))  # a resumed run appends
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 10, 20]


def test_w_and_b_s_run_gets_the_settled_settings(prepared, tmp_path):
    """--wandb_log=True: W&B's run starts once the settings are settled (the micro-batch decided, not 0), with every
    setting as its config, and each metrics line goes to it."""
    fake = tmp_path / "fake" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os\n"
        "def init(**kw): open(os.environ['WANDB_CALLS'], 'a').write(json.dumps(['init', kw['config']['micro_batch']]) + '\\n')\n"
        "def log(fields, step): open(os.environ['WANDB_CALLS'], 'a').write(json.dumps(['log', step]) + '\\n')\n")
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, PYTHONPATH=str(fake.parent), WANDB_CALLS=str(calls), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}",
                           *TINY_MODEL, "--max_steps=20", "--fill_in_examples=0", "--wandb_log=True"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [json.loads(line) for line in calls.read_text().splitlines()]
    assert got[0][0] == "init" and got[0][1] > 0 and [c[0] for c in got[1:]] == ["log"] * (len(got) - 1), got
    assert {c[1] for c in got[1:]} >= {0, 10, 20}, got


def test_a_file_kept_for_a_look_is_never_overwritten(tmp_path, capsys):
    """Issue 93. Named: a second damaged glue.json is set aside as glue.json.damaged2 (it replaced the first's
    .damaged). Unnamed: a GPU report's fine-tuning scores of a checkpoint retrained twice (.old, then .old2: the first
    was removed), and an abandoned checkpoint's name past a dangling link: one mechanism, files.unused."""
    import gpu_report
    from cram.files import set_aside, unused
    for text in ("{cut", "[1, 2"):
        (tmp_path / "glue.json").write_text(text)
        set_aside(str(tmp_path / "glue.json"), "cut short")
    assert [(tmp_path / f"glue.json.damaged{n}").read_text() for n in ("", 2)] == ["{cut", "[1, 2"]
    assert "set aside as glue.json.damaged2 and made again" in capsys.readouterr().out
    for n in range(2):
        (tmp_path / "glue_runs").mkdir()
        (tmp_path / "glue_runs" / "seed0.json").write_text(str(n))
        gpu_report.set_aside([str(tmp_path / "glue_runs"), str(tmp_path / "grid")])  # (no grid: nothing to move)
    assert [(tmp_path / f"glue_runs.old{n}" / "seed0.json").read_text() for n in ("", 2)] == ["0", "1"]
    os.symlink(tmp_path / "nowhere", tmp_path / "abandoned_ckpt.pt")
    assert unused(str(tmp_path / "abandoned"), "_ckpt.pt") == str(tmp_path / "abandoned2_ckpt.pt")


def test_damaged_results_and_glue_files_are_named_set_aside_and_made_again(pretrained, tmp_path):
    """A glue.json or a run's file that does not parse (cram writes whole files: a disk's fault or an edit) is said in
    a line, kept beside as <name>.damaged, and made again: glue.json from its runs, a run by fine-tuning it again.
    The export, which only reads glue.json, says so and writes its card without the scores."""
    run = copy_run(pretrained, tmp_path / "run")
    cut = '{"checkpoint": "x", "tasks": {"rte"'
    (run / "glue.json").write_text(cut)
    (run / "glue_runs").mkdir()  # what makes it cram's: its runs' folder, which cram writes before glue.json
    proc = run_script("tools/export.py", f"--checkpoint={run / 'ckpt.pt'}")
    assert f"warning: {run / 'glue.json'} is damaged (JSONDecodeError" in proc.stdout and "Traceback" not in proc.stderr
    assert (run / "glue.json").read_text() == cut and "GLUE dev scores" not in (run / "hf" / "README.md").read_text()
    finetune = ["finetune_glue.py", f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte",
                "--epochs=1", "--seeds=1", "--device=cpu"]
    proc = run_script(*finetune)
    assert f"warning: {run / 'glue.json'} is damaged" in proc.stdout and "set aside as glue.json.damaged" in proc.stdout
    assert (run / "glue.json.damaged").read_text() == cut and "rte" in json.loads((run / "glue.json").read_text())["scores"]
    seed0, = (run / "glue_runs" / "tasks" / "rte").glob("seed0*.json")  # the run's file
    for aside, text in (("", '{"checkpoint_step": 60, "sco'), ("2", '{"checkpoint_step": 60}')):  # cut; not a run's record
        seed0.write_text(text)
        proc = run_script(*finetune)
        assert f"warning: {seed0} is damaged" in proc.stdout and "rte: done earlier" not in proc.stdout  # fine-tuned again
        assert Path(f"{seed0}.damaged{aside}").read_text() == text  # the second beside the first (issue 93)
        assert json.loads(seed0.read_text())["seed"] == 0 and "rte" in json.loads((run / "glue.json").read_text())["scores"]
    glue = tmp_path / "glue"
    shutil.copytree(FIXTURES, glue)
    cases = {"RTE": ("train.tsv", "A caf\xe9".encode("latin-1"), "is not UTF-8 text"),
             "STS-B": ("dev.tsv", b"nan", "is not a finite number")}
    for folder, (name, text, fragment) in cases.items():
        path = glue / folder / name
        lines = path.read_bytes().split(b"\n")
        lines[1] = lines[1].rsplit(b"\t", 1)[0] + b"\t" + text if folder == "STS-B" else lines[1] + text
        path.write_bytes(b"\n".join(lines))
        before = snapshot(tmp_path)
        proc = run_script("finetune_glue.py", f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={glue}",
                          f"--tasks={folder.lower().replace('-', '')}", f"--out_json={tmp_path / 'g.json'}", check=False)
        assert_kept(proc, before, 1, "error:", name, fragment)


def test_a_field_or_line_of_any_size_or_depth_is_read_or_named(tmp_path, corpus_file):
    """Every file cram reads: a record or line of megabytes gives a result (read in pieces); one nested
    past the JSON parser's depth is a one-line error naming the file (and the line, where cram reads
    the lines itself), never a parser's traceback. (GLUE's TSVs: test_glue; settings and config
    files: test_reliability.)"""
    from cram.files import read_jsonl
    docs = corpus_file.read_text().split("\n\n")
    big = " ".join(docs * 10)  # one document of about 1.1 MB with no line break: read as MAX_DOC_CHARS pieces
    (tmp_path / "big.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in [big, *docs[:50]]))
    (tmp_path / "big.txt").write_text("\n\n".join([big, *docs[:50]]) + "\n")
    for name in ("big.jsonl", "big.txt"):
        run_script("prepare.py", f"--dataset={tmp_path / name}", f"--out_dir={tmp_path / name}.data", "--vocab_size=300",
                   "--seq_len=32", "--tokenizer_train_chars=50000", "--val_fraction=0.2")
        meta = json.loads((tmp_path / f"{name}.data" / "meta.json").read_text())
        assert meta["train_sequences"] * 32 > len(big) / 8, meta  # the long document's tokens are there
    deep = "[" * 100000 + "]" * 100000
    (tmp_path / "deep.jsonl").write_text(json.dumps({"text": "a short document"}) + "\n" + '{"text": ' + deep + "}\n")
    proc = run_script("prepare.py", f"--dataset={tmp_path / 'deep.jsonl'}", f"--out_dir={tmp_path / 'deep'}",
                      "--vocab_size=300", check=False)
    assert_kept(proc, {}, 1, "error:", "deep.jsonl")
    # cram's own JSON lines (metrics.jsonl): a line of megabytes is read, one nested too deep is named
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 1, "note": "x" * 10_000_000}) + "\n" + json.dumps({"step": 2}) + "\n")
    assert [r["step"] for r in read_jsonl(log)] == [1, 2]
    log.write_text(json.dumps({"step": 1}) + "\n" + deep + "\n" + json.dumps({"step": 3}) + "\n")
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2 is not a JSON line"):
        read_jsonl(log)


# ------------------------------------------------------------------ 4. full disks, unwritable targets
# (write_atomically, guarded, and the checks at the start)
def limited(max_bytes):
    """preexec_fn: files of this process may not grow past max_bytes (writes then fail with EFBIG,
    as on a full disk, instead of a SIGXFSZ kill)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def run_limited(max_bytes, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, preexec_fn=limited(max_bytes))


def test_a_write_that_fails_is_one_line_and_keeps_the_last_good_file(pretrained, prepared, corpus_file, tmp_path):
    run = copy_run(pretrained, tmp_path / "run")
    (tmp_path / "hf").mkdir()
    cases = [  # the checkpoint (1.4 MB) at a save, the token files, the export's weights: each past 200 kB
        (["train.py", f"--data_dir={prepared}", f"--out_dir={run}", *TINY_MODEL, "--resume=True", "--max_steps=62",
          "--fill_in_examples=0"], "ckpt.pt"),
        (["prepare.py", f"--dataset={big_corpus(tmp_path, mib=1)}", f"--out_dir={tmp_path / 'data'}",
          "--vocab_size=300", "--tokenizer_train_chars=100000"], "train.bin"),
        (["tools/export.py", f"--checkpoint={run / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf'}"], "model.safetensors"),
    ]
    for args, name in cases:
        before = snapshot(tmp_path)
        before.pop(str(run / "metrics.jsonl"))  # the resumed run logs its steps there, as it should
        proc = run_limited(200_000, *args)
        assert_kept(proc, before, 1, "error:", name)
        leftovers = [p for p in snapshot(tmp_path) if p.endswith(".tmp") and p not in before and "data" not in p]
        assert leftovers == []  # no half-written file (prepare keeps its resumable .tmp token files)


def faulty(pattern, how, skip, *args):
    """A script whose writes of files named `pattern` fail midway after `skip` of them (tests/faulty_writes.py)."""
    return run_script("tests/faulty_writes.py", pattern, how, str(skip), *args, check=False)


def assert_failed_write(proc, before, folder, *fragments):
    """One line (the error, or a stop's), every file of `before` as it was, no temporary file left behind."""
    assert_kept(proc, before, 143 if "stopped by SIGTERM" in fragments else 1, "stopped" if "stopped by SIGTERM" in
                fragments else "error:", *fragments)
    assert [p for p in snapshot(folder) if p.endswith(".tmp") and not p.endswith(".bin.tmp") and p not in before] == []


def whole_files(folder):
    """Every JSON file under `folder` parses and every .pt loads: none is cut."""
    for path in snapshot(folder):
        if path.endswith(".json"):
            json.loads(open(path, encoding="utf-8").read())
        elif path.endswith(".pt"):
            torch.load(path)


def test_every_writer_failing_midway_keeps_the_old_file_and_its_advice_works(pretrained, prepared, corpus_file, tmp_path):
    """Each file a command writes, made to fail halfway through its write (a full disk, a SIGTERM), leaves what was there
    whole and one line; the command that line advises then works. Training: the second save fails on a file system
    without hard links (the series moved its ckpt.pt aside before the write), and its metrics line."""
    train = [f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL, "--max_steps=3",
             "--ckpt_interval_minutes=0", "--fill_in_examples=0"]
    proc = faulty("ckpt.pt*", "nolink", 1, "train.py", *train)
    saved = snapshot(tmp_path / "run")
    saved.pop(str(tmp_path / "run" / "metrics.jsonl"))
    assert_failed_write(proc, saved, tmp_path, "ckpt.pt", "what was written before is intact", "--resume=True")
    assert torch.load(tmp_path / "run" / "ckpt.pt")["step"] == 1
    run_script("train.py", *train, "--resume=True")  # the advice
    assert torch.load(tmp_path / "run" / "ckpt.pt")["step"] == 3 and (tmp_path / "run" / "ckpt_00000002.pt").exists()
    proc = faulty("metrics.jsonl", "full", 0, "train.py", *train[:1], f"--out_dir={tmp_path / 'fresh'}", *train[2:])
    assert_failed_write(proc, {}, tmp_path, "metrics.jsonl", "run the same command again")
    run_script("train.py", *train[:1], f"--out_dir={tmp_path / 'fresh'}", *train[2:])
    # preparation: each of its files, then the same command finishes it as one run would have
    args = [f"--dataset={corpus_file}", "--vocab_size=384", "--seq_len=32", "--val_fraction=0.05"]
    for name, fragment in (("settings.json*", "settings.json"), ("tokenizer.tiktoken.[0-9]*", "tokenizer.tiktoken"),
                           ("train.bin*", "train.bin"), ("meta.json*", "meta.json")):
        out = tmp_path / fragment.split(".")[0]
        proc = faulty(name, "full", 0, "prepare.py", *args, f"--out_dir={out}")
        assert_failed_write(proc, {}, out, fragment, "run the same command")
        assert not (out / "meta.json").exists()  # not prepared: the rerun finishes it
        run_script("prepare.py", *args, f"--out_dir={out}")
        assert all((out / f).read_bytes() == (prepared / f).read_bytes() for f in ("train.bin", "val.bin", "tokenizer.tiktoken"))
    # the export, over its own earlier export of the same checkpoint
    hf = tmp_path / "hf"
    run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={hf}")
    for name in ("config.json*", "model.safetensors*", "README.md*", ".cram_export.json*"):
        before = {p: b for p, b in snapshot(hf).items() if not p.endswith(".cram_export.json") or name[0] == "."}
        proc = faulty(name, "full", 0, "tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={hf}")
        assert_failed_write(proc, before, hf, name[:-1], "run the same command again")
        run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={hf}")


@pytest.mark.parametrize("name,how", [("glue.json*", "full"), ("seed*.json*", "full"), ("RTE.tsv*", "full"),
                                      ("seed*.encoder.pt*", "full"), ("seed*.encoder.pt*", "stop")])
def test_a_finetuning_write_failing_midway_keeps_the_runs_and_the_rerun_ends_them(name, how, pretrained, tmp_path):
    """glue.json, a run's file (the first rewritten: seed 0's, as a rerun marks it chosen), a prediction file and
    --protocol=task_start's MNLI encoder, each cut midway by a full disk or a SIGTERM: one line, the files before as they
    were, nothing that says a run is done without what it keeps; the same command then finishes the work."""
    run = copy_run(pretrained, tmp_path / "run")
    args = [f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte", "--epochs=1", "--device=cpu",
            "--predict=True", "--protocol=task_start"]
    run_script("finetune_glue.py", *args, "--seeds=1")
    before = {p: b for p, b in snapshot(tmp_path).items() if fnmatch.fnmatch(os.path.basename(p), name)}  # what fails
    proc = faulty(name, how, 0, "finetune_glue.py", *args, "--seeds=2")
    assert_failed_write(proc, before, tmp_path, *(["stopped by SIGTERM"] if how == "stop" else [name.split("*")[-2]]))
    whole_files(tmp_path)
    rerun = run_script("finetune_glue.py", *args, "--seeds=2")
    assert "Traceback" not in rerun.stderr and "damaged" not in rerun.stdout
    results = json.loads((run / "glue.json").read_text())
    assert results["tasks"]["rte"]["seeds"] == [0, 1] and results["tasks"]["mnli"]["seeds"] == [0, 1]
    assert len(list((run / "glue_runs" / "tasks" / "mnli").glob("seed*.encoder.pt"))) == 2


def test_mnli_s_encoder_cut_by_a_file_size_limit_is_one_line_and_a_damaged_one_is_redone(pretrained, tmp_path):
    """The named case: MNLI's encoder (400 kB) past `ulimit -f` is one line and no run file; an encoder cut beside its
    finished run file (by an older cram's write in place) is said in a line, and MNLI fine-tuned again."""
    run = copy_run(pretrained, tmp_path / "run")
    args = ["finetune_glue.py", f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte", "--epochs=1",
            "--seeds=1", "--device=cpu", "--protocol=task_start"]
    proc = run_limited(200_000, *args)
    assert_failed_write(proc, {}, tmp_path, "encoder.pt", "run the same command")
    assert not (run / "glue_runs" / "tasks" / "mnli").exists() or not list((run / "glue_runs" / "tasks" / "mnli").glob("*"))
    run_script(*args)
    encoder = next((run / "glue_runs" / "tasks" / "mnli").glob("seed0-*.encoder.pt"))
    os.truncate(encoder, cut := encoder.stat().st_size // 2)
    proc = run_script(*args)
    assert f"warning: {encoder} is damaged" in proc.stdout and "fine-tuning" in proc.stdout
    assert os.path.getsize(f"{encoder}.damaged") == cut  # set aside, kept for a look
    assert set(torch.load(encoder)) and json.loads((run / "glue.json").read_text())["tasks"]["rte"]["seeds"] == [0]


def tool_writer(case, pretrained, prepared, tmp_path):
    """A tool's command whose write fails in a case of the test below: (its arguments, the folder whose files must stay
    as they were, a file of the rerun and bytes it holds, whether an earlier run writes the file first)."""
    out, data = tmp_path / "out", tmp_path / "data"
    out.mkdir()
    if case == "compare_png":  # tools/compare.py plotting runs it has
        return ["tools/compare.py", f"--runs={pretrained.parent}", f"--png={out / 'pic.png'}"], out, ("pic.png", b"\x89PNG"), True
    if case in ("shape_plot_svg", "glue_plot_png"):  # the batch picture as an svg: the suffix names the format
        tool = case.split("_")[0] + "_plot"
        shutil.copy(os.path.join(ROOT, "docs", f"{case.split('_')[0]}_points.json"), out / "points.json")
        extra = [f"--batch_png={out / 'batch.svg'}"] if tool == "shape_plot" else []
        name, start = ("batch.svg", b"<?xml") if extra else ("picture.png", b"\x89PNG")
        return [f"tools/{tool}.py", f"--points={out / 'points.json'}", f"--png={out / 'picture.png'}", *extra], out, (name, start), True
    if case == "gpu_report_copies":  # --copy_to, a device call's $OUT: report.md copied there as each phase ends
        return (["tools/gpu_report.py", "--phases=prepare", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'report'}",
                 f"--copy_to={out}"], out, ("report.md", b"# cram GPU report"), True)
    if case == "curriculum":  # its sorted copy, continued by the rerun; train.bin replaced only once it is whole
        shutil.copytree(prepared, data)
        return ["tools/curriculum.py", f"--data_dir={data}", "--block=50"], data, ("meta.json", b'"curriculum_block": 50'), False
    if case == "gpu_call_glue":  # GLUE's files into the carry folder (one of the repository's), replaced by each run
        carry = os.path.join("data", f"test_faulty_{os.getpid()}")
        return (["tools/gpu_call.py", f"--corpus={tmp_path / 'text.txt'}", f"--glue_dir={FIXTURES}", f"--carry_dir={carry}",
                 "--carry_text=True", "--vocab_size=384", "--seq_len=32"], os.path.join(ROOT, carry),
                ("glue/RTE/dev.tsv", open(os.path.join(FIXTURES, "RTE", "dev.tsv"), "rb").read()), True)
    base = tmp_path / "base.py"  # compare_done: the file that marks a variant's run finished, with its settings
    base.write_text(f"data_dir = {str(prepared)!r}\n")
    return (["tools/compare.py", "--variants=crammed", f"--base={base}", "--budget_minutes=0.05", f"--out_dir={out}",
             f"--train_args={' '.join(TINY_MODEL)} --max_steps=2"], out, ("results.json", b"{"), False)


@pytest.mark.parametrize("case,name,how", [
    ("compare_png", "pic.png*", "full"), ("shape_plot_svg", "batch.svg*", "stop"), ("glue_plot_png", "picture.png*", "full"),
    ("gpu_report_copies", "report.md*", "full"), ("curriculum", "train.bin.curriculum*", "full"),
    ("gpu_call_glue", "dev.tsv*", "full"), ("compare_done", "done*", "full")])
def test_a_tool_s_write_failing_midway_keeps_the_old_file_and_the_rerun_works(case, name, how, pretrained, prepared,
                                                                              tmp_path):
    """Every file a tool writes, cut midway by a full disk or a SIGTERM: one line naming it (or the stop's), the files
    there before as they were (pictures, the copies into a device call's $OUT, GLUE's files in a call's carry, train.bin
    under the curriculum), no temporary file left but the curriculum's resumable copy, and the same command then works:
    a cut done file of compare.py's made the rerun refuse its own run as one of 'other settings'."""
    (tmp_path / "text.txt").write_text("\n\n".join(synthetic_corpus(40)) + "\n")
    args, watched, (written, start), first = tool_writer(case, pretrained, prepared, tmp_path)
    try:
        if first:
            run_script(*args)
        before = snapshot(watched)
        proc = faulty(name, how, 0, *args)
        assert_kept(proc, before, *((143, "stopped by SIGTERM") if how == "stop" else (1, "error:", name[:-1])))
        assert [p for p in snapshot(tmp_path, watched) if p.endswith(".tmp") and ".curriculum-" not in p] == []
        run_script(*args)
        assert start in open(os.path.join(watched, written), "rb").read()
    finally:
        if case == "gpu_call_glue":
            shutil.rmtree(watched, ignore_errors=True)


def test_a_checkpoint_that_cannot_be_written_is_refused_before_training(prepared, tmp_path):
    (tmp_path / "ckpt.pt").mkdir()  # a folder where the checkpoint goes
    proc = run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, check=False)
    assert_kept(proc, {}, 1, "error:", "ckpt.pt is a folder, not a file")
    assert "step 1 " not in proc.stdout and not (tmp_path / "metrics.jsonl").exists()


# ------------------------------------------------------------------ 5. what two processes write is merged
# (finetune_glue.py's run files and their summary, the export's manifest)
def test_two_finetuning_runs_on_one_checkpoint_merge_their_tasks(pretrained, tmp_path):
    run = copy_run(pretrained, tmp_path / "run")
    procs = [start("finetune_glue.py", f"--checkpoint={run / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", f"--tasks={task}",
                   "--epochs=1", "--seeds=2", "--device=cpu") for task in ("rte", "mrpc")]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    results = json.loads((run / "glue.json").read_text())
    assert sorted(results["tasks"]) == ["mrpc", "rte"] and all(len(t["seeds"]) == 2 for t in results["tasks"].values())
    assert "| rte |" in results["table"] and "| mrpc |" in results["table"]


def test_an_export_never_replaces_a_users_files(pretrained, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("my notes")
    (folder / "config.json").write_text('{"model_type": "cram"}')  # looks like an export, is not one
    before = snapshot(folder)
    proc = run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={folder}", check=False)
    assert_kept(proc, before, 1, "error:", "holds files this export did not write", "README.md")
    ours = tmp_path / "ours"
    run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={ours}")
    (ours / "config.json.4321.tmp").write_text("{")  # what an export killed mid-write leaves
    run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={ours}")  # its own earlier export: replaced
    assert not (ours / "config.json.4321.tmp").exists()
    (ours / "README.md").write_text("edited by hand")
    before = snapshot(ours)
    proc = run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={ours}", check=False)
    assert_kept(proc, before, 1, "error:", "changed since", "README.md")


def test_a_folder_or_file_is_a_command_s_own_result_only_when_its_record_says_so(prepared, tmp_path, monkeypatch):
    """Issue 100, class 2. Named: prepare.py into a folder of another corpus' token files and meta.json without
    settings.json (it said "already prepared" and exited 0), and finetune_glue.py's --out_json naming the user's own
    JSON-lines log (renamed .damaged and replaced): each one line before any work, the files as they were, nothing set
    aside. Unnamed: a new train.py run in a folder holding a metrics.jsonl no run wrote; an earlier attempt's log, whose
    lines name their run, is still the run's to replace."""
    import finetune_glue
    import prepare
    from cram.files import check_own_files
    other = tmp_path / "other"
    shutil.copytree(prepared, other)
    (other / "settings.json").unlink()  # corpus A's token files, copied without prepare.py's record
    corpus_b = tmp_path / "b.txt"
    corpus_b.write_text("\n\n".join(synthetic_corpus(50, seed=1)))
    for name, value in dict(dataset=str(corpus_b), out_dir=str(other), vocab_size=384, seq_len=32).items():
        monkeypatch.setattr(prepare, name, value)
    (other / ".lock").unlink(missing_ok=True)
    before = snapshot(other)
    with pytest.raises(SystemExit, match="without prepare.py's record of what it was prepared from"):
        prepare.main()
    assert {path: data for path, data in snapshot(other).items() if not path.endswith(".lock")} == before
    log = tmp_path / "results.jsonl"
    log.write_text('{"epoch": 1, "acc": 0.5}\n{"epoch": 2, "acc": 0.6}\n')
    with pytest.raises(SystemExit, match="holds text that is not JSON .* not finetune_glue.py's: pass --out_json="):
        finetune_glue.check_earlier(str(log), dict(checkpoint_digest="x"))
    assert sorted(os.listdir(tmp_path)) == ["b.txt", "other", "results.jsonl"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 9.1}\n')  # the user's own notes
    with pytest.raises(SystemExit, match="metrics.jsonl is not a train.py run's log .no line names its run"):
        check_own_files(str(run), None, None)
    for attempt in ('{"kind": "eval", "step": 0, "run": "5eed"}\n{"kind": "tr', '{"kind": "ev'):  # cut by a kill, a full disk
        (run / "metrics.jsonl").write_text(attempt)
        check_own_files(str(run), None, None)


# ------------------------------------------------------------------ 6. safe loading says what it refused: data.refusal
class Callable:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("case", ["protocol 4", "protocol 5", "a callable", "junk"])
def test_a_refused_checkpoint_is_one_line_saying_why(case, pretrained, tmp_path):
    path = tmp_path / "ckpt.pt"
    if case.startswith("protocol"):
        torch.save(torch.load(pretrained), path, pickle_protocol=int(case[-1]))
    elif case == "a callable":
        torch.save({"model": Callable()}, path)
    else:
        path.write_bytes(b"\x00junk")
    before = snapshot(tmp_path)
    fragment = {"protocol 4": "protocol 4 or 5", "protocol 5": "protocol 4 or 5", "a callable": "could run code",
                "junk": "not a readable checkpoint"}[case]
    proc = run_script("tools/export.py", f"--checkpoint={path}", check=False)
    assert_kept(proc, before, 1, "error:", str(path), fragment)
    assert "weights_only` set to `False`" not in proc.stderr and "this ran" not in proc.stdout


# ------------------------------------------------------------------ 7. optional dependencies, checked first: process.installed
WITHOUT = "import runpy, sys; sys.modules[{module!r}] = None; sys.argv = sys.argv[1:]; " \
          "runpy.run_path(sys.argv[0], run_name='__main__')"


def run_without(module, *args):
    """A script run as if `module` were not installed."""
    return run_script("-c", WITHOUT.format(module=module), *args, check=False)


def test_missing_optional_dependencies_are_found_before_the_work(pretrained, prepared, tmp_path):
    proc = run_without("wandb", "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL,
                       "--wandb_log=True")
    assert_kept(proc, {}, 1, "error:", "pip install wandb")
    assert not (tmp_path / "run").exists()
    run = copy_run(pretrained, tmp_path / "plotted")
    proc = run_without("matplotlib", "tools/compare.py", f"--runs={run}", f"--png={tmp_path / 'plot.png'}")
    assert proc.returncode == 0 and "matplotlib is not installed" in proc.stdout and f"| {run} |" in proc.stdout
    assert not (tmp_path / "plot.png").exists()


def test_a_stop_that_lands_inside_a_lock_s_wait_is_still_the_stop():
    """Ctrl-C inside a thread pool's Condition.wait (prepare.py's encoding) can unwind as `RuntimeError: cannot release
    un-acquired lock`, raised while handling the KeyboardInterrupt: that is the stop (its line, status 130), and a
    RuntimeError of its own is still a bug's traceback."""
    stop = ("import signal, sys; sys.path.insert(0, '.'); from cram import process\n"
            "def main():\n    try:\n        raise KeyboardInterrupt(signal.SIGINT)\n"
            "    except KeyboardInterrupt:\n        raise RuntimeError('cannot release un-acquired lock')\n"
            "process.guarded(main, 'nothing was written')")
    proc = subprocess.run([sys.executable, "-c", stop], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_kept(proc, {}, 130, "stopped by SIGINT", "nothing was written")
    bug = stop.replace("raise KeyboardInterrupt(signal.SIGINT)", "raise ValueError('a bug')").replace(
        "except KeyboardInterrupt", "except ValueError")
    proc = subprocess.run([sys.executable, "-c", bug], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" in proc.stderr

