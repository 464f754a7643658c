"""tools/compare.py: runs plotted, variants trained and compared (protocol=clock runs in
tests/test_gpu_report.py's recipes phase; protocol=tokens here), finished runs reused."""
import json
import os

import torch

from conftest import ROOT, TINY_MODEL, assert_one_line_error, run_script, slow
from compare import variant_args


def write_metrics(run, evals):
    run.mkdir()
    lines = [{"kind": "train", "step": 5, "elapsed": 1.0, "tokens": 100, "loss": 7.0}]
    lines += [{"kind": "eval", "step": s, "elapsed": t, "tokens": n, "val_loss": v, "accuracy": a}
              for s, t, n, v, a in evals]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_compare_existing_runs(tmp_path):
    write_metrics(tmp_path / "a", [(0, 0.0, 0, 9.0, 0.1), (10, 60.0, 1000, 6.5, 0.14), (20, 120.0, 2000, 6.0, 0.15)])
    # b was resumed after a kill: step 10 is logged twice, and the later line counts
    write_metrics(tmp_path / "b", [(0, 0.0, 0, 9.0, 0.1), (10, 60.0, 900, 7.9, 0.11), (10, 61.0, 900, 7.0, 0.12)])
    png = tmp_path / "pic.png"
    out = run_script("tools/compare.py", f"--runs={tmp_path / 'a'},{tmp_path / 'b'}", f"--png={png}").stdout
    assert f"| {tmp_path / 'a'} | 6.0000 | 0.150 | 2.0 | 0.00M | 20 |" in out
    assert f"| {tmp_path / 'b'} | 7.0000 | 0.120 | 1.0 | 0.00M | 10 |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


ARGS = ["--protocol=tokens", "--seeds=1", "--budget_minutes=0.05", "--speed_steps=6", "--speed_repeats=1",
        "--train_args=--compile=False --eval_interval_minutes=0.02 " + " ".join(TINY_MODEL)]


@slow
def test_tokens_protocol_times_then_trains_equal_time_budgets_and_reuses_runs(prepared, tmp_path):
    base = tmp_path / "base.py"
    base.write_text(f"data_dir = {str(prepared)!r}\n")
    out = tmp_path / "compare"
    proc = run_script("tools/compare.py", "--variants=crammed,mask_rate=0.4", f"--base={base}", f"--out_dir={out}", *ARGS)
    results = json.loads((out / "results.json").read_text())
    for name in ("crammed", "mask_rate=0.4"):
        r = results["variants"][name]
        assert len(r["val_loss"]) == 1 and r["budget_tokens"] == int(r["tokens_per_s"] * 3)
        # each run trained for its variant's token budget (the last step may pass it by one batch)
        assert all(r["budget_tokens"] <= c[-1]["tokens"] < r["budget_tokens"] + 32 * 32 for c in r["curves"])
        assert f"| {name} |" in proc.stdout
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    # every run trained in the precision decided once for the command, whatever a CPU's timing said run to run
    dtypes = {torch.load(out / name / "seed0" / "ckpt.pt")["config"]["dtype"] for name in ("crammed", "mask_rate=0.4")}
    assert len(dtypes) == 1 and f"--dtype={dtypes.pop()}" in (out / "crammed" / "seed0" / "done").read_text()
    # a rerun with one more seed trains only that seed, and the target is the baseline's mean over its seeds
    stamp = (out / "mask_rate=0.4" / "seed0" / "ckpt.pt").stat().st_mtime
    run_script("tools/compare.py", "--variants=crammed,mask_rate=0.4", f"--base={base}", f"--out_dir={out}",
               *ARGS[:1], *ARGS[2:], "--seeds=2")
    assert (out / "mask_rate=0.4" / "seed0" / "ckpt.pt").stat().st_mtime == stamp
    results = json.loads((out / "results.json").read_text())
    assert [len(results["variants"][name]["val_loss"]) for name in ("crammed", "mask_rate=0.4")] == [2, 2]
    assert results["target"] == sum(results["variants"]["crammed"]["val_loss"]) / 2
    # a command that would give the finished runs another budget is refused, not served the old runs
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed,mask_rate=0.4", f"--base={base}",
                                     f"--out_dir={out}", *ARGS[:2], "--budget_minutes=0.1", *ARGS[3:], check=False),
                          "finished with other settings")
    assert json.loads((out / "results.json").read_text())["target"] == results["target"]
    # a run finished before the initial weights were keyed by name is refused too, not paired with a later variant
    done = out / "crammed" / "seed0" / "done"
    done.write_text(done.read_text().rsplit("\n", 1)[0])
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed,mask_rate=0.4", f"--base={base}",
                                     f"--out_dir={out}", *ARGS[:1], *ARGS[2:], "--seeds=2", check=False),
                          "finished with other settings")


def test_auto_precision_is_decided_once_for_every_run(monkeypatch, tmp_path):
    """dtype=auto becomes the precision train.py would pick on the runs' device, once for the out_dir, so that every
    run is given the same one, a rerun's too, whatever a CPU's timing says then; a dtype given stays as given."""
    import compare
    from cram.runtime import DTYPES
    monkeypatch.setattr(compare, "out_dir", str(tmp_path))
    monkeypatch.setattr(compare, "train_args", "--device=cpu")
    monkeypatch.setattr(compare, "dtype", "auto")
    compare.decide_dtype()
    assert compare.dtype in ("float32", "bfloat16") and (tmp_path / "dtype").read_text() == compare.dtype  # a CPU's
    (tmp_path / "dtype").write_text("float16")  # as if the first command had decided another
    monkeypatch.setattr(compare, "dtype", "auto")
    compare.decide_dtype()
    assert compare.dtype == "float16" and compare.dtype in DTYPES  # the rerun keeps the out_dir's precision
    monkeypatch.setattr(compare, "dtype", "bfloat16")
    compare.decide_dtype()
    assert compare.dtype == "bfloat16"


def test_variants_name_configs_or_settings_or_combine_them():
    assert variant_args("crammed") == []
    assert variant_args("recipe_reference+lr=2e-3+batch_size=32") == [
        os.path.join(ROOT, "config", "recipe_reference.py"), "--lr=2e-3", "--batch_size=32"]


def test_compare_errors(tmp_path):
    assert_one_line_error(run_script("tools/compare.py", check=False), "--runs=", "--variants=")
    assert_one_line_error(run_script("tools/compare.py", f"--runs={tmp_path}", check=False), "metrics.jsonl not found")
    out = tmp_path / "compare"
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed,bert_huge", f"--out_dir={out}",
                                     check=False), "unknown variant 'bert_huge'")
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed", "--train_args=--budget_hours=1",
                                     f"--out_dir={out}", check=False), "would be overridden", "--budget_minutes")
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed", "--budget_tokens=1000",
                                     f"--out_dir={out}", check=False), "--protocol=tokens")
    assert not out.exists()  # a refused command creates nothing
    assert_one_line_error(run_script("tools/compare.py", "--variants=crammed", "--protocol=no_such_protocol", check=False),
                          "protocol must be one of")
