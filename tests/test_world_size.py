"""The global batch at a step is its run's schedule's (train.batch_size_at, a pure function of the run's progress)
at any number of processes, and a resume in another number reads the same sequences (issue 87, item 6): the per-process
split (setup.split_micro_batches, train.micro_batch_sizes) over many worlds, micro-batches and batches; real runs over gloo
resumed 1 -> 2 -> 4 -> 1 processes, each step's rows read by every process; one line where a world cannot split it."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_MODEL, run_script, spawn
from cram.files import load_meta, read_jsonl
from cram.setup import split_micro_batches
from train import Batches, batch_size_at, micro_batch_sizes, rows_at

# a token budget (the schedule a pure function of tokens), the ramp from 16 to 32 sequences over its first fifth: steps
# 1 to 20 take 16, then 32
RUN = [*TINY_MODEL, "--batch_ramp_start=16", "--batch_ramp=0.2", "--budget_tokens=49152", "--log_interval=1", "--eval_sequences=32",
       "--fill_in_examples=0"]

# train.py run with cram.data.get_batch watched: each training read's rows, a line per read, in rows_<rank>.txt
SPY = """import os, runpy, sys
sys.path.insert(0, {root!r})
from cram import data
read = data.get_batch
def get_batch(tokens, rows, device):
    if getattr(tokens, "filename", "").endswith("train.bin"):
        with open(os.path.join({out!r}, "rows_" + os.environ.get("RANK", "0") + ".txt"), "a") as f:
            f.write(" ".join(map(str, rows)) + chr(10))
    return read(tokens, rows, device)
data.get_batch = get_batch
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


def schedule_batches(start, final, ramp, points=200):
    """Every global batch the schedule gives over the budget."""
    return sorted({batch_size_at(i / points, start, final, ramp) for i in range(points + 1)})


def test_the_split_gives_the_schedule_s_batch_at_any_world_or_says_why_not():
    """Over worlds 1-8, micro-batches 1-40 and ramps from 1 to 48 sequences to final batches up to 96: either one line
    refuses (exactly where some batch of the schedule is not a multiple of the world), or each process's micro-batches,
    none above the micro-batch and two shapes at most in the whole run, add up to the schedule's batch exactly; the
    fewest that can without a ramp (issue 93: 33 over 3 processes ran eleven of 1), and with one never more than the
    old split's (the cap and what divides every share)."""
    refused = split = 0
    for world, micro, start, final, ramp in itertools.product((1, 2, 3, 4, 8), (1, 3, 4, 16, 40), range(1, 49, 3),
                                                              range(1, 97, 5), (0.0, 0.6)):
        batches = schedule_batches(start, final, ramp)
        try:
            cut = split_micro_batches(world, micro, final, start, ramp)
        except SystemExit as e:
            assert any(b % world for b in batches), (world, micro, start, final, ramp)
            assert str(e).startswith("error: ") and "\n" not in str(e) and f"over {world} processes" in str(e)
            refused += 1
            continue
        shapes, old_unit = set(), np.gcd.reduce([micro, final // world, start // world if ramp and start < final else 0])
        for batch in batches:
            sizes = micro_batch_sizes(batch, world, *cut)
            assert world * sum(sizes) == batch and max(sizes) <= micro, (world, micro, start, final, ramp, batch, sizes)
            share = batch // world
            assert len(sizes) <= share // micro + share % micro // old_unit
            assert len(sizes) == -(-share // micro) or ramp and start < final, (world, micro, start, final, batch, sizes)
            shapes |= set(sizes)
        assert len(shapes) <= 2
        split += 1
    assert refused > 100 and split > 1000


def rows_of(micro_batches):
    """The rows a process's micro-batches hold (each row of the fake data is its own index, kept in the labels)."""
    return [int(r) for _, _, labels in micro_batches for r in labels[:, 0]]


@pytest.mark.parametrize("order", ["shuffled", "file"])
def test_a_step_reads_the_same_sequences_at_any_world_and_micro_batch(order):
    """The data a step reads (Batches.for_step, rows_at): all the processes together read the sequences consumed ..
    consumed + batch - 1 of the run's order, each once, whatever the world and the micro-batch; in the second epoch too."""
    n_rows, seq_len = 500, 8
    tokens = np.repeat(np.arange(n_rows, dtype=np.uint16)[:, None], seq_len, axis=1)  # row i holds i
    meta = dict(special_ids={"[MASK]": 1000}, n_regular=999)
    for consumed, start, final in ((0, 16, 48), (96, 16, 48), (480, 12, 36)):  # 480: the step crosses into epoch 2
        for batch in schedule_batches(start, final, 0.6):
            want = sorted(rows_at(consumed, batch, n_rows, 0, order))
            for world, micro in ((1, 32), (1, 5), (2, 16), (2, 4), (4, 3), (4, 16)):
                if batch % world or start % world:
                    continue
                split = split_micro_batches(world, micro, final, start, 0.6)
                got = [rows_of(Batches(tokens, meta, rank, world, torch.device("cpu"), 0, order).for_step(
                    consumed, micro_batch_sizes(batch, world, *split), 0.25)) for rank in range(world)]
                assert sorted(sum(got, [])) == want, (consumed, batch, world, micro)


def launch(args, out, world, spy_dir):
    """train.py `args` (rows watched into spy_dir) in `world` processes: one with python, more with torchrun over gloo."""
    spy = spy_dir / "spy.py"
    spy.write_text(SPY.format(root=ROOT, out=str(spy_dir)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    head = [sys.executable] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                f"--nproc_per_node={world}"]
    proc = spawn([*head, str(spy), *args, f"--out_dir={out}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, (stdout[-2000:], stderr[-3000:])
    reads = {}
    for path in spy_dir.glob("rows_*.txt"):
        reads[int(path.stem[5:])] = [[int(row) for row in line.split()] for line in path.read_text().splitlines()]
        path.unlink()
    return stdout, reads


def test_a_run_resumed_in_1_2_4_and_1_processes_keeps_its_schedule_and_its_rows(prepared, tmp_path):
    """Issue 87's case: a run of one process stopped at step 8 and resumed with the same command under torchrun with
    2 processes; then 4 (refused before: '--batch_size=32 must be a multiple of --micro_batch=16 times the 4
    process(es)', though each process can take 8 of the 32), then 1 again. Each step takes the schedule's batch
    (16 to step 20, then 32), from the sequences the run's order has there, each read once."""
    args, out, legs = [f"--data_dir={prepared}", *RUN], tmp_path / "run", []
    for world, last in ((1, 8), (2, 12), (4, 14), (1, 21)):
        resume = ["--resume=True"] if last > 8 else []
        stdout, reads = launch([*args, *resume, f"--max_steps={last}"], out, world, tmp_path)
        assert f"device: cpu, float32{f' x{world}' if world > 1 else ''}" in stdout and f"step {last} |" in stdout
        legs += [(world, reads)] * (last - len(legs))  # the world of each step, and its rows' reads
    log = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in log] == list(range(1, 22))
    n_rows, consumed = load_meta(prepared)["train_sequences"], 0
    for r, (world, reads) in zip(log, legs):
        batch = batch_size_at(consumed * 32 / 49152, 16, 32, 0.2)  # the schedule at the step's start
        assert r["batch"] == batch == (16 if r["step"] <= 20 else 32), r
        micro_batches = len(micro_batch_sizes(batch, world, *split_micro_batches(world, 16, 32, 16, 0.2)))
        rows = [row for rank in range(world) for _ in range(micro_batches) for row in reads[rank].pop(0)]
        assert sorted(rows) == sorted(rows_at(consumed, batch, n_rows, 0)), r  # once each, where the run's order is
        consumed += batch
        assert r["tokens"] == consumed * 32
    assert all(not lines for _, reads in legs for lines in reads.values())  # no read left over


def refusal(args, world, monkeypatch):
    """train.py's one-line error as process 0 of `world` under torchrun (the check comes before the processes join)."""
    import runpy
    for key, value in dict(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    message = str(stop.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_a_world_that_cannot_split_the_batches_says_so_in_one_line(prepared, tmp_path, monkeypatch):
    """3 processes cannot share 32 sequences, nor a ramp from 16 to 48, evenly: one line each, naming what would."""
    common = [f"--data_dir={prepared}", *TINY_MODEL, f"--out_dir={tmp_path}"]
    assert "--batch_size=32 sequences cannot be split evenly over 3 processes" in refusal(common, 3, monkeypatch)
    message = refusal([*common, "--batch_size=48", "--batch_ramp_start=16"], 3, monkeypatch)
    assert "--batch_ramp_start=16 sequences cannot be split evenly over 3 processes" in message
    assert "a number of processes that divides 16" in message
    assert not (tmp_path / "ckpt.pt").exists()


def test_a_micro_batch_that_does_not_divide_the_batch_is_a_cap(prepared, tmp_path):
    """--micro_batch is the most a process runs at once: 40 sequences at 16 are 16 + 16 + 8 (refused before)."""
    proc = run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--batch_size=40",
                      "--max_steps=2", "--fill_in_examples=0")
    assert "micro-batches of 16 per process (and of 8 for the rest)" in proc.stdout
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["tokens"] == 2 * 40 * 32


def test_the_split_takes_the_fewest_micro_batches_and_the_start_up_line_says_what_runs(prepared, tmp_path):
    """Issue 93: --micro_batch=48 --batch_size=32 ran 16 + 16 while the start-up line said 'of 48': one of 32 now, said so;
    and a case nobody named, 44 at 16 (16 + 16 + 4 + 4 + 4 before), runs 16 + 16 + 12."""
    assert split_micro_batches(3, 16, 33, 128, 0.6) == (11, 11) and micro_batch_sizes(33, 3, 11, 11) == [11]
    assert micro_batch_sizes(44, 1, *split_micro_batches(1, 16, 44, 128, 0.6)) == [16, 16, 12]
    proc = run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--micro_batch=48",
                      "--max_steps=2", "--fill_in_examples=0")
    assert "; micro-batches of 32 per process\n" in proc.stdout, proc.stdout
