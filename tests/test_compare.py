import json

from conftest import assert_one_line_error, run_script


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
    out = run_script("compare.py", f"--runs={tmp_path / 'a'},{tmp_path / 'b'}", f"--png={png}").stdout
    assert f"| {tmp_path / 'a'} | 6.0000 | 0.150 | 2.0 | 0.00M | 20 |" in out
    assert f"| {tmp_path / 'b'} | 7.0000 | 0.120 | 1.0 | 0.00M | 10 |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


# compare.py --recipes (recipes trained at equal time) runs in tests/test_gpu_report.py's recipes phase


def test_compare_errors(tmp_path):
    assert_one_line_error(run_script("compare.py", check=False), "--runs=", "--recipes=")
    assert_one_line_error(run_script("compare.py", f"--runs={tmp_path}", check=False), "metrics.jsonl not found")
    assert_one_line_error(run_script("compare.py", "--recipes=bert_huge", check=False), "unknown recipe 'bert_huge'")
