"""The budget picks the shape, the final batch and the peak learning rate (cram/budget.py): its picks at a
CPU budget, near 1e17 FLOPs, at the paper's 24 hours and at an H100's day; a small corpus; settings
given win; a resumed run keeps its checkpoint's shape, batch and rate."""
import dataclasses
import functools
import json
import re

import pytest
import torch

from configurator import config_keys
from conftest import ROOT, TINY_MODEL, run_script, slow
from model import ModelConfig, lr_for_width
from cram.budget import (LADDER, MAX_EPOCHS, STEP_EFFICIENCY, batch_for_budget, cpu_bf16_gain, expected_steps,
                         shape_for_budget, shape_of, step_efficiency)
from train import batch_size_at

BOOKS = dataclasses.asdict(ModelConfig(vocab_size=32768, seq_len=128))  # train.py's recipe on a 32k vocabulary
DAY, FINEWEB = 24 * 3600, 10e9  # seconds; the tokens of FineWeb-Edu's 10BT sample


def pick(seconds, matmul_flops, data_tokens, tokens=0, gpu=None):
    """(layers, width), the rung nearest the compute, tokens and final batch for a budget on a device
    whose 2048^3 matmul runs at matmul_flops (a GPU's where above 10 TFLOP/s, unless `gpu` says)."""
    share = functools.partial(step_efficiency, gpu=matmul_flops > 10e12 if gpu is None else gpu)
    rung, nearest, trained = shape_for_budget(seconds * matmul_flops, tokens, data_tokens, BOOKS, 0.25, share)
    return rung, nearest, trained, batch_for_budget(trained, 128)


@pytest.mark.parametrize("where,seconds,matmul,data,shape,batch,lr", [
    # 20 minutes of a 2-core CPU (a float32 matmul at 0.37 TFLOP/s) on 67M tokens of books
    ("a CPU's 20 minutes", 1200, 370e9, 67e6, (4, 256), 64, 1.73e-3),
    # six H100 minutes, about 1e17 FLOPs, with ample data: 8 x 512 (ELECTRA-Small's class, 21M in the blocks)
    ("1e17 FLOPs", 360, 688e12, FINEWEB, (8, 512), 1024, 1.22e-3),
    # an RTX A6000's bfloat16 matmul at about 100 TFLOP/s (65% of its 155 TFLOP/s peak, as an H100 reaches of its
    # own): the paper's shape and rate, the published 4k batch (the paper's best for GLUE; Izsak et al. 2021)
    ("the paper's day", DAY, 100e12, FINEWEB, (16, 768), 4096, 1e-3),
    # an H100 (a 2048^3 bfloat16 matmul at 688 TFLOP/s, as the README's lines): 8x the compute, BERT-Large's shape,
    # the batch levelled off within 2x of Izsak's 4k at that compute, a rate below the paper's as large models' are
    ("an H100's day", DAY, 688e12, FINEWEB, (24, 1024), 8192, 8.66e-4),
])
def test_the_rule_s_picks_shape_batch_and_rate(where, seconds, matmul, data, shape, batch, lr):
    rung, _, _, final = pick(seconds, matmul, data)
    assert (rung, final) == (shape, batch) and lr_for_width(rung[1]) == pytest.approx(lr, rel=0.01), where


def test_a_cpu_budget_in_bfloat16_buys_the_step_s_gain_not_the_matmul_s():
    """A CPU's bfloat16 step gains on float32's where its matmuls do, less: the rest of the step (a
    quarter of float32's) does not speed up."""
    epyc, amx = cpu_bf16_gain(2.2), cpu_bf16_gain(10.0)
    assert 1.5 < epyc < 1.7 and 2.7 < amx < 3.0 and cpu_bf16_gain(1.0) < 1  # its rest costs 1.08x float32's


def test_about_1e17_flops_picks_a_small_model_and_many_steps():
    # six H100 minutes, about 1e17 FLOPs, with ample data: 8 x 512 (ELECTRA-Small's class, 21M in the blocks)
    rung, nearest, tokens, batch = pick(360, 650e12, FINEWEB)
    assert rung == nearest == (8, 512) and batch == 1024 and 5e8 < tokens < 1e9
    assert expected_steps(tokens / 128, 512, batch, 0.6) > 1000  # the paper's shape would take about 300


def test_cpu_budgets_pick_the_cpu_sweeps_shape():
    # 45 minutes of the 2-core EPYC (a 2048^3 matmul at 0.111 TFLOP/s, 1.5e14 FLOPs): 3 x 192 at a batch of 64,
    # the shape sweep's best there (4.60 against 4 x 256's 4.70 and 5 x 320's 4.73)
    assert pick(2700, 111e9, 67e6)[::3] == ((3, 192), 64)
    # 20 minutes of a 2-core CPU whose float32 matmul runs at 200-370 GFLOP/s: near the boundary of 3 x 192 and
    # 4 x 256 (at 20 minutes 4 x 256 beat 6 x 384 and 8 x 512), 4-7M tokens, a final batch of 64
    for matmul, rung in ((200e9, (3, 192)), (370e9, (4, 256))):
        picked, _, tokens, batch = pick(1200, matmul, 67e6)
        assert picked == rung and batch in (32, 64) and 3.5e6 < tokens < 7.5e6
    assert pick(60, 200e9, 67e6)[0] == (2, 128) and pick(2 * 3600, 370e9, 67e6)[0] > (4, 256)  # a minute; two hours


def test_the_batch_rule_passes_through_the_published_4k_and_the_cpu_batch_sweep_and_levels_off():
    assert batch_for_budget(54e6 * 128, 128) == 4096  # the paper's day: 54M sequences, the published ~4k
    assert batch_for_budget(29e3 * 128, 128) == 32  # 15 CPU minutes of 3 x 192: 32 beat 64 and 128
    assert batch_for_budget(1e5, 128) == 32  # never below a CPU's micro-batch
    assert batch_for_budget(1e13, 128) == 8192  # past twice the paper's day: no published gain from more
    sizes = [batch_for_budget(10 ** e * 128, 128) for e in range(3, 12)]
    assert sizes == sorted(sizes)  # more sequences, never a smaller batch


def test_the_rate_falls_with_the_width():
    rates = [lr_for_width(width) for _, width in LADDER]
    assert rates == sorted(rates, reverse=True) and lr_for_width(768) == 1e-3
    assert lr_for_width(256) == pytest.approx(1.73e-3, rel=0.01)  # the quickstart's hand-tuned 2e-3, within 15%


def test_a_small_corpus_moves_to_a_larger_shape_up_to_four_times_the_best_size():
    # six H100 minutes on 23M tokens: 8 x 512 would read them 32 times, so a larger shape that reads fewer tokens
    rung, nearest, tokens, _ = pick(360, 650e12, 23e6)
    assert nearest == (8, 512) and rung > nearest and tokens <= MAX_EPOCHS * 23e6
    # a corpus far too small for any shape: the largest rung within 4x the best size (22M), 12 x 768 (71M), not 16 x 768
    rung, nearest, _, _ = pick(360, 650e12, 1e5)
    assert nearest == (8, 512) and rung == (12, 768) and LADDER[-1] == (24, 1024)


def test_on_a_gpu_a_narrow_step_reaches_less_of_the_matmul_and_the_rule_keeps_the_shape_that_trained_better():
    """One H200, 3.5 minutes each on the 26.4M carried tokens (BENCHMARKS.md, "The GPU transfers"): 8 x 512 trained
    367M tokens (0.44 of its 692 TFLOP/s matmul) to val loss 2.862, 10 x 640 221M (0.50 of 677) to 2.937. A share
    fixed at 0.5 had 8 x 512 read the data over 16 times and took 10 x 640; the share by width estimates both runs'
    tokens within 5% and keeps 8 x 512. A CPU's share is the same at every width."""
    for rung, matmul, measured in (((8, 512), 692e12, 366.9e6), ((10, 640), 677e12, 221.1e6)):
        per_token = ModelConfig(**{**BOOKS, **shape_of(rung, {})}).flops_per_token(0.25)
        assert 210 * matmul * step_efficiency(rung[1], gpu=True) / per_token == pytest.approx(measured, rel=0.05)
    assert pick(210, 677e12, 26.4e6)[:2] == ((8, 512), (8, 512))
    fixed = shape_for_budget(210 * 677e12, 0, 26.4e6, BOOKS, 0.25, lambda width: STEP_EFFICIENCY)
    assert fixed[:2] == ((10, 640), (8, 512))  # the fixed share's pick
    assert step_efficiency(128, gpu=False) == step_efficiency(1024, gpu=False) == STEP_EFFICIENCY


def test_an_eager_or_off_load_step_buys_fewer_tokens_and_can_move_the_pick():
    """The share is a compiled normal step's; an eager one (compiled runs 1.48x eager on the H100) trains fewer tokens
    in the same minutes, and off-load mode, which runs eager whatever --compile says, fewer still. Where the data is
    short, at a fast GPU's matmul (900 TFLOP/s) an eager 8 x 512 stays under 16 epochs and keeps its shape, which the
    compiled step's estimate gives up for 10 x 640."""
    compiled, eager = step_efficiency(512, gpu=True), step_efficiency(512, gpu=True, compiled=False)
    offloaded = step_efficiency(512, gpu=True, offload=True)
    assert offloaded == step_efficiency(512, gpu=True, compiled=False, offload=True) < eager < compiled
    share = functools.partial(step_efficiency, gpu=True, compiled=False)
    rung, nearest, tokens = shape_for_budget(210 * 900e12, 0, 26.4e6, BOOKS, 0.25, share)
    assert rung == nearest == (8, 512) and tokens <= MAX_EPOCHS * 26.4e6
    assert pick(210, 900e12, 26.4e6)[:2] == ((10, 640), (8, 512))  # compiled: over 16 epochs, a larger rung


def test_a_token_budget_needs_no_speed_and_ignores_the_compute():
    a = shape_for_budget(0.0, 5_000_000, 1e5, BOOKS, 0.25, step_efficiency)
    b = shape_for_budget(1e30, 5_000_000, 1e5, BOOKS, 0.25, step_efficiency)
    assert a == b and a[2] == 5_000_000 and a[0] == a[1]  # no move for the data: its tokens are fixed


def test_given_settings_replace_the_pick_and_the_width_brings_its_heads_and_feed_forward():
    assert shape_of((8, 512), {}) == dict(n_layers=8, d_model=512, n_heads=8, d_ffn=2048)
    assert shape_of((8, 512), dict(d_model=320)) == dict(n_layers=8, d_model=320, n_heads=5, d_ffn=1280)
    assert shape_of((8, 512), dict(n_layers=3, n_heads=4, d_ffn=1000)) == dict(n_layers=3, d_model=512, n_heads=4,
                                                                               d_ffn=1000)
    assert shape_of((2, 128), dict(d_model=32)) == dict(n_layers=2, d_model=32, n_heads=1, d_ffn=128)
    assert shape_of((8, 512), dict(d_model=200))["n_heads"] == 2  # 3 heads (200 / 64) do not divide 200: 2 do
    assert shape_of((8, 512), dict(n_heads=12)) == dict(n_layers=8, d_model=516, n_heads=12, d_ffn=2064)


def test_expected_steps_follow_the_ramp():
    for start, final, ramp in ((32, 256, 0.6), (16, 16, 0.6), (128, 8192, 0.0), (64, 1024, 1.0), (128, 64, 0.6),
                               (100, 250, 0.6)):
        sequences, steps, done = 2e6, 0, 0.0
        while done < sequences:  # the loop's batches, the progress being the share of sequences trained
            done += batch_size_at(done / sequences, start, final, ramp)
            steps += 1
        assert expected_steps(sequences, start, final, ramp) == pytest.approx(steps, rel=0.02)


def test_a_resume_keeps_its_ramp_and_an_older_checkpoint_ramps_from_its_micro_batch(tmp_path):
    """resume_settings: a resumed run ramps from its own start (not the default's 128); a checkpoint from before the
    setting ramped from its micro-batch (one process's, as train.py then did); another start given is refused."""
    import train
    from cram.setup import resume_settings
    config = dict(config_keys(vars(train)), data_dir=str(tmp_path))
    saved = dict(config, batch_size=64, lr=1e-3, micro_batch=16, batch_ramp_start=48)
    ckpt = dict(model_args=dict(n_layers=2, d_model=64, n_heads=2, d_ffn=256, vocab_size=512, seq_len=32),
                config=saved, tokens=0, elapsed=0.0, data_dir=str(tmp_path))
    assert resume_settings(ckpt, config, {})[0]["batch_ramp_start"] == 48
    older = dict(ckpt, config={k: v for k, v in saved.items() if k != "batch_ramp_start"})
    assert resume_settings(older, config, {})[0]["batch_ramp_start"] == 16
    with pytest.raises(SystemExit, match=r"--batch_ramp_start=32 differs from its checkpoint's 48"):
        resume_settings(ckpt, dict(config, batch_ramp_start=32), {"batch_ramp_start": {"--": 32}})


def test_a_run_picks_its_shape_says_why_and_keeps_it_on_resume(prepared, tmp_path):
    """No shape or batch given: the token budget picks both (no speed measured: reproducible), the
    start-up line says the pick, the checkpoint keeps it; a resume with a larger budget keeps the shape
    and batch although the larger budget alone would pick others; a time budget measures the device;
    a given width replaces the pick's, with its heads and feed-forward."""
    settings = [a for a in TINY_MODEL if not re.match(r"--(n_layers|d_model|n_heads|d_ffn|batch_size|lr)=", a)]
    common = ["train.py", f"--data_dir={prepared}", *settings, "--fill_in_examples=0"]
    first = run_script(*common, f"--out_dir={tmp_path / 'a'}", "--budget_tokens=8192").stdout
    line = re.search(r"^budget: 8,192 tokens, [\d.e+]+ FLOPs -> 2 x 128 \(the ladder's 2 x 128, nearest that "
                     r"compute\), about 0.0M tokens \([\d.]+ epochs\), a final batch of 32 sequences, about \d+ "
                     r"optimizer steps$", first, re.M)
    assert line, first
    # every setting whose 0 the start-up decides, in one line, with why (setup.settled_line)
    assert re.search(r"^settled: n_layers=2, d_model=128, batch_size=32 \(the budget's pick\); "
                     r"n_heads=2 \(the most heads at least 64 wide, or one\); d_ffn=512 \(4 x d_model\); "
                     r"lr=0.00245 \(the width's rule, 0.001 x \(128 / 768\) \*\* -0.5, tuned for AdamW\); "
                     r"micro_batch=16 \(given\)$", first, re.M), first
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    assert (ckpt["model_args"]["n_layers"], ckpt["model_args"]["d_model"], ckpt["config"]["batch_size"]) == (2, 128, 32)
    assert ckpt["budget"]["taken"] == [2, 128] and ckpt["budget"]["matmul_flops"] == 0.0
    assert shape_for_budget(0, 5_000_000, 1e9, dict(ckpt["model_args"], n_layers=2), 0.25, step_efficiency)[0] != (2, 128)
    resumed = run_script(*common, f"--out_dir={tmp_path / 'a'}", "--budget_tokens=5000000", "--max_steps=20",
                         "--resume=True").stdout
    assert "budget:" not in resumed and max(map(int, re.findall(r"\| batch (\d+) \|", resumed))) <= 32
    assert re.search(r"^settled: n_layers=2, d_model=128, batch_size=32, n_heads=2, d_ffn=512, lr=0.00245 "
                     r"\(its checkpoint's\); micro_batch=16 \(given\)$", resumed, re.M), resumed
    again = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    assert again["model_args"] == ckpt["model_args"] and again["config"]["batch_size"] == 32 and again["step"] == 20
    assert again["config"]["lr"] == ckpt["config"]["lr"] == pytest.approx(2.449e-3, rel=1e-3) and "width's rule" not in resumed
    # a given rate wins on a resume too (the divergence message's "lower --lr and resume it")
    run_script(*common, f"--out_dir={tmp_path / 'a'}", "--budget_tokens=5000000", "--max_steps=22", "--resume=True",
               "--lr=1e-3")
    assert torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)["config"]["lr"] == 1e-3
    # in bfloat16 too, a CPU's budget is timed in float32, times bfloat16's gain in the step (budget.cpu_bf16_gain)
    timed = run_script(*common, f"--out_dir={tmp_path / 'b'}", "--budget_hours=0.0005", "--d_model=96",
                       "--dtype=bfloat16").stdout
    assert re.search(r"^budget: 0.03 min x [\d.]+ TFLOP/s \(a float32 2048\^3 matmul here\) x [\d.e+-]+ \(bfloat16's "
                     r"step over float32's here\) x 0.44 \(a step's share of it\) = [\d.e+]+ FLOPs -> 2 x 96 \(the ladder's 2 x 128, [^;]+; given: "
                     r"d_model\)", timed, re.M), timed
    assert "device: cpu, bfloat16" in timed
    args = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["model_args"]
    assert (args["d_model"], args["n_heads"], args["d_ffn"]) == (96, 1, 384)
    # the step's share is the run's: eager above (0.5 x 0.88), off-load mode's lower still (x 0.85)
    offloaded = run_script(*common, f"--out_dir={tmp_path / 'c'}", "--budget_hours=0.0005", "--d_model=96",
                           "--offload=True").stdout
    assert re.search(r"^budget: 0.03 min x [\d.]+ TFLOP/s \(a float32 2048\^3 matmul here\) x 0.37 \(a step's share of it\)",
                     offloaded, re.M), offloaded


def test_what_the_budget_picks_is_the_module_s_global_once_the_run_starts(prepared, tmp_path):
    """train.py's globals are what runs: after the budget and the probe, its lr, batch_size, shape and
    micro_batch hold the values the run trains with (0 = by the budget only until then)."""
    picked = ("n_layers", "d_model", "n_heads", "d_ffn", "batch_size", "lr", "micro_batch")
    settings = [a for a in TINY_MODEL if not re.match(r"--(n_layers|d_model|n_heads|d_ffn|batch_size|lr|micro_batch)=", a)]
    code = ("import json, runpy, sys; sys.argv = sys.argv[1:]; run = runpy.run_path('train.py', run_name='__main__'); "
            f"print(json.dumps({{k: run[k] for k in {picked!r}}}))")
    out = run_script("-c", code, "train.py", f"--data_dir={prepared}", *settings, "--fill_in_examples=0",
                     f"--out_dir={tmp_path}", "--budget_tokens=8192").stdout
    seen = json.loads(out.splitlines()[-1])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    ran = {k: ckpt["model_args"][k] for k in picked[:4]} | {k: ckpt["config"][k] for k in picked[4:]}
    assert seen == ran and all(seen.values()), (seen, ran)


@slow
def test_the_picture_of_the_best_shape_against_compute(prepared, tmp_path):
    """tools/shape_plot.py reads a sweep (compare.py's layout: <minutes>/results.json and each variant's
    seed0 checkpoint), keeps its points and draws them beside the rule's line; a second drawing needs
    no runs."""
    import json
    settings = [a for a in TINY_MODEL if not re.match(r"--(n_layers|d_model|n_heads|d_ffn|batch_size)=", a)]
    sweep = tmp_path / "sweep" / "0.05"
    for variant, extra, loss in (("crammed", [], 6.1), ("n_layers=3", ["--n_layers=3"], 6.3)):
        run_script("train.py", f"--data_dir={prepared}", f"--out_dir={sweep / variant / 'seed0'}", *settings, *extra,
                   "--budget_hours=0.0005", "--fill_in_examples=0")
        results = json.loads((sweep / "results.json").read_text()) if (sweep / "results.json").exists() else {"variants": {}}
        results["variants"][variant] = {"val_loss": [loss]}
        (sweep / "results.json").write_text(json.dumps(results))
    points, png, batch_png = tmp_path / "points.json", tmp_path / "shape.png", tmp_path / "batch.png"
    out = run_script("tools/shape_plot.py", f"--sweep_dir={tmp_path / 'sweep'}", f"--points={points}", f"--png={png}",
                     "--machine=test CPU", f"--batch_png={batch_png}").stdout
    assert f"wrote {points}: 0.05 min, test CPU" in out and png.read_bytes()[:4] == b"\x89PNG"
    assert batch_png.read_bytes()[:4] == b"\x89PNG"  # the batch law beside its measured and published points
    column = json.loads(points.read_text())["0.05 min, test CPU"]
    assert column["compute"] > 0 and [s["shape"] for s in column["shapes"]] == [[2, 128], [3, 128]]
    assert column["shapes"][0]["weights"] == 2 * 10 * 128 ** 2 and column["shapes"][1]["val_loss"] == 6.3
    png.unlink()
    run_script("tools/shape_plot.py", f"--points={points}", f"--png={png}", "--batch_png=")  # from the kept points alone
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_readme_s_start_up_lines_for_an_h100_s_day_are_the_budget_s():
    """The README quotes the start-up lines of a day on an H100 (its 2048^3 bfloat16 matmul at 688 TFLOP/s, FineWeb-Edu's
    10B tokens), docs/training.md its compute and tokens: they are what the budget prints for those figures, so a
    change to the rule shows in the docs."""
    import train
    from cram.budget import pick_for, start_lines
    config = dict(BOOKS, budget_hours=24.0, budget_tokens=0, mask_rate=train.mask_rate, micro_batch=0,
                  batch_ramp=train.batch_ramp, batch_ramp_start=128)
    share = functools.partial(step_efficiency, gpu=True)
    settled, picked = pick_for(DAY * 688e12, config, {}, dict(BOOKS, vocab_size=32768, seq_len=128), FINEWEB, 1, share)
    config.update(settled, lr=lr_for_width(settled["d_model"]))
    pick = dict(picked, matmul_flops=688e12, matmul_dtype="bfloat16")
    lines = start_lines(pick, config, 128)
    readme = open(f"{ROOT}/README.md").read().splitlines()
    assert [line for line in readme if line.startswith("budget: 24 h x 688")] == lines
    row = f"| 24 h, H100 (688 TFLOP/s) | {picked['compute']:.1e} | 24 x 1024 (BERT-Large's) | {picked['tokens'] / 1e9:.1f}B |"
    assert row.replace("e+", "e") in open(f"{ROOT}/docs/training.md").read()


def test_a_given_micro_batch_rounds_the_picked_batch_but_never_inflates_it():
    """The picked final batch is rounded to a multiple of the processes, and of a given micro-batch where one fits the
    law's batch; a micro-batch larger than a process's share (1024 on 8 processes against the law's 32) leaves the law's
    batch as it is, where it once became 8192."""
    from cram.budget import batch_for_budget, pick_for
    config = dict(BOOKS, budget_hours=1.0, budget_tokens=2_000_000, mask_rate=0.25, micro_batch=0)
    args = (config, {}, dict(BOOKS, vocab_size=32768, seq_len=128), FINEWEB)
    share = functools.partial(step_efficiency, gpu=True)
    law = batch_for_budget(2_000_000, 128)
    assert pick_for(0, *args, 1, share)[0]["batch_size"] == law == 32
    assert pick_for(0, *args, 8, share)[0]["batch_size"] == 32  # a multiple of 8 processes already
    assert pick_for(0, *args, 3, share)[0]["batch_size"] == 33  # the nearest multiple of 3
    config["micro_batch"] = 1024
    assert pick_for(0, *args, 8, share)[0]["batch_size"] == 32  # not 8192
    config["micro_batch"] = 12
    assert pick_for(0, *args, 1, share)[0]["batch_size"] == 36  # three whole micro-batches


def test_a_dry_run_prints_what_would_run_and_trains_nothing(prepared, tmp_path):
    """--dry_run=True decides every setting and prints the start-up lines, the "settled:" line among them, then exits
    0 without building the model, training or writing a file; on a resume too, its checkpoint untouched."""
    settings = [a for a in TINY_MODEL if not re.match(r"--(n_layers|d_model|n_heads|d_ffn|batch_size|lr)=", a)]
    out = tmp_path / "a"
    common = ["train.py", f"--data_dir={prepared}", *settings, "--fill_in_examples=0", f"--out_dir={out}"]
    dry = run_script(*common, "--budget_tokens=8192", "--dry_run=True").stdout
    assert re.search(r"^settled: n_layers=2, d_model=128, batch_size=32 \(the budget's pick\)", dry, re.M), dry
    assert re.search(r"^budget: 8,192 tokens", dry, re.M) and re.search(r"^batch: ", dry, re.M), dry
    assert re.search(r"^schedule: lr .* \(triangle\); masking rate 0.25 throughout; ", dry, re.M), dry
    assert "model:" not in dry and not out.exists(), dry
    run_script(*common, "--budget_tokens=8192")
    before = (out / "ckpt.pt").read_bytes(), (out / "metrics.jsonl").read_bytes()
    resumed = run_script(*common, "--budget_tokens=16384", "--resume=True", "--dry_run=True").stdout
    assert "resuming with --budget_tokens=16384" in resumed and "settled:" in resumed, resumed
    assert not re.search(r"^(step|eval) ", resumed, re.M), resumed  # nothing trained, nothing evaluated
    assert ((out / "ckpt.pt").read_bytes(), (out / "metrics.jsonl").read_bytes()) == before
