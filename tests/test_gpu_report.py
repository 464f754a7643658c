"""tools/gpu_report.py end to end on a CPU: every phase with tiny settings, as the GPU run uses them."""
import json
import os
import re

import pytest
import torch

from conftest import TINY_MODEL, assert_one_line_error, run_script

GLUE_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue")
TINY = [
    "--prepare_args=--vocab_size=384 --seq_len=32 --val_fraction=0.05",
    "--bench_args=--shape=small --micro_batch=2 --accum_steps=1 --steps=1 --warmup_steps=1 --sweep=False "
    "--baselines=False --compile=False",
    "--offload_bench_args=--shape=small --micro_batch=2 --accum_steps=1 --steps=1 --warmup_steps=1 --repeats=1",
    "--compile_modes=default",  # max-autotune records CUDA graphs: a GPU only (bench.py's test times the CPU's two)
    "--recipe_minutes=0.05", "--float16_minutes=0.05", f"--train_args={' '.join(TINY_MODEL)} --fill_in_examples=0",
    "--glue_tasks=rte,stsb,cola", "--glue_args=--epochs=1 --max_train_examples=8",
    "--transfer_minutes=0.05", "--transfer_glue_args=--epochs=2 --max_train_examples=8",
    "--transfer_train_args=--compile=False --log_interval=5 --eval_sequences=64 --fill_in_examples=0",  # the budget's shape
    # off-load: a 10 MiB device simulated, so the chosen encoder's state (16 B a parameter) exceeds it
    "--device=cpu", "--device_memory_gib=0.01", "--host_memory_gib=1", "--offload_micro_batch=2", "--offload_steps=2",
]


def sections(out):
    return {name[:-5]: json.load(open(out / "sections" / name)) for name in os.listdir(out / "sections")}


def run_phases(corpus_file, tmp_path, phases, *extra):
    """tools/gpu_report.py's given phases, as the GPU run calls them, and what they wrote: the phases are
    split over three tests so that the suite's workers share them."""
    out, data = tmp_path / "report", tmp_path / "data"
    proc = run_script("tools/gpu_report.py", f"--phases={phases}", f"--corpus={corpus_file}", f"--data_dir={data}",
                      f"--glue_dir={GLUE_FIXTURES}", f"--out_dir={out}", *TINY, *extra)
    assert f"wrote {out / 'report.md'}" in proc.stdout
    found = sections(out)
    assert {name: s["status"] for name, s in found.items()} == dict.fromkeys(phases.split(","), "ok")
    for s in found.values():  # every figure says where and when it was measured
        assert s["environment"].startswith("CPU") and "torch " in s["environment"] and "tools/gpu_report.py" in s["command"]
    return out, data, (out / "report.md").read_text(), found


# two transfer tasks (sst2 has its own epochs) and one from scratch: each fine-tuning is a process of its own
TRANSFER_TASKS = ["--transfer_tasks=rte,sst2", "--transfer_control=sst2"]


def test_the_first_phases_health_and_transfer_and_their_continuation(corpus_file, tmp_path):
    out, data, report, found = run_phases(corpus_file, tmp_path, "health,transfer,prepare", *TRANSFER_TASKS)
    # health: the device and a matmul's speed, in seconds
    assert re.search(r"\| health \| ok \| [\d.]+ \| cpu, \w+( \([^)]*\))?; 1024x1024 \w+ matmul [\d.]+ TFLOP/s \|", report)
    # transfer, first: the data prepared, train.py's recipe pretrained for its budget, then the tasks fine-tuned
    # (sst2 for one epoch) and the control from scratch, beside each other in one table and on the picture
    assert (data / "meta.json").is_file() and "already prepared" in found["prepare"]["body"]
    assert re.search(r"\| prepare \| ok \| [\d.]+ \| [\d,]+ train tokens, vocabulary 384", report)
    transfer = json.load(open(out / "transfer" / "glue.json"))
    assert sorted(transfer["tasks"]) == ["rte", "sst2"] and list(transfer["no_pretraining"]) == ["sst2"]
    # sst2 for 1 epoch, the others as transfer_glue_args says
    assert {t: e["settings"]["epochs"] for t, e in transfer["tasks"].items()} == dict(rte=2, sst2=1)
    assert transfer["no_pretraining"]["sst2"]["settings"]["epochs"] == 1
    evals = [r for r in map(json.loads, (out / "transfer" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    # no shape given: 3 s of this CPU buy the ladder's smallest rung, said in the log and kept in the checkpoint
    assert re.search(r"^budget: 0.05 min x [\d.]+ TFLOP/s .* -> 2 x 128 ", (out / "logs" / "transfer_train.log").read_text(), re.M)
    assert torch.load(out / "transfer" / "ckpt.pt", weights_only=True)["budget"]["rung"] == [2, 128]
    assert 3 <= evals[-1]["elapsed"] < 6 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert re.fullmatch(r"rte [\d.]+, sst2 [\d.]+ \(no pretraining [\d.]+\) after [\d.]+M tokens, [\d.]+e\+\d+ FLOPs",
                        found["transfer"]["headline"]), found["transfer"]["headline"]
    assert "| task | metric | ours | no pretraining | majority class | reference |" in found["transfer"]["body"]
    assert re.search(r"^\| average \(2 of 9\) \| \| -?[\d.]+ \| ", found["transfer"]["body"], re.M)
    assert "--tasks=sst2 --epochs=1" in found["transfer"]["body"]
    assert "--tasks=sst2 --from_scratch=True --epochs=1`" in found["transfer"]["body"]
    # its point joined the project's GLUE-against-compute picture (tools/glue_plot.py)
    assert [p["label"] for p in json.load(open(out / "glue_points.json"))][-1] == "CPU transfer 0.05 min"
    assert "![GLUE average against pretraining" in found["transfer"]["body"]
    # the transfer phase continues where a stop left it (as a second call does): pretraining is found spent and
    # kept, finished fine-tuning is kept, and what was missing (here sst2's seed, as if stopped during it) is done
    ckpt_before = (out / "transfer" / "ckpt.pt").stat().st_mtime_ns
    (out / "transfer" / "glue_runs" / "tasks" / "sst2" / "seed0.json").unlink()  # a run's file is its being done
    run_script("tools/gpu_report.py", "--phases=transfer", f"--data_dir={data}", f"--glue_dir={GLUE_FIXTURES}",
               f"--out_dir={out}", *TINY, *TRANSFER_TASKS)
    logs = out / "logs"
    assert "has spent this budget" in (logs / "transfer_train.log").read_text()
    assert (out / "transfer" / "ckpt.pt").stat().st_mtime_ns == ckpt_before
    assert "sst2: done earlier" not in (logs / "transfer_sst2.log").read_text()
    assert all("done earlier" in (logs / f"transfer_{t}.log").read_text() for t in ("rte", "sst2_scratch"))
    again = json.load(open(out / "transfer" / "glue.json"))
    assert sorted(again["tasks"]) == ["rte", "sst2"] and again["no_pretraining"] == transfer["no_pretraining"]
    assert sections(out)["transfer"]["status"] == "ok"


def test_the_speed_phases_bench_compile_and_offload(corpus_file, tmp_path):
    out, data, report, found = run_phases(corpus_file, tmp_path, "prepare,bench,compile,offload")
    # bench: its table, the off-load comparison and its headline figure
    assert re.search(r"\| bench \| ok \| [\d.]+ \| crammed: [\d,]+ tokens/s at micro-batch 2", report)
    assert "off-load / normal tokens/s" in found["offload"]["body"]
    # compile: the crammed step compiled (here in the one mode asked for) and eager, at one micro-batch
    assert re.fullmatch(r"default [\d,]+ tokens/s \(warm-up \d+ s\), eager [\d,]+ tokens/s \(warm-up \d+ s\) "
                        r"at micro-batch 2", found["compile"]["headline"]), found["compile"]["headline"]
    assert "--compile_mode=default" in found["compile"]["body"]
    assert re.search(r"^\| eager \| 2 \| [\d,]+ \| 1.00 \|", found["compile"]["body"], re.M)
    # off-load: a shape whose state exceeds the simulated device, normal mode refused, off-load trained
    offload = found["offload"]["body"]
    assert re.search(r"\| shape \| 16x64 \(vocabulary 384\), [\d.]+M parameters \|", offload)
    assert "would not fit" in offload and re.search(r"\| off-load tokens/s \| [\d,]+ \|", offload)
    losses = [float(x) for x in re.search(r"\| losses \| ([\d., ]+) \|", offload).group(1).split(", ")]
    assert len(losses) == 3 and all(5.0 < x < 7.0 for x in losses)  # finite, near ln(384) = 5.95 at the start


def test_the_training_phases_float16_recipes_and_glue(corpus_file, tmp_path):
    out, data, report, found = run_phases(corpus_file, tmp_path, "prepare,float16,recipes,glue")
    # float16: both precisions trained the same budget, with their speeds and skipped updates side by side
    assert re.fullmatch(r"bfloat16: val loss [\d.]+, \d+ updates skipped, float16: val loss [\d.]+, \d+ updates skipped",
                        found["float16"]["headline"]), found["float16"]["headline"]
    for dtype in ("bfloat16", "float16"):
        run = out / "float16_runs" / f"dtype={dtype}" / "seed0"
        assert torch.load(run / "ckpt.pt", weights_only=True)["config"]["dtype"] == dtype
        assert f"| dtype={dtype} | " in found["float16"]["body"]
    assert (out / "float16.png").read_bytes()[:4] == b"\x89PNG"
    # recipes (tools/compare.py --variants): each trained for the same 3 s budget, compared in a table and a
    # picture; train.py's recipe is the paper's plus smear, the paper's is one config file away, and the
    # narrowed one is train.py's with full_layers=2 (here all of the tiny model's 2 layers)
    for name, smear in (("crammed", True), ("full_layers=2", True), ("recipe_reference", False)):
        evals = [json.loads(line) for line in (out / "runs" / name / "seed0" / "metrics.jsonl").read_text().splitlines()]
        assert evals[-1]["kind"] == "eval" and 3 <= evals[-1]["elapsed"] < 6 and evals[-1]["val_loss"] < evals[0]["val_loss"]
        model_args = torch.load(out / "runs" / name / "seed0" / "ckpt.pt", weights_only=True)["model_args"]
        assert model_args["smear"] == smear and model_args["full_layers"] == (2 if name == "full_layers=2" else 0)
        assert f"| {name} | " in found["recipes"]["body"]
    assert (out / "recipes.png").read_bytes()[:4] == b"\x89PNG" and "![validation loss" in report
    # glue: the checkpoints of glue_recipes (by default train.py's and the paper's) fine-tuned on the three
    # tasks, beside the published row
    for name in ("crammed", "recipe_reference"):
        scores = json.load(open(out / f"glue_{name}.json"))
        assert sorted(scores["tasks"]) == ["cola", "rte", "stsb"]
    assert report.count("| average (3 of 9) |") == 2 and not (out / "glue_full_layers=2.json").exists()
    # and their points joined the project's GLUE-against-compute picture (tools/glue_plot.py)
    labels = [p["label"] for p in json.load(open(out / "glue_points.json"))]
    assert labels[-2:] == ["CPU crammed 0.05 min", "CPU recipe_reference 0.05 min"]
    assert (out / "glue_compute.png").read_bytes()[:4] == b"\x89PNG" and "![GLUE average against pretraining" in report


def test_a_failed_phase_is_reported_and_the_rest_go_on(corpus_file, tmp_path):
    out = tmp_path / "report"
    proc = run_script("tools/gpu_report.py", "--phases=glue,prepare", f"--glue_dir={tmp_path / 'no_glue'}",
                      f"--corpus={corpus_file}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={out}", TINY[0], check=False)
    assert_one_line_error(proc, "phase glue failed: no GLUE folder")
    found = sections(out)
    assert found["glue"]["status"] == "failed" and "no GLUE folder" in found["glue"]["headline"]
    assert found["prepare"]["status"] == "ok"  # after the failure
    # a phase run alone replaces its own section of the same report and keeps the others
    run_script("tools/gpu_report.py", "--phases=prepare", f"--data_dir={tmp_path / 'data'}", f"--out_dir={out}")
    report = (out / "report.md").read_text()
    assert "| glue | failed |" in report and "already prepared" in sections(out)["prepare"]["body"]
    assert_one_line_error(run_script("tools/gpu_report.py", "--phases=prepare", f"--data_dir={tmp_path / 'none'}",
                                     f"--out_dir={out}", check=False), "no --corpus was given")


def test_the_off_load_shape_fits_the_host_or_a_smaller_simulated_device():
    """The off-load phase needs a model beyond the device whose host state (18 B a parameter) the host holds:
    an H100 (80 GiB) on a 120 GiB host has one; an H200 (139 GiB) on a 125 GiB host has none beyond the whole
    device, so it simulates a smaller one; a host too small for any is a failed phase, before any GPU time."""
    from gpu_report import PhaseFailed, offload_plan
    gib = 2 ** 30
    for device, host, capped in ((80 * gib, 120 * gib, False), (139 * gib, 125 * gib, True)):
        args, n_params, device_bytes = offload_plan(device, host, 32768, 128)
        assert (device_bytes < device) == capped and 16 * n_params > device_bytes and 18 * n_params <= 0.85 * host
    with pytest.raises(PhaseFailed, match="the host is too small"):
        offload_plan(80 * gib, 2 ** 20, 32768, 128)  # 1 MiB


def test_a_script_past_its_deadline_and_what_it_started_are_stopped_with_sigterm_first(tmp_path):
    """As compare.py starts train.py: at the deadline both get SIGTERM (train.py saves on it), and nothing is left
    to hold the GPU into the next phase."""
    import time
    from gpu_report import PhaseFailed, run_logged
    script = tmp_path / "starts_one.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, sys, time\\n'\n"
        "    'signal.signal(signal.SIGTERM, lambda *a: (print(\"child saved\", flush=True), sys.exit(0)))\\n'\n"
        "    'print(\"child up\", flush=True)\\ntime.sleep(100)'])\n"
        "print(f'pid {child.pid}', flush=True)\n"
        "time.sleep(100)\n")
    start = time.time()
    with pytest.raises(PhaseFailed, match="ran past the phase's time limit"):
        run_logged([str(script)], tmp_path / "log", time.time() + 4, echo=False)
    log = (tmp_path / "log").read_text()
    assert "child up" in log and "child saved" in log and time.time() - start < 20  # not the 30 s grace
    pid = int(log.split("pid ")[1].split()[0])
    time.sleep(0.5)
    state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}") else "gone"
    assert state in ("gone", "Z"), state  # ended (a zombie until init reaps it)


def test_a_phase_that_fails_keeps_what_it_measured_and_one_that_crashes_says_where(tmp_path, monkeypatch):
    import gpu_report
    monkeypatch.setattr(gpu_report, "out_dir", str(tmp_path))

    def partial(deadline, logs):
        raise gpu_report.PhaseFailed("1 fine-tuning run(s) did not finish", body="| rte | 55.0 |")

    def crash(deadline, logs):
        return {}["key"]
    monkeypatch.setitem(gpu_report.PHASE_FUNCTIONS, "transfer", partial)
    monkeypatch.setitem(gpu_report.PHASE_FUNCTIONS, "glue", crash)
    for name in ("transfer", "glue"):
        gpu_report.run_phase(name)
    found = sections(tmp_path)
    assert found["transfer"]["status"] == "failed" and found["transfer"]["body"] == "| rte | 55.0 |"
    assert found["glue"]["status"] == "failed" and found["glue"]["headline"] == "KeyError: 'key'"
    assert "in crash" in found["glue"]["body"]  # its traceback, to mend it by


def test_bad_phase_names_are_one_line_errors(tmp_path):
    assert_one_line_error(run_script("tools/gpu_report.py", "--phases=bench,train", f"--out_dir={tmp_path}", check=False),
                          "unknown phase 'train'", "health, transfer, prepare, bench, compile, float16, recipes, glue, offload")
