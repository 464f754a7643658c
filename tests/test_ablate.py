"""ablate.py: variants timed, then trained for the tokens their speed reaches; reruns reuse finished runs."""
import json

from conftest import TINY_MODEL, assert_one_line_error, run_script

ARGS = ["--seeds=2", "--budget_minutes=0.05", "--speed_steps=4", "--speed_repeats=1",
        "--train_args=--compile=False --eval_interval_minutes=0.02 " + " ".join(TINY_MODEL)]


def test_ablation_table_and_rerun(prepared, tmp_path):
    base = tmp_path / "base.py"
    base.write_text(f"data_dir = {str(prepared)!r}\n")
    out = tmp_path / "ablate"
    proc = run_script("ablate.py", "--variants=reference,mask40", f"--base={base}", f"--out_dir={out}", *ARGS)
    results = json.loads((out / "results.json").read_text())
    for name in ("reference", "mask40"):
        r = results["variants"][name]
        assert len(r["val_loss"]) == 2 and r["budget_tokens"] == int(r["tokens_per_s"] * 3)
        # each run trained for its variant's token budget (the last step may pass it by one batch)
        assert all(r["budget_tokens"] <= c[-1]["tokens"] < r["budget_tokens"] + 32 * 32 for c in r["curves"])
        assert f"| {name} |" in proc.stdout
    assert results["target"] == sum(results["variants"]["reference"]["val_loss"]) / 2
    # a rerun with one more seed trains only that seed
    stamp = (out / "mask40" / "seed0" / "ckpt.pt").stat().st_mtime
    proc = run_script("ablate.py", "--variants=reference,mask40", f"--base={base}", f"--out_dir={out}",
                      *ARGS[1:], "--seeds=3")
    assert (out / "mask40" / "seed0" / "ckpt.pt").stat().st_mtime == stamp
    assert len(json.loads((out / "results.json").read_text())["variants"]["mask40"]["val_loss"]) == 3


def test_bad_variants_give_one_line_errors(tmp_path):
    assert_one_line_error(run_script("ablate.py", "--variants=reference,adam9", f"--out_dir={tmp_path}", check=False),
                          "unknown variant adam9")
    assert_one_line_error(run_script("ablate.py", "--variants=muon", f"--out_dir={tmp_path}", check=False),
                          "must start with 'reference'")


def test_variants_name_settings_or_combine_them():
    from ablate import variant_args
    assert variant_args("reference") == []
    assert variant_args("muon+lr=2e-3+batch_size=32") == ["--optim=muon", "--lr=2e-3", "--batch_size=32"]
