import pytest

from configurator import configure


def namespace():
    return {"lr": 1e-3, "steps": 10, "compile": True, "dataset": "pydocs", "betas": (0.9, 0.98), "_private": 1}


@pytest.mark.quick
def test_overrides_and_types():
    ns = namespace()
    configure(ns, ["--lr=3e-4", "--steps=20", "--compile=False", "--dataset=books/a.txt", "--betas=(0.9, 0.95)"])
    assert ns["lr"] == 3e-4 and ns["steps"] == 20 and ns["compile"] is False
    assert ns["dataset"] == "books/a.txt" and ns["betas"] == (0.9, 0.95)


def test_int_accepted_for_float():
    ns = namespace()
    configure(ns, ["--lr=1"])
    assert ns["lr"] == 1.0 and type(ns["lr"]) is float


@pytest.mark.quick
def test_unknown_key_is_an_error():
    with pytest.raises(SystemExit, match="unknown config key 'lrr'"):
        configure(namespace(), ["--lrr=1e-3"])
    with pytest.raises(SystemExit, match="unknown config key '_private'"):
        configure(namespace(), ["--_private=2"])


@pytest.mark.quick
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
    ns, given = namespace(), {}
    configure(ns, [str(cfg), "--steps=4"], given=given)
    assert ns["lr"] == 5e-4 and ns["steps"] == 4
    assert given == {"lr": {str(cfg): 5e-4}, "steps": {str(cfg): 3, "--": 4}}  # where each came from, and what it set
    configure(ns, ["--steps=5", str(cfg), "--lr=1e-3", "--steps=4"], given=(given := {}))  # the last in effect, last
    assert list(given["steps"].items()) == [(str(cfg), 3), ("--", 4)]
    assert list(given["lr"].items()) == [(str(cfg), 5e-4), ("--", 1e-3)]
    bad = tmp_path / "bad.py"
    bad.write_text("stepz = 3\n")
    with pytest.raises(SystemExit, match="unknown config key 'stepz'"):
        configure(namespace(), [str(bad)])
    with pytest.raises(SystemExit, match="config file not found"):
        configure(namespace(), [str(tmp_path / "missing.py")])


@pytest.mark.quick
def test_model_settings_come_from_the_dataclass(tmp_path):
    """A settings dataclass (model.ModelConfig) adds its fields, defaults and types to a script's
    settings: config files and --key=value set them, they land in the returned dict only, and the
    data's fields stay out."""
    from model import DATA_FIELDS, ModelConfig
    cfg = tmp_path / "recipe.py"
    cfg.write_text("smear = False\nn_layers = 4\nlr = 5e-4\n")
    ns = namespace()
    config = configure(ns, [str(cfg), "--d_model=144"], ModelConfig, skip=DATA_FIELDS)
    assert (config["smear"], config["n_layers"], config["d_model"], config["n_heads"]) == (False, 4, 144, 12)
    assert ns["lr"] == config["lr"] == 5e-4 and "n_layers" not in ns
    model = ModelConfig.from_settings(config, vocab_size=300, seq_len=32)
    assert (model.n_layers, model.d_model, model.smear, model.vocab_size) == (4, 144, False, 300)
    with pytest.raises(SystemExit, match="--glu expects bool"):
        configure(namespace(), ["--glu=1"], ModelConfig, skip=DATA_FIELDS)
    with pytest.raises(SystemExit, match="unknown config key 'vocab_size'"):  # it comes from the data
        configure(namespace(), ["--vocab_size=300"], ModelConfig, skip=DATA_FIELDS)


@pytest.mark.parametrize("script", ["train.py", "prepare.py", "bench.py", "finetune_glue.py", "tools/export.py",
                                    "tools/compare.py", "tools/gpu_report.py", "tools/bench_offload.py",
                                    "tools/bench_prepare.py", "tools/curriculum.py", "tools/bench_memory.py"])
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
    if script == "finetune_glue.py":  # a long default: its comment on a line of its own
        assert "  --tasks=cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte\n" + " " * 37 + "wnli on request" in out
    if script == "train.py":
        assert "  --budget_hours=24.0" in out and "the schedules follow the run's progress" in out
        assert "  --data_dir=data/fineweb-edu" in out
        # the model's settings, declared once in model.py's ModelConfig, with their comments
        assert "ModelConfig (model.py)" in out and "  --n_layers=0" in out and "  --smear=True" in out
        assert "pre-LayerNorm (False: the original post-norm)" in out and "--vocab_size" not in out


def test_integer_bounds_are_exact():
    """A bound written as an integer is compared as one: float('18446744073709551615') is 2**64, so a
    float comparison would let 2**64 through to a library that overflows on it."""
    from configurator import allowed
    test, words = allowed("[0, 18446744073709551615]: a uint64")
    assert test(2 ** 64 - 1) and not test(2 ** 64) and words == "in [0, 18446744073709551615]"
    assert not allowed(">= 1")[0](0) and allowed("(0, 1.5]")[0](1.5) and not allowed("> 1e3")[0](1000)
