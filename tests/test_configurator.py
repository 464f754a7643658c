import pytest

from configurator import configure


def namespace():
    return {"lr": 1e-3, "steps": 10, "compile": True, "dataset": "pydocs", "betas": (0.9, 0.98), "_private": 1}


def test_overrides_and_types():
    ns = namespace()
    configure(ns, ["--lr=3e-4", "--steps=20", "--compile=False", "--dataset=books/a.txt", "--betas=(0.9, 0.95)"])
    assert ns["lr"] == 3e-4 and ns["steps"] == 20 and ns["compile"] is False
    assert ns["dataset"] == "books/a.txt" and ns["betas"] == (0.9, 0.95)


def test_int_accepted_for_float():
    ns = namespace()
    configure(ns, ["--lr=1"])
    assert ns["lr"] == 1.0 and type(ns["lr"]) is float


def test_unknown_key_is_an_error():
    with pytest.raises(SystemExit, match="unknown config key 'lrr'"):
        configure(namespace(), ["--lrr=1e-3"])
    with pytest.raises(SystemExit, match="unknown config key '_private'"):
        configure(namespace(), ["--_private=2"])


def test_wrong_type_is_an_error():
    with pytest.raises(SystemExit, match="--steps expects int"):
        configure(namespace(), ["--steps=2.5"])
    with pytest.raises(SystemExit, match="--compile expects bool"):
        configure(namespace(), ["--compile=yes"])
    with pytest.raises(SystemExit, match="--lr expects float, cannot parse"):
        configure(namespace(), ["--lr=fast"])
    with pytest.raises(SystemExit, match="expected --key=value"):
        configure(namespace(), ["--lr"])


def test_config_file_then_command_line(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("lr = 5e-4\nsteps = 3\n")
    ns = namespace()
    configure(ns, [str(cfg), "--steps=4"])
    assert ns["lr"] == 5e-4 and ns["steps"] == 4
    bad = tmp_path / "bad.py"
    bad.write_text("stepz = 3\n")
    with pytest.raises(SystemExit, match="unknown config key 'stepz'"):
        configure(namespace(), [str(bad)])
    with pytest.raises(SystemExit, match="config file not found"):
        configure(namespace(), [str(tmp_path / "missing.py")])


@pytest.mark.parametrize("script", ["train.py", "prepare.py", "bench.py", "finetune_glue.py", "export.py", "compare.py",
                                    "ablate.py"])
def test_help_lists_every_setting_with_its_default_and_comment(script):
    import runpy
    from conftest import ROOT, run_script
    for flag in ("--help", "-h"):
        proc = run_script(script, flag)
        assert proc.returncode == 0 and proc.stderr == ""
        out = proc.stdout
        first_docstring_line = open(f"{ROOT}/{script}").read().split('"""')[1].splitlines()[0]
        assert out.startswith(first_docstring_line)
        settings = runpy.run_path(f"{ROOT}/{script}", run_name="not_main")
        from configurator import config_keys
        for key in config_keys(settings):
            assert f"  --{key}=" in out, key
    if script == "train.py":
        assert "  --budget_hours=24.0" in out and "the schedules follow the share spent" in out
        assert "  --data_dir=data/pydocs" in out and "model (the reference crammed-BERT shape" in out
