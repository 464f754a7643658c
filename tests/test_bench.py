import importlib.util
import os
import re
import subprocess

from conftest import ROOT, assert_one_line_error, run_script, slow


def test_bench_prints_the_table_with_ratios(tmp_path):
    """At the CPU recipe's shape (config/train_cpu.py's model, read from the file, with 32768 tokens)."""
    proc = run_script("bench.py", "--shape=cpu", "--micro_batch=2", "--accum_steps=1", "--steps=1",
                      "--warmup_steps=1", "--sweep=False", f"--data_dir={tmp_path}", "--compile=False", "--profile=True")
    out = proc.stdout
    assert "data: random tokens" in out and out.startswith("# cpu shape 4x256, vocabulary 32768, seq 128 |")
    rows = re.findall(r"^\| (crammed|original BERT|HF BertForMaskedLM) \| 2 \| ([\d,]+) \|", out, re.M)
    expected = ["crammed", "original BERT"] + (["HF BertForMaskedLM"] if importlib.util.find_spec("transformers") else [])
    assert [name for name, _ in rows] == expected and all(int(v.replace(",", "")) > 0 for _, v in rows)
    assert re.search(r"crammed / original BERT: [\d.]+x tokens/s", out)
    assert re.search(r"data loading \+ masking: [\d.]+ ms per micro-batch", out)
    # the crammed row's profile by kind of kernel, adding up to at most its time (eager: no fused kernels; the
    # compiled kernels' names, which main has inductor record, are not tested: a compile with them costs ~30 s)
    kinds = re.search(r"^time by kind, ms per micro-batch: fused element-wise (.*), attention (.*), matmuls (.*), "
                      r"optimizer (.*), the rest (.*)$", out, re.M).groups()
    ms, shares = zip(*(map(float, re.fullmatch(r"([\d.]+) \((\d+)%\)", kind).groups()) for kind in kinds))
    step_ms = float(re.search(r"^\| crammed \| 2 \| [\d,]+ \| ([\d.]+) \|", out, re.M).group(1))
    assert ms[0] == 0 and all(ms[1:4]) and 97 <= sum(shares) <= 103 and sum(ms) <= 1.1 * step_ms, out


def test_bench_rejects_unknown_shape_and_layers_to_narrow_that_it_does_not_have():
    proc = run_script("bench.py", "--shape=no_such_shape", check=False)
    assert_one_line_error(proc, "--shape=no_such_shape is not allowed: shape must be one of ")  # the names in any order
    assert {"auto", "reference", "small"} <= set(proc.stderr.strip().split("must be one of ")[1].split(", "))
    assert_one_line_error(run_script("bench.py", "--full_layers=2,4", check=False),
                          "--full_layers=2,4: 4 is not a number of full layers from 1 to 3")


@slow
def test_bench_times_each_compile_mode(tmp_path):
    """The crammed row in each mode asked for, then eager; a mode the device cannot run is refused first."""
    args = ["bench.py", "--shape=small", "--micro_batch=2", "--accum_steps=1", "--steps=1", "--warmup_steps=1",
            "--sweep=False", "--baselines=False", f"--data_dir={tmp_path}", "--device=cpu"]
    out = run_script(*args, "--compile_mode=default,max-autotune-no-cudagraphs").stdout
    rows = re.findall(r"^\| (crammed[^|]*) \| 2 \| ([\d,]+) \| [\d.]+ \| ([\d.]+) \|", out, re.M)
    assert [name for name, *_ in rows] == ["crammed", "crammed, max-autotune-no-cudagraphs", "crammed, eager"], out
    assert all(int(speed.replace(",", "")) > 0 for _, speed, _ in rows)
    assert re.search(r"crammed / crammed, max-autotune-no-cudagraphs: [\d.]+x tokens/s", out)
    for modes, message in [("default,fast", "unknown compile mode 'fast'"),
                           ("default,reduce-overhead", "compile mode 'reduce-overhead' records CUDA graphs")]:
        assert_one_line_error(run_script(*args, f"--compile_mode={modes}", check=False), message)


def test_bench_times_offload_beside_normal_mode(tmp_path):
    proc = run_script("tools/bench_offload.py", "--shape=small", "--micro_batch=2", "--accum_steps=2", "--steps=1",
                      "--warmup_steps=1", "--repeats=2", f"--data_dir={tmp_path}")
    out = proc.stdout
    assert re.search(r"^\| normal, eager \| 2 \| [\d,]+ \([\d,]+-[\d,]+\) \|", out, re.M)
    assert re.search(r"^\| off-load \| 2 \| [\d,]+ \([\d,]+-[\d,]+\) \|", out, re.M)
    assert re.search(r"off-load / normal tokens/s: [\d.]+ \([\d.]+-[\d.]+\)x", out)
    assert re.search(r"host AdamW .*per block [\d,]+ .*one AdamW over the same tensors [\d,]+", out)


def test_bench_times_the_encoding_pass_against_raw_tiktoken(prepared, corpus_file):
    out = run_script("tools/bench_prepare.py", f"--corpus={corpus_file}", f"--data_dir={prepared}", "--repeats=2").stdout
    assert re.search(r"^# .*grammar.txt: 400 documents, [\d.]+ MB of text .*\(384 tokens\)", out, re.M)
    assert re.search(r"^\| raw tiktoken \| [\d.]+ \([\d.]+-[\d.]+\) \|", out, re.M)
    assert re.search(r"^\| prepare.py's encoding pass \| [\d.]+ \([\d.]+-[\d.]+\) \|", out, re.M)
    assert re.search(r"the pass at \d+% \(\d+%-\d+%\) of raw tiktoken's speed", out)


def test_the_memory_estimate_stays_below_what_a_step_takes():
    """train.py refuses a step by a lower estimate of its memory (memory.check_memory): measured, a
    training step of the quickstart's shape takes more than it, so a refused step surely does not fit."""
    out = run_script("tools/bench_memory.py", "--micro_batches=64").stdout
    measured, estimate, ratio = map(float, re.search(r"^\| float32, eager \| 64 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                                                      out, re.M).groups())
    assert 0 < estimate < measured and ratio < 1, out


def test_bench_attention_times_each_way_beside_the_model_s():
    """tools/bench_attention.py: three ways under bfloat16 autocast, each within bfloat16's rounding of float32
    attention (under 1e-2 at unit-scale values)."""
    out = run_script("tools/bench_attention.py", "--micro_batch=2", "--seq_len=16", "--n_heads=2", "--head_dim=8",
                     "--compile=False", "--repeats=1", "--rounds=1").stdout
    assert out.startswith("# attention of 2 x 2 heads x 16 positions x 8 | cpu, bfloat16")
    rows = dict((name, (float(ms), float(error))) for name, ms, error in
                re.findall(r"^\| ([^|]+) \| ([\d.]+) \| ([\d.e+-]+) \|$", out, re.M))
    assert list(rows) == ["model.attend", "flash in float32", "flash in the autocast dtype",
                          "matmuls in the autocast dtype"], out
    assert all(ms > 0 and error < 1e-2 for ms, error in rows.values())


def test_bench_masking_times_both_draws_on_the_same_rows():
    """tools/bench_masking.py: the per-row draw train.py masks with and the per-batch draw of before, each timed."""
    out = run_script("tools/bench_masking.py", "--micro_batch=4", "--seq_len=16", "--vocab_size=64", "--repeats=2",
                     "--rounds=2").stdout
    assert out.startswith("ms per micro-batch of 4 x 16 tokens, mask rate 0.25"), out
    rows = dict((name.strip(), [float(v) for v in values.split()]) for name, values in
                re.findall(r"^  (.+?\)) +([\d. ]+)$", out, re.M))
    assert list(rows) == ["one generator per batch (before)", "a key per row (train.py)"], out
    assert all(0 < low <= mid <= high for low, mid, high in rows.values()), out


def test_the_bf16_check_refuses_what_it_cannot_finish_before_any_work(tmp_path):
    """tools/bf16_check.sh, the measurements a host with fast bfloat16 owes (hours): a bad step or a later
    step's missing input is one line before anything runs or is written (FORCE=1 passes the check that
    dtype=auto picks bfloat16 here on any host)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLUE_DIR", "CORPUS")}
    env.update(OUT=str(tmp_path / "check"), FORCE="1")

    def check(*steps, **extra):
        return subprocess.run(["bash", "tools/bf16_check.sh", *steps], cwd=ROOT, env=dict(env, **extra),
                              capture_output=True, text=True, timeout=60)
    assert_one_line_error(check("attention", "nope"), "unknown step 'nope'")
    assert_one_line_error(check("attention", "glue"), "the glue step needs GLUE_DIR=")
    if not os.path.exists(os.path.join(ROOT, "data", "books32k", "meta.json")):  # else cpu20 needs no corpus
        assert_one_line_error(check("cpu20", CORPUS=str(tmp_path / "none.txt")), "needs CORPUS=")
    assert not (tmp_path / "check").exists()
    # the glue step fine-tunes the quickstart step's float32 checkpoint: without it, refused as it starts
    assert_one_line_error(check("glue", GLUE_DIR=str(tmp_path)), "quickstart step's float32 checkpoint")
