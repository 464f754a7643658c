import os
import re

import pytest

from cram.setup import schedule_line, split_micro_batches
from train import batch_size_at, lr_at, mask_rate_at, micro_batch_sizes


def test_triangle_learning_rate():
    peak = 1e-3
    assert lr_at(0.0, peak) == pytest.approx(0.25e-3)
    assert lr_at(0.5, peak) == pytest.approx(0.75e-3)
    assert lr_at(0.75, peak) == pytest.approx(1e-3)
    assert lr_at(0.875, peak) == pytest.approx(0.5e-3)
    assert lr_at(1.0, peak) == pytest.approx(0.0)
    assert lr_at(1.2, peak) == 0.0


def test_warmup_linear_learning_rate():
    peak = 1e-4
    assert lr_at(0.0, peak, "warmup_linear", 0.1) == 0.0
    assert lr_at(0.05, peak, "warmup_linear", 0.1) == pytest.approx(0.5e-4)
    assert lr_at(0.1, peak, "warmup_linear", 0.1) == pytest.approx(1e-4)
    assert lr_at(0.55, peak, "warmup_linear", 0.1) == pytest.approx(0.5e-4)
    assert lr_at(1.0, peak, "warmup_linear", 0.1) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        lr_at(0.5, peak, "no_such_schedule")


def test_batch_size_ramp():
    micro, final = 128, 8192
    assert batch_size_at(0.0, micro, final, 0.6) == 128
    assert batch_size_at(0.3, micro, final, 0.6) == 4096 + 64 - 64  # 128 + 8064/2 = 4160 -> 4096
    assert batch_size_at(0.6, micro, final, 0.6) == 8192
    assert batch_size_at(0.9, micro, final, 0.6) == 8192
    assert batch_size_at(0.5, micro, final, 0.0) == 8192
    sizes = [batch_size_at(i / 100, micro, final, 0.6) for i in range(101)]
    assert all(s % micro == 0 for s in sizes) and sizes == sorted(sizes)


def test_the_ramp_starts_at_its_own_start_whatever_the_micro_batch():
    sizes = [batch_size_at(i / 1000, 128, 8192, 0.6) for i in range(1001)]
    assert sizes[0] == 128 and all(s % 128 == 0 for s in sizes) and sizes == sorted(sizes) and sizes[600] == 8192
    assert batch_size_at(0.59, 100, 250, 0.6) == 200 and batch_size_at(0.6, 100, 250, 0.6) == 250  # final: not a multiple
    assert batch_size_at(0.0, 128, 64, 0.6) == 64  # a start at or above the final batch: no ramp
    for batch in range(64, 8193, 64):  # a process's share under 2 processes, micro-batches of 1,024 (unit 64)
        parts = micro_batch_sizes(2 * batch, 2, *split_micro_batches(2, 1024, 8192, 128, 0.6))
        assert sum(parts) == batch and set(parts) <= {1024, 64} and max(parts) <= batch


def test_any_batch_is_cut_whole_and_one_that_processes_cannot_share_is_refused():
    """micro_batch_sizes never drops a row: a batch outside the schedule's family (a fork's schedule, say 200 while
    the split was made for a start of 128) gets one more micro-batch of what is left; an uneven share is one line."""
    for world in (1, 2, 4):
        split = split_micro_batches(world, 64, 8192, 128, 0.6)
        for batch in range(world, 3001, world):
            parts = micro_batch_sizes(batch, world, *split)
            assert sum(parts) == batch // world and min(parts) > 0 and len(set(parts) - set(split)) <= 1, (world, batch)
    assert micro_batch_sizes(200, 1, 128, 128) == [128, 72]
    with pytest.raises(SystemExit, match="error: a batch of 201 sequences cannot be split evenly over 2 processes"):
        micro_batch_sizes(201, 2, 64, 64)


def test_masking_rate_schedule_is_a_pure_function_of_progress_in_few_levels():
    from train import mask_rate_at
    assert mask_rate_at(0.3, 0.25) == 0.25  # no start: the constant rate
    rates = [mask_rate_at(p / 100, 0.15, 0.3, 4) for p in range(101)]
    assert rates[0] == 0.3 and rates[-1] == pytest.approx(0.15) and sorted(set(rates), reverse=True) == \
        pytest.approx([0.3, 0.25, 0.2, 0.15])  # a linear fall in 4 equal steps
    assert rates == sorted(rates, reverse=True) and rates.count(rates[30]) == 25
    assert mask_rate_at(1.5, 0.15, 0.3, 4) == pytest.approx(0.15) and mask_rate_at(0.5, 0.15, 0.3, 1) == 0.3


def test_the_schedule_line_says_the_rates_the_loop_will_use():
    """The start-up line "schedule:" (printed by every run and --dry_run) gives the loop's rates at each quarter of
    the budget and its masking staircase, for either schedule and any number of levels, a falling staircase too, and
    where the checkpoints go. The line reads train.schedules_at with the run's settings, as the loop does."""
    import train
    for schedule, start, levels in (("triangle", 0.0, 4), ("warmup_linear", 0.15, 3), ("triangle", 0.4, 1),
                                    ("triangle", 0.3, 8), ("warmup_linear", 0.1, 7)):
        config = dict(lr=1e-3, lr_schedule=schedule, warmup=0.05, mask_rate=0.25, mask_rate_start=start,
                      mask_levels=levels, eval_interval_minutes=30.0, ckpt_interval_minutes=0.0, out_dir="runs/a",
                      keep_checkpoints=2, batch_ramp_start=128, batch_size=4096, batch_ramp=0.6, compile=True,
                      offload=False)  # as main decided them
        line = schedule_line(config, train.schedules_at, lambda batch: micro_batch_sizes(batch, 1, 1024, 128), 128)
        said = [float(v) for v in re.search(r"^schedule: lr (.*) at 0, 25, 50, 75 and 100% of the budget", line).group(1).split(", ")]
        assert said == pytest.approx([lr_at(p, 1e-3, schedule, 0.05) for p in (0, 0.25, 0.5, 0.75, 1)], rel=5e-3), line
        steps = re.search(r"masking rate (.*?);", line).group(1)
        rates = [mask_rate_at((k + 0.5) / levels, 0.25, start, levels) for k in range(levels)] if start else [0.25]
        if len(set(rates)) == 1:
            assert steps == f"{rates[0]:.3g} throughout", line
        else:  # each level's rate, from the share of the budget where it starts
            assert steps == ", ".join(f"{r:.3g} from {k / levels:.0%}" for k, r in enumerate(rates)), line
        assert ("an evaluation every 30 min and a checkpoint every step of training time, to "
                f"{os.path.join('runs', 'a', 'ckpt.pt')} (the last 2 kept); Ctrl-C or SIGTERM ends the step, saves and exits") in line


def test_a_schedule_that_needs_more_compiled_shapes_than_torch_allows_is_refused_at_start_up():
    """Each count of masked tokens per row, with each micro-batch size it meets, is a graph torch.compile builds, and a
    compiled function may build runtime.MAX_GRAPHS. A fork's smooth masking schedule (0.40 to 0.15 in a straight line:
    33 counts in rows of 128) is refused by the start-up line in one line, before any step, where it would fail
    mid-run. The built-in staircase at its most (8 levels) beside the ramp's two micro-batch sizes fits, and an
    uncompiled run is not refused."""
    import train
    from cram import runtime
    config = dict(lr=1e-3, lr_schedule="triangle", warmup=0.0, mask_rate=0.15, mask_rate_start=0.4, mask_levels=8,
                  eval_interval_minutes=30.0, ckpt_interval_minutes=60.0, out_dir="out", keep_checkpoints=3,
                  batch_ramp_start=128, batch_size=4096, batch_ramp=0.6, compile=True, offload=False)
    sizes = lambda batch: micro_batch_sizes(batch, 1, 1024, 128)  # noqa: E731 (the ramp's sizes: 1024 and 128)
    assert "masking rate 0.4 from 0%" in schedule_line(config, train.schedules_at, sizes, 128)  # 8 x 2 shapes fit
    smooth = lambda progress, run: (*train.schedules_at(progress, run)[:2], 0.4 - 0.25 * progress)  # noqa: E731
    with pytest.raises(SystemExit) as refused:
        schedule_line(config, smooth, sizes, 128)
    message = str(refused.value)
    assert message.startswith("error: the schedules need ") and "\n" not in message
    assert int(message.split()[4]) > runtime.MAX_GRAPHS and f"more than torch.compile's {runtime.MAX_GRAPHS}" in message
    assert "masking rate 0.4 at the start to" in schedule_line(dict(config, compile=False), smooth, sizes, 128)


def test_a_run_with_a_schedule_compiles_a_graph_per_level(prepared, tmp_path):
    """dynamic=False: each masking rate a static graph, and no more graphs than levels."""
    from conftest import TINY_MODEL, run_script
    from cram.files import read_metrics
    proc = run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--compile=True",
                      "--budget_tokens=20480", "--mask_rate_start=0.4", "--mask_levels=2", "--fill_in_examples=0")
    assert "torch.compile built 2 graph(s) for the training step" in proc.stdout
    assert read_metrics(tmp_path)[-1]["val_loss"] < read_metrics(tmp_path)[0]["val_loss"]
