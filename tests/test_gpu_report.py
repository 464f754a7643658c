"""tools/gpu_report.py end to end on a CPU: every phase with tiny settings, as the GPU run uses them."""
import json
import os
import re
import time

import pytest
import torch

from conftest import TINY_MODEL, assert_one_line_error, run_script, slow

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
COPIES = ["glue.json", "logs_tail.txt", "report.md", "transfer.md", "transfer_train.log"]


def one_call(corpus_file, tmp_path, phases, deadline_s, *extra):
    """The first GPU session's call on a CPU with tiny settings (docs/gpu.md): its own deadline, its copies in
    tmp_path/OUT. Returns the seconds it took."""
    start = time.monotonic()
    run_script("tools/gpu_report.py", f"--phases={phases}", f"--corpus={corpus_file}", f"--data_dir={tmp_path / 'data'}",
               f"--glue_dir={GLUE_FIXTURES}", f"--out_dir={tmp_path / 'report'}", *TINY, *TRANSFER_TASKS,
               f"--deadline_minutes={deadline_s / 60!r}", "--stop_grace_s=2", f"--copy_to={tmp_path / 'OUT'}", *extra,
               check=False)
    return time.monotonic() - start


def running_under(path):
    """The processes whose command line names `path`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            if str(path).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:
            continue
    return found


def test_the_one_call_cut_by_its_deadline_returns_what_finished_and_a_second_call_continues(corpus_file, tmp_path):
    """docs/gpu.md's one call, on a CPU: its deadline falls while rte fine-tunes (for ever: 10^5 epochs), after
    pretraining and sst2 finished. The command has ended everything by its deadline, and its copies hold every
    finished piece; the same call again (rte's epochs as meant) continues to the whole table, inside its deadline.
    The deadlines leave a loaded machine room (pretraining and sst2 take about 25 s of an idle one's 90): the margins
    are for a slow start and exit, not this machine's speed."""
    out, copies = tmp_path / "report", tmp_path / "OUT"
    took = one_call(corpus_file, tmp_path, "health,transfer", 90, "--transfer_glue_args=--epochs=100000 --max_train_examples=8")
    assert took < 90 + 10, took  # (the fork server's start and exit)
    assert not running_under(tmp_path)  # fine-tuning runs in sessions of its own, stopped all the same
    assert sorted(os.listdir(copies)) == COPIES  # flat, whole files: no temporary ones
    report = (copies / "report.md").read_text()
    assert re.search(r"\| health \| ok \| [\d.]+ \| cpu, \w+( \([^)]*\))?; 1024x1024 \w+ matmul [\d.]+ TFLOP/s \|", report)
    assert re.search(r"\| transfer \| failed \| [\d.]+ \| 2 fine-tuning run\(s\) did not finish", report)  # rte, the floor
    # the pieces that finished: pretraining (no shape given: 3 s of this CPU buy the ladder's smallest rung), sst2
    answer = (copies / "transfer.md").read_text()
    assert re.search(r"^    budget: 0.05 min x [\d.]+ TFLOP/s .* -> 2 x 128 ", answer, re.M)
    assert re.search(r"^    final: step \d+ \| val loss ", answer, re.M)
    assert re.search(r"^\| sst2 \| accuracy \(1 seed, 1 epoch, .*\| [\d.]+ \|", answer, re.M) and "| rte |" not in answer
    assert re.search(r"began, as each piece ended: pretraining [\d.]+, sst2 [\d.]+\.$", answer, re.M)
    assert (copies / "transfer_train.log").read_text() == (out / "logs" / "transfer_train.log").read_text()
    assert sorted(json.load(open(copies / "glue.json"))["tasks"]) == ["sst2"]
    assert "==> transfer_rte.log <==" in (copies / "logs_tail.txt").read_text()
    ckpt_before = (out / "transfer" / "ckpt.pt").stat().st_mtime_ns

    # the same call again: pretraining is found spent and kept, sst2 too, rte and the floor are done
    took = one_call(corpus_file, tmp_path, "transfer", 300)  # ends when its pieces do: the deadline is a bound
    assert took < 300 and not running_under(tmp_path)
    assert sorted(os.listdir(copies)) == COPIES
    logs = out / "logs"
    assert "has spent this budget" in (logs / "transfer_train.log").read_text()
    assert (out / "transfer" / "ckpt.pt").stat().st_mtime_ns == ckpt_before
    assert "sst2: done earlier" in (logs / "transfer_sst2.log").read_text()
    found = sections(out)
    assert {name: s["status"] for name, s in found.items()} == dict(health="ok", transfer="ok")
    assert re.search(r"^Data: [\d,]+ train tokens, vocabulary 384\.$", found["transfer"]["body"], re.M)  # (prepared by call 1)
    transfer = json.load(open(copies / "glue.json"))
    assert sorted(transfer["tasks"]) == ["rte", "sst2"] and list(transfer["no_pretraining"]) == ["sst2"]
    # sst2 for 1 epoch, the others as transfer_glue_args says
    assert {t: e["settings"]["epochs"] for t, e in transfer["tasks"].items()} == dict(rte=2, sst2=1)
    assert transfer["no_pretraining"]["sst2"]["settings"]["epochs"] == 1
    assert torch.load(out / "transfer" / "ckpt.pt", weights_only=True)["budget"]["taken"] == [2, 128]
    evals = [r for r in map(json.loads, (out / "transfer" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    assert 3 <= evals[-1]["elapsed"] < 3 + 15 and evals[-1]["val_loss"] < evals[0]["val_loss"]  # its budget: 3 s
    assert re.fullmatch(r"rte [\d.]+, sst2 [\d.]+ \(no pretraining [\d.]+\) after [\d.]+M tokens, [\d.]+e\+\d+ FLOPs",
                        found["transfer"]["headline"]), found["transfer"]["headline"]
    answer = (copies / "transfer.md").read_text()  # the whole table, beside the floor, and still the first run's lines
    assert re.search(r"^    budget: 0.05 min x .*\n    settled: .*lr=.*\n    model: ", answer, re.M) and "has spent this budget" in answer
    assert "| task | metric | ours | no pretraining | words alone | majority class | reference |" in answer
    assert re.search(r"^\| average \(2 of 9\) \| \| -?[\d.]+ \| ", answer, re.M)
    assert "--tasks=sst2 --epochs=1" in found["transfer"]["body"]
    assert "--tasks=sst2 --from_scratch=True --epochs=1`" in found["transfer"]["body"]
    # its point joined the project's GLUE-against-compute picture (tools/glue_plot.py)
    assert [p["label"] for p in json.load(open(out / "glue_points.json"))][-1] == "CPU transfer 0.05 min"
    assert "![GLUE average against pretraining" in found["transfer"]["body"]


def test_the_grid_phase_scores_each_point_on_dev_and_train_beside_the_floor(corpus_file, tmp_path):
    """The grid phase: pretraining to a token budget (reproducible), then each task at each rate and epoch count,
    model and floor, a process each; grid.md a row per point with its dev and train scores, each task's best on dev
    marked; grid.json every number; the copies of a call among them."""
    out, _, _, found = run_phases(
        corpus_file, tmp_path, "grid", "--grid_tasks=rte,sst2,cola", "--grid_lr=1e-3,1e-5", "--grid_epochs=2",
        "--grid_sst2_epochs=1", "--grid_glue_args=--max_train_examples=8", f"--copy_to={tmp_path / 'OUT'}",
        f"--grid_train_args={' '.join(TINY_MODEL)} --fill_in_examples=0 --budget_tokens=30000")
    ckpt = torch.load(out / "grid" / "ckpt.pt", weights_only=True)
    assert 30000 <= ckpt["tokens"] < 30000 + 32 * 32 and ckpt["model_args"]["d_model"] == 64  # the tokens given
    points = json.load(open(out / "grid.json"))["points"]
    assert sorted((p["task"], p["lr"], p["epochs"], p["group"]) for p in points) == sorted(
        (t, lr, e, g) for t, e in (("rte", 2), ("sst2", 1), ("cola", 2)) for lr in (1e-3, 1e-5)
        for g in ("tasks", "no_pretraining"))
    for p in points:  # the dev set's metrics and the training examples' fit, main metric first
        assert list(p["fit"]) == {"rte": ["accuracy"], "sst2": ["accuracy"], "cola": ["mcc"]}[p["task"]] and p["batch"] == 32
        assert list(p["dev"]) == [p["task"]] and list(p["dev"][p["task"]]) == list(p["fit"])
    grid = (out / "grid.md").read_text()
    for task in ("rte", "sst2", "cola"):
        rows = re.findall(rf"^\| {task} \| (1e-05|0.001) \| [12] \| (\**)-?[\d.]+\** \| -?[\d.]+ \| -?[\d.]+ \| -?[\d.]+ \|$",
                          grid, re.M)
        assert len(rows) == 2 and sorted(bold for _, bold in rows) == ["", "**"], grid  # the best of two, marked
    assert re.fullmatch(r"best on dev: rte [\d.]+ at lr (1e-05|0.001), 2 epochs, sst2 [\d.]+ at lr (1e-05|0.001), 1 epochs, "
                        r"cola -?[\d.]+ at lr (1e-05|0.001), 2 epochs \(grid.md\)", found["grid"]["headline"])
    assert "final: step" in grid and "| rte | 0.001 | 2 |" in found["grid"]["body"]
    assert sorted(os.listdir(tmp_path / "OUT")) == ["grid.json", "grid.md", "grid_train.log", "logs_tail.txt", "report.md"]
    # a rerun with fewer tasks: the pretraining spent, its points done, the others' rows kept after them
    proc = run_script("tools/gpu_report.py", "--phases=grid", f"--corpus={corpus_file}", f"--data_dir={tmp_path / 'data'}",
                      f"--glue_dir={GLUE_FIXTURES}", f"--out_dir={out}", *TINY, "--grid_tasks=sst2", "--grid_lr=1e-3,1e-5",
                      "--grid_sst2_epochs=1", "--grid_glue_args=--max_train_examples=8",
                      f"--grid_train_args={' '.join(TINY_MODEL)} --fill_in_examples=0 --budget_tokens=30000")
    assert torch.load(out / "grid" / "ckpt.pt", weights_only=True)["tokens"] == ckpt["tokens"] and "best on dev: sst2" in proc.stdout
    assert [line.split(" | ")[0] for line in (out / "grid.md").read_text().splitlines() if line.startswith("| ") and
            "epochs" not in line] == ["| sst2"] * 2 + ["| cola"] * 2 + ["| rte"] * 2


@slow
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


@slow
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
    start = time.monotonic()
    with pytest.raises(PhaseFailed, match="ran past the phase's time limit"):
        run_logged([str(script)], tmp_path / "log", time.monotonic() + 4, echo=False)
    log = (tmp_path / "log").read_text()
    assert "child up" in log and "child saved" in log and time.monotonic() - start < 20  # not the 30 s grace
    pid = int(log.split("pid ")[1].split()[0])
    time.sleep(0.5)
    state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}") else "gone"
    assert state in ("gone", "Z"), state  # ended (a zombie until init reaps it)


def test_a_call_gets_at_most_its_8_files_the_most_valuable_ones(tmp_path, monkeypatch):
    """publish: of COPIED's files that exist, the first COPIES_AT_MOST, and the logs' tails: within a device call's 8
    however many phases ran; one displaced by a file of more value that appeared since is removed from the copies."""
    import gpu_report
    out, copies = tmp_path / "out", tmp_path / "OUT"
    monkeypatch.setattr(gpu_report, "out_dir", str(out))
    monkeypatch.setattr(gpu_report, "copy_to", str(copies))
    for name in gpu_report.COPIED[1:]:  # all but report.md, the first
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(name)
    gpu_report.publish()
    names = [os.path.basename(n) for n in gpu_report.COPIED]
    assert sorted(os.listdir(copies)) == sorted([*names[1:8], "logs_tail.txt"])
    (out / "report.md").write_text("report")
    gpu_report.publish()
    assert sorted(os.listdir(copies)) == sorted([*names[:7], "logs_tail.txt"])  # the last one gave way
    assert (copies / "transfer.md").read_text() == "transfer.md"


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
                          "unknown phase 'train'", "health, transfer, grid, prepare, bench, compile, float16, recipes, glue, offload")
    assert_one_line_error(run_script("tools/gpu_report.py", "--phases=grid", f"--out_dir={tmp_path}", "--grid_epochs=5,ten",
                                     f"--glue_dir={GLUE_FIXTURES}", check=False),
                          "phase grid failed: --grid_lr='4e-5,1e-4,3e-4', --grid_epochs='5,ten'", "epoch counts >= 1")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the sweep reads Linux's /proc")
def test_the_sweep_stops_what_a_command_started_in_sessions_of_its_own(monkeypatch):
    """The one call's last act: a script that started its own session (as every script here does) outlives a kill
    of the command, so the command kills, by the mark in their environment, every process it started."""
    import subprocess
    import sys
    from conftest import spawn
    from gpu_report import CALL_ENV, sweep
    monkeypatch.setenv(CALL_ENV, f"{time.monotonic():.3f} 0 {os.getpid()}")  # what begin_call marks a command with
    child = spawn([sys.executable, "-c", "import subprocess, sys, time\n"
                   "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'], "
                   "start_new_session=True)\nprint(grandchild.pid, flush=True)\ntime.sleep(100)"],
                  stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(child.stdout.readline())  # just started: its environment may read empty for a moment
    assert set(sweep()) >= {child.pid, grandchild}
    assert child.wait(timeout=10) == -9
    for _ in range(50):  # the grandchild's new parent reaps it
        state = open(f"/proc/{grandchild}/stat").read().split()[2] if os.path.exists(f"/proc/{grandchild}") else "gone"
        if state in ("gone", "Z"):
            break
        time.sleep(0.1)
    assert state in ("gone", "Z"), state


def test_gpu_call_builds_the_carry_folder_checks_it_and_prints_the_call(corpus_file):
    """tools/gpu_call.py, the one command to get ready, at a tiny vocabulary: the prepared corpus and GLUE's four
    folders in a git-ignored folder of the repository, checked, and the device call to paste."""
    import shutil
    from conftest import ROOT
    carry = os.path.join("data", f"test_gpu_call_{os.getpid()}")  # a call carries folders of the repository
    ready = ["tools/gpu_call.py", f"--corpus={corpus_file}", f"--glue_dir={GLUE_FIXTURES}", f"--carry_dir={carry}",
             "--seq_len=32", "--max_tokens=20000", "--tokenizer_train_chars=100000"]
    try:
        # what the call could not use is refused before any preparation: too little room, a timeout under the deadline's
        assert_one_line_error(run_script(*ready, "--limit_mib=2", check=False), "no room for the corpus's 20,000")
        assert_one_line_error(run_script(*ready, "--timeout_s=500", check=False), "must be at least a minute above")
        proc = run_script(*ready, "--vocab_size=384")
        call = json.loads(proc.stdout.splitlines()[-1])
        assert call == dict(command="PYTHONUNBUFFERED=1 python3 tools/gpu_report.py --phases=health,transfer --device=cuda "
                            f"--data_dir={carry}/corpus --glue_dir={carry}/glue --transfer_minutes=3.5 --deadline_minutes=8 "
                            "--stop_grace_s=15 --copy_to=$OUT", carry=[carry], timeout_s=540)
        assert re.search(rf"^ready: {carry} with the working tree is [\d.]+ MiB of 64: 0.0M train tokens \(vocabulary 384, "
                         r"sequences of 32\)", proc.stdout, re.M)
        meta = json.load(open(os.path.join(ROOT, carry, "corpus", "meta.json")))
        assert (meta["vocab_size"], meta["seq_len"]) == (384, 32) and meta["train_sequences"] > 0
        assert sorted(os.listdir(os.path.join(ROOT, carry, "glue"))) == ["MRPC", "RTE", "SST-2", "STS-B"]
        # a rerun checks what it finds: another vocabulary than the one there is refused, not carried
        assert_one_line_error(run_script(*ready, check=False), "vocab_size 384 (not 32768)")
        # or the text itself, xz-compressed, which the call prepares on the GPU machine: the corpus's text, whole here
        assert_one_line_error(run_script(*ready, "--carry_text=True", check=False), "corpus is there from a call without")
        shutil.rmtree(os.path.join(ROOT, carry, "corpus"))
        text = [*ready, "--carry_text=True", "--max_tokens=0"]  # as much text as fits
        assert_one_line_error(run_script(*text, "--corpus=books.jsonl", check=False), "--carry_text=True takes a text file")
        assert_one_line_error(run_script(*text, "--max_tokens=9", check=False), "--max_tokens is for the token files")
        assert_one_line_error(run_script(*text, "--phases=health,gird", check=False), "names gird: not among")
        call = json.loads(run_script(*text, "--vocab_size=384").stdout.splitlines()[-1])
        assert call["command"].startswith("PYTHONUNBUFFERED=1 python3 tools/gpu_report.py --phases=health,transfer "
                                          f"--device=cuda --corpus={carry}/corpus.txt.xz --data_dir=data/gpu_prepared "
                                          "\"--prepare_args=--vocab_size=384 --seq_len=32 --tokenizer_train_chars=100000\" ")
        import lzma
        assert lzma.open(os.path.join(ROOT, carry, "corpus.txt.xz"), "rt").read() == open(corpus_file).read()
        assert not os.path.exists(os.path.join(ROOT, carry, "corpus"))
    finally:
        shutil.rmtree(os.path.join(ROOT, carry), ignore_errors=True)
