"""What a 24-hour run relies on: every sequence once per epoch, the same run under torchrun,
surviving SIGTERM/SIGINT/SIGKILL, skipping non-finite updates, safe checkpoint loading, and
one-line errors for bad input."""
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import (CHILDREN, ROOT, TINY_MODEL, assert_one_line_error, default_signals, run_script, slow, spawn,
                      synthetic_corpus, weights_atol)
from cram import runtime
from cram.data import repeat_warning
from cram.files import load_meta, read_jsonl
from model import CrammedBert, Trainer, mask_tokens, param_groups
from train import rows_at

# 49152 tokens of 32-token sequences, the batch ramping from 16 to 64 sequences: 46 steps
TOKEN_RUN = [*TINY_MODEL, "--batch_size=64", "--batch_ramp_start=16", "--budget_tokens=49152", "--log_interval=1",
             "--eval_sequences=32"]


def step_lines(stdout):
    """{step: (loss, lr, batch)} from the log."""
    return {int(s): (loss, lr, batch) for s, loss, lr, batch in
            re.findall(r"^step (\d+) \| loss ([\d.]+) \| lr ([\d.e+-]+) \| batch (\d+) \|", stdout, re.M)}


def test_rows_visit_every_sequence_once_per_epoch():
    n = 10
    first_two_epochs = rows_at(0, 2 * n, n, seed=0)
    assert sorted(first_two_epochs[:n]) == list(range(n)) and sorted(first_two_epochs[n:]) == list(range(n))
    assert list(first_two_epochs[:n]) != list(first_two_epochs[n:])  # each epoch its own order
    pieces = np.concatenate([rows_at(0, 7, n, 0), rows_at(7, 6, n, 0), rows_at(13, 7, n, 0)])
    assert list(pieces) == list(first_two_epochs)  # the same order however it is sliced (resume, ranks)
    assert list(rows_at(0, n, n, seed=1)) != list(first_two_epochs[:n])


def test_warning_when_the_budget_repeats_the_data():
    # 600k tokens/s for the 23 h left of a day after 2B tokens: about 50B tokens, 5 epochs of 10B
    warning = repeat_warning(2e9 + 600e3 * 23 * 3600, 10e9, "at 600,000 tokens/s")
    assert "at 600,000 tokens/s the run will train about 51.68B tokens, 5.2 epochs of the 10.00B" in warning
    assert repeat_warning(51.68e9, 100e9, "at 600,000 tokens/s") is None


def rows_read(args, monkeypatch):
    """Run train.py's main in this process with args and return the training rows its
    micro-batches read, in order (its settings and signal handlers are restored afterwards)."""
    import train
    from configurator import configure
    settings = dict(vars(train))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    rows, get_batch = [], train.get_batch

    def recording(tokens, idx, device):
        if str(tokens.filename).endswith("train.bin"):  # not the evaluations' validation rows
            rows.extend(idx.tolist())
        return get_batch(tokens, idx, device)
    torch.set_num_threads(1)
    try:
        with monkeypatch.context() as patch:  # undone after this run, so the next run records only its own rows
            patch.setattr(train, "get_batch", recording)  # what train.Batches reads the training rows with
            given = {}
            train.main(configure(vars(train), args, train.ModelConfig, skip=train.DATA_FIELDS + train.SHAPE_FIELDS,
                                 given=given), given)
    finally:
        vars(train).update(settings)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    return rows


def test_a_resumed_run_reads_the_rows_an_uninterrupted_one_reads(prepared, tmp_path, monkeypatch, capsys):
    """The consumed row indices themselves: stopped at step 20 and resumed, a run reads exactly the
    rows, in the same order, that the run without a stop reads: none skipped, none repeated."""
    common = [f"--data_dir={prepared}", *TOKEN_RUN, "--fill_in_examples=0"]
    whole = rows_read([*common, f"--out_dir={tmp_path / 'whole'}"], monkeypatch)
    first = rows_read([*common, f"--out_dir={tmp_path / 'parts'}", "--max_steps=20"], monkeypatch)
    second = rows_read([*common, f"--out_dir={tmp_path / 'parts'}", "--resume=True"], monkeypatch)
    assert "resuming" in capsys.readouterr().out
    n_rows = load_meta(prepared)["train_sequences"]
    assert len(whole) >= 49152 // 32 > n_rows and first + second == whole
    # the first epoch reads every row once; the second (half of one) repeats none
    assert sorted(whole[:n_rows]) == list(range(n_rows)) and len(set(whole[n_rows:])) == len(whole) - n_rows


def launch_two(args, nodes):
    """train.py `args` in two processes under torchrun: on one node (--standalone), or as docs/gpu.md's two-node
    command (c10d rendezvous, one process a node) with both nodes on this machine. Rank 0's stdout."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if nodes == 1:
        procs = [spawn([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    else:
        import socket
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        procs = [spawn([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                        "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=cram", *args], cwd=ROOT,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-3000:] for _, err in outputs]
    return next(out for out, _ in outputs if "final:" in out)


@pytest.mark.parametrize("nodes", [pytest.param(1, marks=slow), 2])  # one node in CI: test_pipeline's torchrun test
def test_two_processes_train_like_one(prepared, tmp_path, nodes):
    """Under torchrun each rank takes a disjoint share of the global batch: 2 processes give the
    losses and parameters of 1 process with the same global batch, on one node or on two."""
    common = ["train.py", f"--data_dir={prepared}", *TOKEN_RUN, "--batch_ramp=0.0", "--budget_tokens=16384"]
    one = run_script(*common, f"--out_dir={tmp_path / 'one'}").stdout
    losses_one, losses_two = step_lines(one), step_lines(launch_two([*common, f"--out_dir={tmp_path / 'two'}"], nodes))
    assert len(losses_one) == 8 and losses_one.keys() == losses_two.keys()
    for s in losses_one:
        assert float(losses_two[s][0]) == pytest.approx(float(losses_one[s][0]), abs=2e-4)
        assert losses_two[s][1:] == losses_one[s][1:]  # lr and batch
    model_one = torch.load(tmp_path / "one" / "ckpt.pt")["model"]
    model_two = torch.load(tmp_path / "two" / "ckpt.pt")["model"]
    for name in model_one:  # the all-reduce sums in another order: equal up to rounding (TINY_MODEL's lr)
        torch.testing.assert_close(model_two[name], model_one[name], rtol=0, atol=weights_atol(3e-3, len(losses_one)))


def test_the_batch_ramp_is_the_same_on_any_device_and_process_count(prepared, tmp_path):
    """The ramp starts at batch_ramp_start (the reference's 128) whatever the micro-batch and the processes: two
    processes forced to micro-batches of 1,024 (the final batch's per process: no ramp at all, once), stopped mid-ramp
    and resumed in one process, log the batches of one process at 32, from 128 in steps of 128 to the final 2,048 at
    the ramp's share, and not before: the number of processes is not part of the run."""
    common = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--batch_size=2048", "--budget_tokens=262144",
              "--batch_ramp=0.5", "--log_interval=1", "--eval_sequences=32", "--fill_in_examples=0"]
    two = launch_two([*common, "--micro_batch=1024", f"--out_dir={tmp_path / 'two'}", "--max_steps=6"], nodes=1)
    assert "batch: 128 sequences a step at the start, then 128 more at a time up to 2,048 at 50% of the budget" in two
    assert "micro-batches of 1024 per process (and of 64 for the rest)" in two
    run_script(*common, "--micro_batch=32", f"--out_dir={tmp_path / 'two'}", "--resume=True")  # in one process
    run_script(*common, "--micro_batch=32", f"--out_dir={tmp_path / 'one'}")
    logs = [[r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"] for name in ("two", "one")]
    assert [r["batch"] for r in logs[0]] == [r["batch"] for r in logs[1]] and logs[0][0]["batch"] == 128
    assert all(r["batch"] % 128 == 0 for r in logs[0]) and logs[0][-1]["batch"] == 2048 and len(logs[0]) > 6
    for r in logs[0]:  # the final batch from the step that starts at half the budget's tokens on
        assert (r["batch"] == 2048) == (r["tokens"] - 32 * r["batch"] >= 262144 / 2), r


def test_sigkill_then_resume_continues_the_same_run(prepared, tmp_path):
    """Killed at any moment and resumed, a run ends where an uninterrupted one ends: same schedule,
    same data order, same parameters."""
    common = ["train.py", f"--data_dir={prepared}", *TOKEN_RUN, "--ckpt_interval_minutes=0"]
    whole = run_script(*common, f"--out_dir={tmp_path / 'whole'}").stdout
    assert "warning: with --budget_tokens=49,152 the run will train about 49.15k tokens, 1.5 epochs" in whole
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, *common, f"--out_dir={out}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "ckpt.pt").exists() or torch.load(out / "ckpt.pt")["step"] < 6:
            assert time.time() < deadline and proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    killed_at = torch.load(out / "ckpt.pt")["step"]
    resumed = run_script(*common, f"--out_dir={out}", "--resume=True").stdout
    assert f"at step {killed_at}," in resumed
    expected, got = step_lines(whole), step_lines(resumed)
    assert min(got) == killed_at + 1 and max(got) == max(expected) == 46
    for s in got:  # the lr and the batch continue the schedule, the losses the data order
        assert got[s] == expected[s], (s, got[s], expected[s])
    a, b = torch.load(tmp_path / "whole" / "ckpt.pt"), torch.load(out / "ckpt.pt")
    assert a["tokens"] == b["tokens"] and 49152 <= b["tokens"] < 49152 + 64 * 32 and a["step"] == b["step"]
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=1e-6, atol=1e-7)


SAVES_SEEN = """import os, runpy, signal, sys
sys.path.insert(0, {root!r})
from cram import data, files
save = files.Saves.save
def seen(self, state):  # each save's step, in saves.txt beside this file
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "saves.txt"), "a") as f:
        f.write(str(state["step"]) + chr(10))
    save(self, state)
files.Saves.save = seen
"""
STOP_IN_STEP = SAVES_SEEN + """
read, reads = data.get_batch, []
def get_batch(tokens, rows, device):  # a stop signal in the middle of step {step}, as a scheduler's would come
    if getattr(tokens, "filename", "").endswith("train.bin"):
        reads.append(1)
        if len(reads) == {step}:
            os.kill(os.getpid(), signal.SIGTERM)
    return read(tokens, rows, device)
data.get_batch = get_batch
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


STOP_IN_EVAL = SAVES_SEEN + """
write = files.MetricsLog.write
def stop_after(self, fields):  # a stop signal as step {step}'s evaluation ends, before its save
    write(self, fields)
    if fields["kind"] == "eval" and fields["step"] == {step}:
        os.kill(os.getpid(), signal.SIGTERM)
files.MetricsLog.write = stop_after
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


STOP_IN_SAVE = SAVES_SEEN + """
save_seen, sent = files.Saves.save, []
def stop_during(self, state):  # a stop signal while step {step}'s periodic save is written
    if state["step"] == {step} and not sent:
        sent.append(os.kill(os.getpid(), signal.SIGTERM))
    save_seen(self, state)
files.Saves.save = stop_during
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


@pytest.mark.parametrize("spy_text, evals", [(STOP_IN_STEP, [0, 1, 2, 3]), (STOP_IN_EVAL, [0, 1, 2, 3, 4]),
                                             (STOP_IN_SAVE, [0, 1, 2, 3, 4])], ids=["in_step", "in_eval", "in_save"])
def test_a_stop_skips_the_evaluation_and_the_save_due_after_its_step(prepared, tmp_path, spy_text, evals):
    """A stop signal during a step after which an evaluation and a periodic save are due (here every step): the run
    finishes the step and saves it once, at the end. Before, it evaluated, saved, and saved the same step again: three
    jobs where a scheduler's grace period needs one. A stop during that evaluation skips the save after it too, and
    one during that save lets it finish and does not save the same step again at the end."""
    from cram.files import checkpoint_series
    spy, out = tmp_path / "spy.py", tmp_path / "run"
    spy.write_text(spy_text.format(root=ROOT, step=4))
    args = [sys.executable, str(spy), f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL, "--micro_batch=32",
            "--budget_hours=1.0", "--eval_interval_minutes=0", "--ckpt_interval_minutes=0", "--keep_checkpoints=3"]
    proc = spawn(args, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143 and "stopped by SIGTERM at step 4 " in stdout, (stdout[-2000:], stderr[-2000:])
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"] == evals  # at init, then a step's
    assert torch.load(out / "ckpt.pt")["step"] == 4 and [s for s, _ in checkpoint_series(out)] == [2, 3]
    assert (tmp_path / "saves.txt").read_text().split() == ["1", "2", "3", "4"]  # step 4 saved once


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130), pytest.param(
    signal.SIGHUP, 129, marks=slow), (signal.SIGXCPU, 152)])  # SIGHUP's stop: the hang-up tests
def test_a_signal_saves_and_exits_with_its_status(prepared, tmp_path, signum, status):
    args = [sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL,
            "--budget_hours=1.0", "--log_interval=1"]
    proc = spawn(args, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # wait for training to run
        lines.append(line)
        if line.startswith("step 3 "):
            break
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    stdout = "".join(lines) + stdout
    assert proc.returncode == status, stderr[-2000:]
    stop = re.search(rf"stopped by {signal.Signals(signum).name} at step (\d+) .*--resume=True", stdout)
    assert stop, stdout[-2000:]
    ckpt = torch.load(tmp_path / "ckpt.pt")
    assert ckpt["step"] == int(stop.group(1)) >= 3 and not ckpt["final"]


def test_a_closed_terminal_or_pipe_still_saves_and_nohup_keeps_ignoring_the_hang_up(prepared, tmp_path):
    """SIGHUP after the terminal closed (every write to it now fails, EIO), or SIGTERM after the reader
    of a pipe left (EPIPE): the run saves and exits with the signal's status, its lines dropped, not an
    exit 1 with nothing saved. Under nohup (SIGHUP ignored) a hang-up changes nothing: the run goes on."""
    import pty
    args = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--budget_hours=1.0", "--log_interval=1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    master, slave = pty.openpty()
    proc = spawn([sys.executable, *args, f"--out_dir={tmp_path / 'tty'}"], cwd=ROOT, env=env,
                 stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    while b"step 3 " not in seen:
        seen += os.read(master, 4096)
    os.close(master)  # the terminal is gone
    time.sleep(1.0)  # a few steps write to it and fail
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 129
    ckpt = torch.load(tmp_path / "tty" / "ckpt.pt", weights_only=True)
    assert ckpt["step"] > 3 and not ckpt["final"]

    proc = spawn([sys.executable, *args, f"--out_dir={tmp_path / 'pipe'}"], cwd=ROOT, env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith(b"step 3 "):
            break
    proc.stdout.close()  # the reader is gone
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, proc.stderr.read()[-2000:]
    assert torch.load(tmp_path / "pipe" / "ckpt.pt", weights_only=True)["step"] > 3

    proc = spawn(["nohup", sys.executable, *args, f"--out_dir={tmp_path / 'nohup'}"], cwd=ROOT, env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 3 "):
            proc.send_signal(signal.SIGHUP)
        if line.startswith("step 8 "):  # still training after the hang-up
            proc.send_signal(signal.SIGTERM)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "stopped by SIGTERM" in stdout and "SIGHUP" not in stdout + stderr, stderr


# a step of 256 micro-batches: a signal comes in the middle of one, and a repeat before the save is done
LONG_STEP = [*TINY_MODEL, "--micro_batch=4", "--batch_size=1024", "--batch_ramp=0", "--budget_hours=1.0", "--log_interval=1"]


def run_until_step(args, tmp_path, step=2, **kwargs):
    """A training run started as a child (spawn), once its log has reached `step`: (proc, lines so far)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **kwargs.pop("env", {}))
    proc = spawn(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {step} "):
            return proc, lines
    raise AssertionError(f"the run ended first: {proc.communicate()[1][-2000:]}")


def assert_saved_stop(proc, lines, name, out, status=None):
    stdout, stderr = proc.communicate(timeout=180)
    stdout = "".join(lines) + stdout
    stop = re.search(rf"stopped by {name} at step (\d+) .*--resume=True", stdout)
    assert stop and (status is None or proc.returncode == status), (proc.returncode, stdout[-1500:], stderr[-2000:])
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == int(stop.group(1)) >= 1 and not ckpt["final"]
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]  # no save cut short


def test_repeats_of_a_stop_signal_leave_the_save_alone(prepared, tmp_path):
    """A stop signal often comes more than once: a closed terminal's SIGHUP to the session and its shell's to
    the job; the kernel's SIGXCPU every CPU-second past a soft limit (`ulimit -t`, a grid engine's s_cpu). The
    repeats are the same request: the run finishes its step, saves and exits with the signal's status."""
    args = [sys.executable, "train.py", f"--data_dir={prepared}", *LONG_STEP]
    proc, lines = run_until_step([*args, f"--out_dir={tmp_path / 'hup'}"], tmp_path)
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    assert_saved_stop(proc, lines, "SIGHUP", tmp_path / "hup", 129)
    soft = 12  # past start-up and a few steps; the hard limit (SIGKILL) far beyond the save

    def limited():
        default_signals()
        resource.setrlimit(resource.RLIMIT_CPU, (soft, 120))

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([*args, f"--out_dir={tmp_path / 'xcpu'}"], cwd=ROOT, env=env, preexec_fn=limited,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    CHILDREN.append(proc)
    assert_saved_stop(proc, [], "SIGXCPU", tmp_path / "xcpu", 152)


def descendants(pid):
    """pid and every process below it (Linux's /proc)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds torchrun's workers in /proc")
def test_a_batch_system_s_stop_under_torchrun_saves(prepared, tmp_path):
    """scancel signals every process of the job, torchrun and its workers (each in a session of its own), and
    torchrun passes the signal on to each worker a moment later: the workers stop at the same step, rank 0 saves."""
    out = tmp_path / "ddp"
    proc, lines = run_until_step([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                  "train.py", f"--data_dir={prepared}", *LONG_STEP, "--batch_size=512", f"--out_dir={out}"],
                                 tmp_path)
    for pid in descendants(proc.pid):  # the job's every process, as scancel does
        os.kill(pid, signal.SIGTERM)
    assert_saved_stop(proc, lines, "SIGTERM", out)


def test_a_rank_that_dies_leaves_the_other_one_line(prepared, tmp_path):
    """The OOM killer takes one of torchrun's workers (SIGKILL): the other ended in a gloo traceback ("Connection closed
    by peer") inside DDP's backward. It now ends with one line saying that another process of the run ended, and the
    checkpoint saved before stays."""
    out, logs = tmp_path / "ddp", tmp_path / "logs"
    proc = spawn([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
                  "--redirects=3", "train.py", f"--data_dir={prepared}", *LONG_STEP, "--batch_size=512",
                  "--ckpt_interval_minutes=0", f"--out_dir={out}"], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rank_log = lambda rank, name: next(logs.glob(f"*/attempt_0/{rank}/{name}"), None)  # noqa: E731
    deadline = time.time() + 240
    while not (rank_log(0, "stdout.log") and "step 2 " in rank_log(0, "stdout.log").read_text() and
               (out / "ckpt.pt").exists()):
        assert time.time() < deadline and proc.poll() is None, "the run did not reach step 2"
        time.sleep(0.5)
    saved = torch.load(out / "ckpt.pt", weights_only=True)["step"]
    for pid in descendants(proc.pid)[1:]:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if b"\0RANK=1\0" in b"\0" + f.read():
                os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=180)
    lines = [line for line in rank_log(0, "stderr.log").read_text().splitlines() if line.strip()]
    # torchrun stops the survivors too (SIGTERM), and either may come first: each is one line that says what happened
    assert "Traceback" not in "\n".join(lines), lines[-20:]
    assert re.match(r"(\[rank0\]: )?(error: another process of this run ended|stopped by SIGTERM)", lines[-1]), lines[-5:]
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] >= saved


def test_a_person_s_second_ctrl_c_stops_at_once(prepared, tmp_path):
    """Ctrl-C, then Ctrl-C again a second later, in a step of 4,096 sequences (seconds long): killed by the
    second, as the terminal's default does, without waiting for the step or the save."""
    proc, lines = run_until_step([sys.executable, "train.py", f"--data_dir={prepared}", *LONG_STEP,
                                  "--batch_size=4096", f"--out_dir={tmp_path}"], tmp_path, step=1)
    time.sleep(0.5)  # inside step 2: a Ctrl-C between step 1's line and the next step's start stops there, gracefully
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT


def test_a_non_finite_gradient_skips_the_update():
    torch.manual_seed(0)
    rt = runtime.setup("cpu", "float32", compile=False)
    model = CrammedBert(vocab_size=300, seq_len=32, n_layers=2, d_model=64, n_heads=4, d_ffn=256)
    optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-3)
    idx = torch.randint(0, 296, (8, 32))
    batch = mask_tokens(idx, 0.25, 299, 296, torch.Generator().manual_seed(0))
    _, applied = Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast).step([batch], 1e-3, 0.5)
    assert applied
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps_before = optimizer.state_dict()["state"][0]["step"].item()
    poisoned = model.forward

    def nan_loss(*args):
        loss, correct = poisoned(*args)
        return loss * float("nan"), correct
    model.forward = nan_loss
    trainer = Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast)
    loss, applied = trainer.step([batch, batch], 1e-3, 0.5)
    assert not applied and not math.isfinite(loss)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # weights untouched
    assert optimizer.state_dict()["state"][0]["step"].item() == steps_before  # moments untouched
    assert all(p.grad is None for p in model.parameters())
    model.forward = poisoned
    assert Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast).step([batch], 1e-3, 0.5)[1]


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_a_checkpoint_that_would_run_code_is_refused(prepared, pretrained, tmp_path):
    marker = tmp_path / "code_ran"
    ckpt = torch.load(pretrained)
    ckpt["config"] = RunsCode(str(marker))
    torch.save(ckpt, tmp_path / "ckpt.pt")
    for proc in (run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL,
                            "--resume=True", check=False),
                 run_script("finetune_glue.py", f"--checkpoint={tmp_path / 'ckpt.pt'}", "--glue_dir=x", check=False)):
        assert_one_line_error(proc, "was refused", "could run code")
    assert not marker.exists()


def test_bad_run_settings_and_data(prepared, pretrained, tmp_path, corpus_file):
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL]
    assert_one_line_error(run_script(*train, "--budget_hours=0", check=False), "budget_hours must be > 0")
    assert_one_line_error(run_script(*train, "--budget_hours=-1", check=False), "budget_hours must be > 0")
    assert_one_line_error(run_script(*train, "--micro_batch=1.5", check=False), "--micro_batch expects int")
    # a data folder that is empty, half prepared or truncated
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_script("train.py", f"--data_dir={empty}", *TINY_MODEL, check=False), "prepare.py")
    half = tmp_path / "half"
    shutil.copytree(prepared, half)
    (half / "meta.json").unlink()
    assert_one_line_error(run_script("train.py", f"--data_dir={half}", *TINY_MODEL, check=False), "meta.json")
    truncated = tmp_path / "truncated"
    shutil.copytree(prepared, truncated)
    with open(truncated / "train.bin", "r+b") as f:
        f.truncate(1000)
    assert_one_line_error(run_script("train.py", f"--data_dir={truncated}", *TINY_MODEL, check=False),
                          "does not match meta.json")
    # resuming a checkpoint on data with another vocabulary, or another sequence length
    shutil.copy(pretrained, tmp_path / "ckpt.pt")
    for setting, name in (("--vocab_size=320", "vocab_size"), ("--seq_len=16", "seq_len")):
        other = tmp_path / f"other_{name}"
        run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={other}", "--vocab_size=384", "--seq_len=32",
                   "--val_fraction=0.05", setting)
        proc = run_script("train.py", f"--data_dir={other}", f"--out_dir={tmp_path}", *TINY_MODEL,
                          "--resume=True", check=False)
        assert_one_line_error(proc, f"differs from this config in {name}")
        assert (tmp_path / "ckpt.pt").read_bytes() == pretrained.read_bytes()


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(prepared, tmp_path):
    """The same advice everywhere: a fresh run onto a checkpoint names --resume=True and a larger
    budget; a resume of a run whose budget is spent says so, rewrites nothing, and a larger budget
    continues it."""
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--max_steps=5",
             "--fill_in_examples=0"]
    run_script(*train)
    assert_one_line_error(run_script(*train, check=False), "continue it with --resume=True", "also needs a larger one")
    before = {name: (tmp_path / name).read_bytes() for name in ("ckpt.pt", "metrics.jsonl")}
    again = run_script(*train, "--resume=True")
    assert "has spent this budget (step 5," in again.stdout and "a larger --max_steps (now 5)" in again.stdout
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    run_script(*train, "--resume=True", "--max_steps=8")
    assert torch.load(tmp_path / "ckpt.pt")["step"] == 8


def test_the_end_does_not_score_a_step_twice_and_a_resume_keeps_the_score_at_init(prepared, tmp_path):
    """With an evaluation every step, the last step's evaluation is the final one, not run again at the end. A resume
    scores nothing before its first step and reports its checkpoint's score at init; a checkpoint without one (written
    by hand) ends without it rather than with another score under that name."""
    args = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--compile=False",
            "--batch_size=16", "--log_interval=1", "--eval_interval_minutes=0", "--eval_sequences=32"]
    first = run_script(*args, "--max_steps=3").stdout
    assert re.findall(r"^eval  step (\d+)", first, re.M) == ["0", "1", "2", "3"], first
    init = re.search(r"at init ([\d.]+)", first).group(1)
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    second = run_script(*args, "--resume=True", "--max_steps=5").stdout
    assert re.findall(r"^eval  step (\d+)", second, re.M) == ["4", "5"] and f"(at init {init})" in second, second
    torch.save(dict(checkpoint, init_val_loss=None), tmp_path / "ckpt.pt")
    third = run_script(*args, "--resume=True", "--max_steps=4").stdout
    assert re.search(r"^final: step 4 \| val loss [\d.]+ \| masked-token", third, re.M), third


def test_the_log_says_the_budget_left_after_its_step_and_the_steps_in_all(prepared, tmp_path):
    """A token budget of five steps of 16 x 32 tokens: each step's line says the share left after that step, the last
    one none (the step that spends the budget may pass it; the line never says less than 0%), and that the run takes
    5 steps. With a batch that ramps from 16 to 32 over half the budget, 4,096 tokens take 4 steps of 16 and 2 of 32,
    and every line says 6; with max_steps=5 it says 5."""
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--log_interval=1",
             "--fill_in_examples=0", "--eval_sequences=32"]
    lines = run_script(*train, "--batch_size=16", "--budget_tokens=2560").stdout
    assert re.findall(r"\| (-?\d+)% of the budget left", lines) == ["80", "60", "40", "20", "0"], lines
    assert re.findall(r"left, about (\d+) steps in all", lines) == ["5"] * 5, lines
    for max_steps, steps in ((0, 6), (5, 5)):
        lines = run_script(*train, "--batch_size=32", "--batch_ramp_start=16", "--batch_ramp=0.5", "--budget_tokens=4096",
                           f"--max_steps={max_steps}", f"--out_dir={tmp_path / str(max_steps)}").stdout
        assert re.findall(r"left, about (\d+) steps in all", lines) == [str(steps)] * steps, lines


def test_a_run_stopped_on_its_last_step_is_finished_by_its_resume(prepared, tmp_path):
    """A stop signal on the step that spends the budget saves the checkpoint as not finished. Its resume takes no
    step: it evaluates, saves the run as finished and prints the final line. A second resume then has nothing to do."""
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--max_steps=5",
             "--fill_in_examples=0", "--eval_sequences=32"]
    run_script(*train)
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    torch.save(dict(checkpoint, final=False), tmp_path / "ckpt.pt")  # as a stop on step 5 leaves it
    finished = run_script(*train, "--resume=True").stdout
    assert "final: step 5 |" in finished and "has spent this budget" not in finished, finished
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert saved["final"] and saved["step"] == 5 and saved["tokens"] == checkpoint["tokens"]
    assert all(torch.equal(saved["model"][k], v) for k, v in checkpoint["model"].items())  # no step was taken
    assert "has spent this budget (step 5," in run_script(*train, "--resume=True").stdout
    torch.save({k: v for k, v in saved.items() if k != "final"}, tmp_path / "ckpt.pt")  # one that does not say
    assert "has spent this budget (step 5," in run_script(*train, "--resume=True").stdout


def test_a_checkpoint_s_setting_this_cram_lacks_is_refused_when_on(prepared, tmp_path):
    """A fork's new setting in a checkpoint (or a newer cram's): on, a resume here would run without it, so it is one
    line and the checkpoint untouched; off (0, False or empty), the run is the one this cram runs, and it resumes.
    A fork's model switch (a model_args field) alike."""
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--compile=False",
             "--batch_size=16", "--fill_in_examples=0", "--eval_sequences=32"]
    run_script(*train, "--max_steps=2")
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    for extra in (dict(my_regulariser=0.1), dict(span_masking=True, my_regulariser=0.0)):
        torch.save(dict(checkpoint, config=dict(checkpoint["config"], **extra)), tmp_path / "ckpt.pt")
        before = (tmp_path / "ckpt.pt").read_bytes()
        assert_one_line_error(run_script(*train, "--resume=True", "--max_steps=3", check=False),
                              f"a setting this cram does not have ({[*extra][0]}=", "resume it with the cram that wrote it")
        assert (tmp_path / "ckpt.pt").read_bytes() == before
    switch_on = dict(checkpoint, model_args=dict(checkpoint["model_args"], my_switch=True))
    torch.save(switch_on, tmp_path / "ckpt.pt")
    assert_one_line_error(run_script(*train, "--resume=True", "--max_steps=3", check=False),
                          "unknown model_args field(s) my_switch, on")
    torch.save(dict(checkpoint, config=dict(checkpoint["config"], my_regulariser=0.0, span_masking=False),
                    model_args=dict(checkpoint["model_args"], my_switch=False)), tmp_path / "ckpt.pt")
    assert "final: step 3 |" in run_script(*train, "--resume=True", "--max_steps=3").stdout


def test_a_resume_is_its_run_or_one_line(prepared, tmp_path):
    """A resume takes its run's settings from its checkpoint: a seed-7 token-budget run stopped at step 6 and resumed
    with its data, its shape and --resume=True alone logs the steps of the uninterrupted run (seed 0's order and a
    24-hour clock before). A given setting that would change the run is one line before any work, the checkpoint
    untouched: the seed, the masking (a case nobody named), the other kind of budget; a stability setting is said. A
    spent run's advice is a command that works, and its larger budget keeps the final batch."""
    base = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--log_interval=1", "--eval_sequences=32",
            "--fill_in_examples=0"]
    run, out = [*base, "--seed=7", "--budget_tokens=16384", "--batch_ramp_start=16"], tmp_path / "run"
    whole = step_lines(run_script(*run, f"--out_dir={tmp_path / 'whole'}").stdout)
    run_script(*run, f"--out_dir={out}", "--max_steps=6")
    resumed = step_lines(run_script(*base, f"--out_dir={out}", "--resume=True").stdout)
    assert min(resumed) == 7 and max(resumed) == max(whole) and {"16", "32"} <= {b for *_, b in whole.values()}
    assert all(resumed[s] == whole[s] for s in resumed), (resumed, whole)
    before = (out / "ckpt.pt").read_bytes()
    for args, fragment in ((["--seed=3"], "--seed=3 differs from its checkpoint's 7"),
                           (["--mask_rate=0.3"], "--mask_rate=0.3 differs from its checkpoint's 0.25"),
                           (["--budget_hours=2"], "to train further, give a larger --budget_tokens")):
        assert_one_line_error(run_script(*base, f"--out_dir={out}", "--resume=True", *args, check=False), fragment)
        assert (out / "ckpt.pt").read_bytes() == before, args
    spent = run_script(*base, f"--out_dir={out}", "--resume=True").stdout
    advice = re.search(r"resume it with a larger --budget_tokens \(now (\d+)\)", spent)
    assert advice, spent
    extend = [*base, f"--out_dir={out}", "--resume=True", f"--budget_tokens={2 * int(advice[1])}", "--grad_clip=1.0",
              "--batch_ramp=0.6"]  # the run's ramp, which the extension scales: the same command again is the same run
    longer = run_script(*extend).stdout
    assert "the schedules follow it from the progress so far, 50%" in longer and "the batch never shrinks" in longer, longer
    assert "resuming with --grad_clip=1 (its checkpoint's: 0.5)" in longer, longer
    steps = step_lines(longer)
    assert steps and {b for *_, b in steps.values()} == {"32"} and torch.load(out / "ckpt.pt")["tokens"] >= 32768
    assert "has spent this budget" in run_script(*extend).stdout


def test_a_resume_finds_its_data_and_refuses_other_data(prepared, corpus_file, tmp_path):
    """A checkpoint records where its data is, and what it is: resumed without --data_dir (from another folder) it
    finds it; the data prepared again there from more text, or with another validation share (a case nobody named),
    is one line naming the difference, the checkpoint untouched; another folder with the same files is the same run,
    one with other files is refused as well (tests/test_runs.py has the splits' cases)."""
    base, out, data = [*TINY_MODEL, "--fill_in_examples=0", "--eval_sequences=32"], tmp_path / "run", tmp_path / "data"
    shutil.copytree(prepared, data)
    run_script(os.path.join(ROOT, "train.py"), f"--data_dir={data}", f"--out_dir={out}", *base, "--max_steps=3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = run_script(os.path.join(ROOT, "train.py"), f"--out_dir={out}", *base, "--resume=True", "--max_steps=4",
                       cwd=elsewhere).stdout
    assert "at step 3," in found and torch.load(out / "ckpt.pt")["step"] == 4
    more, text = tmp_path / "more.txt", corpus_file.read_text()
    more.write_text(text + "\n" + "\n\n".join(synthetic_corpus(seed=1)) + "\n")  # new documents after the old
    before = (out / "ckpt.pt").read_bytes()
    trained = sum(len(doc) for doc in synthetic_corpus())  # the tokenizer trains on the old documents alone
    for name, args in (("more", [f"--dataset={more}", "--val_fraction=0.05", f"--tokenizer_train_chars={trained}"]),
                       ("split", [f"--dataset={corpus_file}", "--val_fraction=0.1"])):  # the same tokenizer, other rows
        shutil.rmtree(data)  # prepared again in its place, as prepare.py advises for a changed corpus
        run_script("prepare.py", *args, f"--out_dir={data}", "--vocab_size=384", "--seq_len=32")
        proc = run_script("train.py", f"--out_dir={out}", *base, "--resume=True", check=False)
        assert_one_line_error(proc, f"{data} is not the data", "its token files differ", "prepared again?")
        assert (out / "ckpt.pt").read_bytes() == before, name
    # another folder given: the same files resume as they are (a copy), other ones are refused as well
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    run_script("train.py", f"--data_dir={copy}", f"--out_dir={out}", *base, "--resume=True", "--max_steps=5")
    assert torch.load(out / "ckpt.pt")["step"] == 5
    other = run_script("train.py", f"--data_dir={data}", f"--out_dir={out}", *base, "--resume=True", "--max_steps=6",
                       check=False)
    assert_one_line_error(other, f"{data} is not the data", "its token files differ", f"--data_dir={copy}")
    os.replace(copy, tmp_path / "moved")  # the folder it trained on moved: a resume names the setting that finds it
    moved = run_script("train.py", f"--out_dir={out}", *base, "--resume=True", "--max_steps=7", check=False)
    assert_one_line_error(moved, f"error: {copy}, the data the run trained on, is not there", "--data_dir")
    run_script("train.py", f"--data_dir={tmp_path / 'moved'}", f"--out_dir={out}", *base, "--resume=True", "--max_steps=7")
    assert torch.load(out / "ckpt.pt")["step"] == 7


def test_a_cpu_time_limit_leaves_time_to_save(prepared, tmp_path):
    """`ulimit -t` sets the soft and hard CPU-time limits to one value (as a batch system's h_cpu does), so the kernel's
    SIGXCPU comes with its SIGKILL and nothing is saved: a run lowers its soft limit (5%, at least a minute, at most a
    quarter), and its SIGXCPU then stops the run, which saves and exits with that signal's status."""
    def limited():
        resource.setrlimit(resource.RLIMIT_CPU, (40, 40))  # lowered to 30: a quarter at most
    proc = subprocess.run([sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL,
                           "--budget_hours=1", "--fill_in_examples=0"], cwd=ROOT, preexec_fn=limited,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGXCPU and "stopped by SIGXCPU at step" in proc.stdout, proc.stderr[-2000:]
    assert torch.load(tmp_path / "ckpt.pt")["step"] > 0


@pytest.mark.parametrize("lacks", ["checkpoint", "data"])
def test_a_node_that_refuses_ends_the_other_within_its_join_wait(prepared, tmp_path, lacks):
    """docs/gpu.md's two-node command where node B's disk lacks the checkpoint that node A resumes: B says why in one
    line and ends before joining; A, which loaded it, waited in the join for gloo's 30 minutes and now ends after
    --join_minutes with one line saying another process of the run ended. B's disk lacking the data (a case nobody
    named) refuses after the join, before the work: A ends as soon, with the same line."""
    import socket
    nodes = {name: tmp_path / name for name in ("a", "b")}
    run_script("train.py", f"--data_dir={prepared}", f"--out_dir={nodes['a'] / 'run'}", *TINY_MODEL, "--max_steps=2")
    nodes["b"].mkdir()
    if lacks == "data":
        shutil.copytree(nodes["a"] / "run", nodes["b"] / "run")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    started, procs = time.monotonic(), {}
    for name, folder in nodes.items():  # A first: it holds the rendezvous, as the first node does
        procs[name] = spawn([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                             "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=cram",
                             f"--log-dir={folder / 'logs'}", "--redirects=3", os.path.join(ROOT, "train.py"),
                             f"--data_dir={prepared if name == 'a' or lacks != 'data' else folder / 'data'}",
                             "--out_dir=run", *TINY_MODEL, "--resume=True",
                             "--join_minutes=0.25"], cwd=folder, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
    for proc in procs.values():
        proc.wait(timeout=120)
    assert time.monotonic() - started < 60 and all(proc.returncode for proc in procs.values())
    last = {name: [line for line in next(folder.glob("logs/*/attempt_0/0/stderr.log")).read_text().splitlines()
                   if line.strip()][-1] for name, folder in nodes.items()}
    assert last["b"].startswith("error:") and ("run/ckpt.pt" if lacks == "checkpoint" else "not prepared") in last["b"], last
    assert last["a"].startswith("error: another process of this run ended"), last
