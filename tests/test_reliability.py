"""Reliability, class by class: every bad input and every fault is a one-line answer, and nothing
already finished is lost. Each class has its mechanism and a table of cases here."""
import contextlib
import errno
import json
import math
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_MODEL, assert_one_line_error, run_script
from configurator import allowed, config_keys, declarations
from cram.files import claim_folder, load_meta, read_jsonl, read_metrics, write_atomically

SCRIPTS = ["train.py", "prepare.py", "bench.py", "finetune_glue.py", "tools/export.py", "tools/compare.py",
           "tools/gpu_report.py", "tools/bench_offload.py", "tools/bench_prepare.py", "tools/curriculum.py",
           "tools/bench_memory.py"]


def error_of(script, *args):
    """The one-line error of running `script` with args, in this process (cheap: the settings are
    checked before any work, so no case gets far)."""
    argv = sys.argv
    sys.argv = [script, *map(str, args)]
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        sys.argv = argv
    message = str(stop.value)
    assert message.startswith("error:") and "\n" not in message, message
    return message


# ------------------------------------------------------------------ 3. settings checked at the start, all of them
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_number_setting_declares_its_range(script):
    """One mechanism for all scripts: the allowed values beside each setting (its comment), so no
    int or float setting goes unchecked."""
    from model import DATA_FIELDS, ModelConfig
    namespace = runpy.run_path(os.path.join(ROOT, script), run_name="not_main")
    cls = ModelConfig if script == "train.py" else None
    declared = {d[1]: d[2] for d in declarations(namespace, cls, DATA_FIELDS) if d[0] == "setting"}
    numbers = [k for k, v in config_keys(namespace).items() if type(v) in (int, float)]
    assert [k for k in numbers if not allowed(declared.get(k))] == []


SETTINGS = [  # (script, arguments, what the error says)
    ("train.py", ["--grad_clip=-1"], "--grad_clip=-1.0 is not allowed: grad_clip must be >= 0"),
    ("train.py", ["--max_skipped_steps=0"], "max_skipped_steps must be >= 1"),
    ("train.py", ["--lr=-1"], "lr must be in [0, inf)"),
    ("train.py", ["--lr=1e999"], "lr must be in [0, inf)"),
    ("train.py", ["--n_heads=3", "--d_model=64"], "d_model=64 must be a multiple of n_heads=3"),
    ("train.py", ["--d_ffn=255"], "d_ffn=255 must be even with glu"),
    ("train.py", ["--mask_rate=1.5"], "mask_rate must be in (0, 1)"),
    ("train.py", ["--d_model=-1"], "d_model must be >= 0"),
    ("train.py", ["--eval_sequences=0"], "eval_sequences must be >= 1"),
    ("train.py", ["--log_interval=0"], "log_interval must be >= 1"),
    ("train.py", ["--fill_in_examples=-1"], "fill_in_examples must be >= 0"),
    ("train.py", ["--budget_tokens=-5"], "budget_tokens must be >= 0"),
    ("train.py", ["--budget_hours=0"], "budget_hours must be > 0"),
    ("train.py", ["--micro_batch=-3"], "micro_batch must be >= 0"),
    ("train.py", ["--batch_ramp=1.5"], "batch_ramp must be in [0, 1]"),
    ("train.py", ["--optim=no_such_optimizer"], "optim must be one of adamw"),
    ("train.py", ["--lr_schedule=no_such_schedule"], "lr_schedule must be one of"),
    ("train.py", ["--data_order=no_such_order"], "data_order must be one of"),
    ("train.py", ["--dtype=no_such_dtype"], "dtype must be one of auto"),
    ("train.py", ["--micro_batch=1.5"], "--micro_batch expects int"),
    # integers that reach torch's and numpy's limits, compared exactly (not as floats)
    ("train.py", ["--seed=1180591620717411303424"], "seed must be in [0, 4294967295]"),
    ("finetune_glue.py", ["--seed=4294967296"], "seed must be in [0, 4294967295]"),
    ("finetune_glue.py", ["--seeds=100000000000000000001"], "seeds must be in [0, 100000]"),
    ("prepare.py", ["--vocab_size=100"], "vocab_size must be >= 260"),
    ("prepare.py", ["--val_fraction=0"], "val_fraction must be in (0, 1)"),
    ("prepare.py", ["--seq_len=1"], "seq_len must be >= 2"),
    ("prepare.py", ["--workers=-1"], "workers must be >= 0"),
    ("finetune_glue.py", ["--seeds=-1"], "seeds must be in [0, 100000]"),
    ("finetune_glue.py", ["--dropout=1"], "dropout must be in [0, 1)"),
    ("finetune_glue.py", ["--epochs=-1"], "epochs must be >= 0"),
    ("bench.py", ["--steps=-1"], "steps must be >= 0"),
    ("bench.py", ["--shape=no_such_shape"], "shape must be one of"),
    ("tools/compare.py", ["--seeds=0"], "seeds must be in [1, 100000]"),
    ("tools/compare.py", ["--protocol=no_such_protocol"], "protocol must be one of"),
    ("tools/curriculum.py", ["--block=0"], "block must be >= 1"),
]


@pytest.mark.parametrize("script,args,fragment", SETTINGS, ids=[" ".join(c[1]) for c in SETTINGS])
def test_a_bad_setting_is_one_line_naming_it(script, args, fragment):
    """A setting's allowed values are matched as a set, never as the error's list (a new schedule may go anywhere)."""
    message = error_of(script, *args)
    assert fragment in message
    if "must be one of" in fragment:  # the names allowed, in any order: the refused value is not one of them
        names = message.split("must be one of ")[1].split(", ")
        assert names and args[-1].split("=", 1)[1] not in names, message


def test_a_setting_of_any_size_is_a_one_line_error_that_quotes_it_short():
    for args, fragment in ((["--seed=" + "9" * 4000], "(4,000 characters) is not allowed"),
                           (["--seed=" + "9" * 5000], "--seed expects int, cannot parse"),  # past int()'s 4,300 digits
                           (["--lr=" + "[" * 100000], "--lr expects float, cannot parse"),
                           (["--" + "x" * 100000 + "=1"], "(100,000 characters)' (known keys")):
        message = error_of("train.py", *args)
        assert fragment in message and len(message) < 1000, message[:200]


# ------------------------------------------------------------------ 3b. a step that cannot fit is refused before the work
# The memory a step surely needs (memory.check_memory: lower estimates from the shape), against the
# machine's: values past any machine's memory, chosen so that the ordering of the checks (the model,
# the batch's token ids, a micro-batch's activations) names the setting at fault on any machine
# from 8 GB to 50 TB.
MEMORY = [  # (script, arguments, what the error says)
    ("train.py", ["--micro_batch=1000000000000", "--batch_size=1000000000000"],
     "--batch_size=1000000000000 needs at least"),
    ("train.py", ["--micro_batch=16777216", "--batch_size=16777216"], "--micro_batch=16777216 needs at least"),
    ("train.py", ["--n_layers=100000", "--d_model=16384"], "a model of 100000 x 16384"),
    ("train.py", ["--micro_batch=0", "--batch_size=16", "--n_layers=20000", "--d_model=16384"],
     "a model of 20000 x 16384"),
    ("bench.py", ["--shape=reference", "--micro_batch=1073741824"], "--micro_batch=1073741824 needs at least"),
]


@pytest.mark.parametrize("script,args,fragment", MEMORY, ids=[" ".join(c[1]) for c in MEMORY])
def test_a_step_that_cannot_fit_in_memory_names_the_setting_and_the_largest_that_fits(script, args, fragment,
                                                                                      prepared, tmp_path):
    out = tmp_path / "run"
    data = [*TINY_MODEL, f"--data_dir={prepared}", f"--out_dir={out}"] if script == "train.py" else ["--device=cpu"]
    message = error_of(script, *data, *args)
    assert fragment in message and ("the largest that fits is about" in message or "choose a smaller" in message)
    assert not out.exists()  # refused before the folder was claimed: nothing written, nothing lost


def test_finetuning_batches_that_cannot_fit_are_refused_before_the_work(pretrained, tmp_path):
    glue_dir = os.path.join(ROOT, "tests", "fixtures", "glue")  # read first: the epochs follow the file's examples
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={glue_dir}", "--tasks=rte", "--device=cpu",
            f"--out_json={tmp_path / 'glue.json'}"]
    assert "--batch_size=16777216 needs at least" in error_of(*args, "--batch_size=16777216")
    assert "--eval_batch_size=4294967296 needs at least" in error_of(*args, "--eval_batch_size=4294967296")
    assert not (tmp_path / "glue.json").exists()


def test_the_memory_check_s_largest_value_fits_and_one_more_does_not():
    from cram import memory, runtime
    from model import ModelConfig
    config = ModelConfig(vocab_size=384, seq_len=32, n_layers=2, d_model=64, n_heads=2, d_ffn=256)
    rt = runtime.setup("cpu", "float32", compile=False)

    def refusal(micro, batch):  # None where it fits in 1 GB
        try:
            memory.check_memory(config, rt, 0.25, (micro, f"--micro_batch={micro}"), (batch, f"--batch_size={batch}"),
                                capacity=10 ** 9)
        except SystemExit as e:
            return str(e)

    for name, sizes in (("--batch_size", lambda n: (1, n)), ("--micro_batch", lambda n: (n, 16))):
        message = refusal(*sizes(10 ** 8))
        assert message.startswith(f"error: {name}=100000000 needs at least"), message
        largest = int(message.split("the largest that fits is about ")[1].replace(",", ""))
        assert refusal(*sizes(largest)) is None and refusal(*sizes(largest + 1)).startswith(f"error: {name}=")
    # bfloat16 keeps activations in half the bytes: a larger micro-batch fits
    assert config.step_bytes(0.25, 2) < config.step_bytes(0.25, 4)
    # a narrowed layer keeps its activations at the 8 masked positions and its keys and values at the other 24
    # (tools/bench_memory.py --full_layers=2 measures it); fine-tuning (mask_rate 0) runs it over every position
    narrowed = ModelConfig(**dict(config.__dict__, full_layers=1))
    per_position = (6 * 64 + 1.5 * 256) * 4 + 4 * 64
    assert config.step_bytes(0.25, 4) - narrowed.step_bytes(0.25, 4) == 24 * (per_position - 2 * 64 * 4)
    assert narrowed.step_bytes(0, 4) == config.step_bytes(0, 4)


def test_the_memory_check_lets_off_load_mode_train_what_it_was_measured_training():
    """Off-load mode keeps each block's input and recomputes one block at a time: on the H100 at the reference
    shape and micro-batch 512 in bfloat16 it trained under a 12 GiB cap (peak 10.1 GiB), which normal mode's
    estimate (every layer's activations, 23 GiB) would refuse; docs/offload.md's 48 x 2048 at 512 fits 80 GiB."""
    from cram import memory, runtime
    from model import SHAPES, ModelConfig
    rt, gib = runtime.setup("cpu", "bfloat16", compile=False), 2 ** 30
    config = ModelConfig(**SHAPES["reference"])
    memory.check_memory(config, rt, 0.25, (512, "--micro_batch=512"), (512, "--batch_size=512"), offload=True,
                        capacity=12 * gib)
    assert memory.least_bytes(config, rt, 0.25, offload=True)[1] * 512 < 10.1 * gib  # below what it took
    with pytest.raises(SystemExit, match="--micro_batch=512 needs at least"):
        memory.check_memory(config, rt, 0.25, (512, "--micro_batch=512"), (512, "--batch_size=512"), capacity=12 * gib)
    wide = ModelConfig(**dict(SHAPES["reference"], n_layers=48, d_model=2048, n_heads=32, d_ffn=8192))
    assert memory.least_bytes(wide, rt, 0.25, offload=True)[1] * 512 < 80 * gib


def test_a_bad_config_file_names_its_file_and_line(tmp_path):
    cases = {"lr = 1e-3\nn_layers = (\n": ":2: '(' was never closed", "lr = 1e-3\nx = 1 / 0\n": ":2: ZeroDivisionError",
             "lr = float('nan')\n": "lr must be in [0, inf)", "budget_hours = '1'\n": "config3.py's budget_hours expects float"}
    for i, (text, fragment) in enumerate(cases.items()):
        path = tmp_path / f"config{i}.py"
        path.write_text(text)
        assert fragment in error_of("train.py", path)
    # and as a user sees it: one line on stderr, status 1
    assert_one_line_error(run_script("train.py", tmp_path / "config0.py", check=False), "config0.py:2")


def test_a_rule_s_answer_is_the_same_in_any_order_of_the_arguments(tmp_path, monkeypatch):
    """Issue 100, class 5. Named: `train.py my_adafactor.py --optim=adafactor`, the file choosing Adafactor and setting
    its own lr, was refused ("my_adafactor.py's lr=0.01 is AdamW's"), the other order ran. The rule now asks who set the
    rate in effect and whether that source chose this optimizer, not which argument came last. Unnamed: every order of
    three arguments, and two files that set the same rate, only one of them choosing Adafactor (the old rule's answer
    followed whichever came last); where the order changes the rate in effect (later wins), the answer follows the rate."""
    from itertools import permutations
    import train
    from configurator import configure
    from cram import setup
    from cram.budget import SHAPE_FIELDS
    from model import DATA_FIELDS, OPTIMIZERS, ModelConfig, Optimizer
    monkeypatch.setitem(OPTIMIZERS, "adafactor", Optimizer(None, 4))  # a fork's row: no width rule
    own, same, adamw = tmp_path / "my_adafactor.py", tmp_path / "same_rate.py", tmp_path / "adamw_tuned.py"
    own.write_text('optim = "adafactor"\nlr = 0.01\n')
    same.write_text("lr = 0.01\n")
    adamw.write_text("lr = 2e-3\n")

    refusal = f"optim=adafactor needs --lr: {adamw}'s lr=0.002 is AdamW's"  # the optimizer named where it was set

    def check(argv):
        """Refused exactly where adamw_tuned.py's rate is the one in effect, else it runs: never by the order."""
        given = {}
        config = configure(dict(vars(train)), list(map(str, argv)), ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS, given=given)
        with pytest.raises(SystemExit, match=re.escape(refusal)) if config["lr"] == 2e-3 else contextlib.nullcontext():
            setup.check_settings(1, config, None, given)
    check([own, "--optim=adafactor"])  # the named pair, each order
    check(["--optim=adafactor", own])
    for args in ([own, "--optim=adafactor", "--seed=3"], [same, own, "--optim=adafactor"], [adamw, own, "--optim=adafactor"],
                 [adamw, "--optim=adafactor", "--seed=3"]):
        for order in permutations(args):
            check(order)


def test_a_line_names_a_setting_as_the_user_gave_it(tmp_path, capfd, monkeypatch):
    """Issue 100, class 6. Named: a resume's refusal named --batch_ramp_start=32, a value from a config file, as if typed;
    datasets' own log said "row 1455" beside prepare.py's true "line 8723". Now a setting from a file is named by the
    file and its key (configurator.named) and the loader's row is not shown. Unnamed: a config file's value out of its
    range or of the wrong type, and its optimizer where the rate rule refuses."""
    import dataclasses
    import prepare
    import train
    from configurator import config_keys, configure
    from cram import setup
    from cram.budget import SHAPE_FIELDS
    from cram.setup import resume_settings
    from model import DATA_FIELDS, OPTIMIZERS, ModelConfig, Optimizer
    run = dict(config_keys(vars(train)), batch_ramp_start=64, batch_size=256, lr=1e-3, budget_tokens=8192)
    ckpt = dict(config=run, model_args=dataclasses.asdict(ModelConfig()), data_dir=str(tmp_path), tokens=0, elapsed=0.0)
    ramp = tmp_path / "ramp.py"
    ramp.write_text("batch_ramp_start = 32\n")
    given = {}
    config = configure(dict(vars(train)), [str(ramp), "--resume=True"], ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS,
                       given=given)
    with pytest.raises(SystemExit, match=f"error: {re.escape(str(ramp))}'s batch_ramp_start=32 differs from its "
                                         f"checkpoint's 64, and a resume continues its run: leave it out"):
        resume_settings(ckpt, config, given)
    records = tmp_path / "books.jsonl"
    records.write_text("".join(json.dumps({"text": f"book {i}"}) + "\n" for i in range(3000)) + '{"text": "cut\n')
    with pytest.raises(SystemExit, match=f"{re.escape(str(records))}:3001 is not a JSON line"):
        list(prepare.record_file(str(records))())
    assert "row" not in capfd.readouterr().err
    monkeypatch.setitem(OPTIMIZERS, "adafactor", Optimizer(None, 4))  # a fork's row: no width rule
    for i, (text, fragment) in enumerate((("mask_rate = 2.0\n", "'s mask_rate=2.0 is not allowed: mask_rate must be in (0, 1)"),
                                          ("seed = 1.5\n", "'s seed expects int, got 1.5 (float)"),
                                          ('optim = "adafactor"\n', "'s optim=adafactor needs --lr: the width's rule"))):
        path = tmp_path / f"settings{i}.py"
        path.write_text(text)
        given = {}
        with pytest.raises(SystemExit, match=f"error: {re.escape(str(path) + fragment)}"):
            setup.check_settings(1, configure(dict(vars(train)), [str(path)], ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS,
                                              given=given), None, given)


def test_an_out_dir_that_cannot_be_written_is_refused_before_any_work(prepared, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    for out, fragment in ((tmp_path / "file", "is a file, not a folder"), (tmp_path / "file" / "run", "cannot write"),
                          ("/proc/cram_run", "cannot write")):
        assert fragment in error_of("train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL)
        assert fragment in error_of("prepare.py", f"--out_dir={out}")
        assert fragment in error_of("tools/gpu_report.py", "--phases=bench", f"--out_dir={out}")
        assert fragment in error_of("tools/compare.py", "--variants=crammed", f"--out_dir={out}")
    assert (tmp_path / "file").read_text() == "not a folder"


# ------------------------------------------------------------------ 1. recovery after divergence recovers
@pytest.mark.parametrize("bad_lr", ["1e6", "1e300"])
def test_a_diverged_run_names_a_checkpoint_that_recovers(pretrained, tmp_path, bad_lr):
    """Diverge on purpose with a checkpoint due every step: the stop names the last checkpoint whose
    weights are finite and whose loss has not diverged, and a sane lr resumed from it trains on."""
    shutil.copy(pretrained, tmp_path / "ckpt.pt")
    data_dir = torch.load(pretrained)["data_dir"]
    train = ["train.py", f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_MODEL, "--resume=True"]
    proc = run_script(*train, f"--lr={bad_lr}", "--ckpt_interval_minutes=0", "--max_steps=100", check=False)
    assert_one_line_error(proc, "steps in a row diverged", f"the last checkpoint is {tmp_path / 'ckpt.pt'} at step 60",
                          "lower --lr and resume it")
    assert "not saved" in proc.stdout
    named = torch.load(tmp_path / "ckpt.pt")
    assert named["step"] == 60 and all(v.isfinite().all() for v in named["model"].values())
    before = read_metrics(pretrained.parent)[-1]["val_loss"]  # the named checkpoint's loss
    run_script(*train, "--max_steps=100", "--fill_in_examples=0")
    after = read_metrics(tmp_path)[-1]
    assert after["step"] == 100 and after["val_loss"] < before


def with_junk(prepared, folder, steps, batch=16):
    """A copy of the prepared data whose training rows for `steps` (1-based, read in file order at `batch` a step)
    are random tokens: a batch of junk, which a trained model's loss spikes on."""
    shutil.copytree(prepared, folder)
    meta = json.loads((folder / "meta.json").read_text())
    rows = np.memmap(folder / "train.bin", dtype=meta["dtype"], mode="r+", shape=(meta["train_sequences"], meta["seq_len"]))
    for step in steps:
        rows[(step - 1) * batch:step * batch] = np.random.default_rng(step).integers(0, meta["n_regular"], (batch, meta["seq_len"]))
    rows.flush()
    return folder


def test_a_new_masked_count_starts_the_spike_history_again_and_a_rate_that_keeps_the_count_does_not():
    """A rising masking rate lifts the loss at each new count of masked tokens per row. Judged against the old count's
    history, every step after the rise would be a spike (a spike never joins the history), and max_skipped_steps would
    end a sound run. The watch starts its history again at a new count, and still catches a spike at the same count.
    Rates that give a row the same count mask the same tokens, so a schedule that moves the rate a little every step
    keeps one history, and a spike among them is caught. Its state keeps the count; an older checkpoint's rate loads."""
    from model import masked_count
    from train import SPIKE_HISTORY, SpikeWatch
    watch = SpikeWatch(6.0)
    for i in range(SPIKE_HISTORY + 10):
        assert not watch.is_spike(2.0 + 0.01 * (i % 2), masked=19)
    assert watch.is_spike(2.6, masked=19)  # at the same count: a spike
    assert not any(watch.is_spike(2.6 + 0.01 * (i % 2), masked=32) for i in range(SPIKE_HISTORY + 10))  # a new count
    smooth = [masked_count(0.25 + 0.0001 * i, 128) for i in range(3)]  # a rate that moves every step, 32 of 128 each
    assert smooth == [32] * 3 and not watch.is_spike(2.61, masked=smooth[1]) and watch.is_spike(3.4, masked=smooth[2])
    resumed = SpikeWatch(6.0, **watch.state_dict())
    assert resumed.masked == 32 and resumed.is_spike(3.4, masked=32)
    older = {k: v for k, v in watch.state_dict().items() if k != "masked"} | {"rate": 0.25}  # a checkpoint from before
    assert SpikeWatch(6.0, **older).masked == 0


def test_a_loss_spike_is_skipped_never_saved_and_a_run_of_them_stops_at_the_last_good_checkpoint(prepared, tmp_path):
    """A batch of junk at step 31 is a spike by the run's own history (far below ln V + 1, which `diverged` reads):
    its update is skipped and the run goes on; five in a row stop the run with the divergence line, naming the
    last checkpoint before them, which stays with the keep_checkpoints - 1 before it (and no more), and resumes."""
    train = ["train.py", *TINY_MODEL, "--batch_size=16", "--data_order=file", "--ckpt_interval_minutes=0",
             "--log_interval=1", "--fill_in_examples=0", "--keep_checkpoints=3"]
    data = with_junk(prepared, tmp_path / "once", [31])  # a resume reads the data it trained on, junk and all
    once = run_script(*train, f"--data_dir={data}", f"--out_dir={tmp_path / 'a'}", "--max_steps=40")
    records = {r["step"]: r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if r["kind"] == "train"}
    assert records[31]["skipped"] == 1 and records[40]["skipped"] == 1 and records[31]["loss"] > records[30]["loss"] + 1
    assert records[31]["loss"] < math.log(384) + 1 and "final:" in once.stdout  # not a divergence by the old test
    assert sorted(os.listdir(tmp_path / "a")) == [".lock", "ckpt.pt", "ckpt_00000038.pt", "ckpt_00000039.pt", "metrics.jsonl"]
    os.replace(tmp_path / "a" / "ckpt.pt", tmp_path / "newest.pt")  # a series alone: a fresh run refuses, saying how to go on
    fresh = run_script(*train, f"--data_dir={data}", f"--out_dir={tmp_path / 'a'}", "--max_steps=41", check=False)
    assert_one_line_error(fresh, "ckpt_00000039.pt exists: continue it with --resume=True --resume_from=ckpt_00000039.pt")
    advised = run_script(*train, f"--data_dir={data}", f"--out_dir={tmp_path / 'a'}", "--max_steps=41", "--resume=True",
                         "--resume_from=ckpt_00000039.pt")
    assert "resuming" in advised.stdout and torch.load(tmp_path / "a" / "ckpt.pt")["step"] == 41
    junk = with_junk(prepared, tmp_path / "five", range(31, 36))
    proc = run_script(*train, f"--data_dir={junk}", f"--out_dir={tmp_path / 'b'}", "--max_steps=60", check=False)
    assert_one_line_error(proc, "5 steps in a row diverged", "or a spike: 6 standard deviations and 10% above the recent mean) up "
                          "to step 35", "(the one before it: --resume_from=ckpt_00000029.pt)", f"the last checkpoint is {tmp_path / 'b' / 'ckpt.pt'} at step 30", "lower --lr")
    assert torch.load(tmp_path / "b" / "ckpt.pt")["step"] == 30
    assert sorted(n for n in os.listdir(tmp_path / "b") if n.endswith(".pt")) == ["ckpt.pt", "ckpt_00000028.pt",
                                                                                  "ckpt_00000029.pt"]
    resumed = run_script(*train, f"--data_dir={junk}", f"--out_dir={tmp_path / 'b'}", "--max_steps=40", "--resume=True",
                         "--max_skipped_steps=6")  # the five junk batches again: skipped, one short of a stop
    assert "resuming" in resumed.stdout and torch.load(tmp_path / "b" / "ckpt.pt")["step"] == 40
    # an older one by name: the later ones set aside, kept out of the series
    older = run_script(*train, f"--data_dir={junk}", f"--out_dir={tmp_path / 'b'}", "--max_steps=45", "--resume=True",
                       "--resume_from=ckpt_00000039.pt")
    assert f"resuming {tmp_path / 'b' / 'ckpt_00000039.pt'} at step 39" in older.stdout and "abandoned_ckpt.pt" in older.stdout
    assert torch.load(tmp_path / "b" / "abandoned_ckpt.pt")["step"] == 40
    assert torch.load(tmp_path / "b" / "ckpt.pt")["step"] == 45


def test_a_fresh_run_that_diverges_saves_no_checkpoint(prepared, tmp_path):
    proc = run_script("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--lr=1e6",
                      "--ckpt_interval_minutes=0", "--max_steps=40", check=False)
    assert_one_line_error(proc, "no checkpoint was saved", "lower --lr and start again")
    assert not (tmp_path / "ckpt.pt").exists()


def test_unsound_final_weights_with_nothing_saved_say_start_again_and_that_works(prepared, tmp_path):
    """The last save refused with no checkpoint before it: the line's advice is to start again at a lower rate, not to
    resume what does not exist; followed in the same folder, it trains."""
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--max_steps=8", "--fill_in_examples=0"]
    proc = run_script(*train, "--lr=1e6", "--max_skipped_steps=1000", check=False)
    assert_one_line_error(proc, "were not saved", "no checkpoint was saved: lower --lr and start again")
    assert "final:" in run_script(*train).stdout and torch.load(tmp_path / "ckpt.pt")["step"] == 8


# ------------------------------------------------------------------ 2. a resume that would quietly change the run
def test_a_resume_refuses_what_would_change_the_run_and_carries_a_dtype_over(prepared, pretrained, tmp_path,
                                                                            corpus_file):
    other = tmp_path / "other_tokenizer"  # the same vocabulary size, another tokenizer
    run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={other}", "--vocab_size=384", "--seq_len=32",
               "--val_fraction=0.05", "--tokenizer_train_chars=5000")
    nan = torch.load(pretrained)
    nan["model"]["blocks.0.ffn.up.weight"][0, 0] = float("nan")
    torch.save(nan, tmp_path / "nan.pt")
    refused = [([f"--data_dir={other}"], "ckpt.pt", "trained with another tokenizer"),
               (["--optim=muon"], "ckpt.pt", "--optim=muon differs from its checkpoint's adamw"),
               (["--n_layers=3"], "ckpt.pt", "--n_layers=3 differs from its checkpoint's 2"),
               ([], "nan.pt", "holds non-finite weights")]
    for i, (args, source, fragment) in enumerate(refused):
        out = tmp_path / f"run{i}"
        out.mkdir()
        shutil.copy(pretrained if source == "ckpt.pt" else tmp_path / source, out / "ckpt.pt")
        before = (out / "ckpt.pt").read_bytes()
        assert fragment in error_of("train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL,
                                    "--resume=True", *args)
        assert (out / "ckpt.pt").read_bytes() == before
    # another autocast dtype carries over (a run moved to a GPU without bfloat16 gets float16): the
    # float16 loss scaler starts fresh, and its state is dropped again on the way back
    out = tmp_path / "moved"
    out.mkdir()
    shutil.copy(pretrained, out / "ckpt.pt")
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL, "--resume=True",
             "--fill_in_examples=0"]
    run_script(*train, "--dtype=float16", "--max_steps=65")
    assert torch.load(out / "ckpt.pt")["scaler"]
    # dtype=auto keeps the precision the checkpoint trained in on a device of its type (the settled
    # dtype and device are in its config), whatever this CPU's own rule would pick
    assert torch.load(out / "ckpt.pt")["config"]["dtype"] == "float16"
    proc = run_script(*train, "--dtype=auto", "--max_steps=67")
    assert "device: cpu, float16 (auto: as the run it continues)" in proc.stdout
    assert {k: torch.load(out / "ckpt.pt")["config"][k] for k in ("device", "dtype")} == dict(device="cpu", dtype="float16")
    run_script(*train, "--dtype=float32", "--max_steps=70")
    assert torch.load(out / "ckpt.pt")["step"] == 70


# ------------------------------------------------------------------ 4. two processes, one folder
HOLD = "import sys, time; sys.path.insert(0, {root!r}); from cram.files import claim_folder; claim_folder({out!r}); " \
       "print('held', flush=True); time.sleep(60)"


def test_a_folder_in_use_is_refused_and_a_crash_frees_it(prepared, corpus_file, tmp_path):
    out = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD.format(root=ROOT, out=str(out))], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for script, args in (("train.py", [f"--data_dir={prepared}", *TINY_MODEL]),
                             ("prepare.py", [f"--dataset={corpus_file}", "--vocab_size=384"])):
            proc = run_script(script, f"--out_dir={out}", *args, check=False)
            assert_one_line_error(proc, f"{out} is in use by another process (pid {holder.pid})")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # neither wrote anything there
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run_script("train.py", f"--out_dir={out}", f"--data_dir={prepared}", *TINY_MODEL, "--max_steps=5",
               "--fill_in_examples=0")  # the killed holder's lock went with it
    assert [r["step"] for r in read_metrics(out)] == [0, 5]


# ------------------------------------------------------------------ 5. stale or damaged state is not trusted
def test_a_tokenizer_left_by_a_failed_run_is_not_reused_for_another_text(tmp_path, corpus_file):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("")
    args = ["prepare.py", f"--dataset={corpus}", f"--out_dir={tmp_path / 'out'}", "--vocab_size=384", "--seq_len=32"]
    assert_one_line_error(run_script(*args, check=False), "too little text")
    corpus.write_text(corpus_file.read_text())  # refilled
    proc = run_script(*args)
    assert "reusing" not in proc.stdout and load_meta(tmp_path / "out")["vocab_size"] == 384


DAMAGES = {  # what is done to the progress record of an interrupted preparation
    "truncated": lambda text: text[:len(text) // 2],
    "wrong type": lambda text: "[1, 2, 3]",
    "counts beyond the files": lambda text: text.replace('"sequences": ', '"sequences": 1000', 1),
    "bytes beyond the files": lambda text: text.replace('"bytes": ', '"bytes": 9999', 1),
    "dedup beyond its file": lambda text: text.replace('"dedup_bytes": ', '"dedup_bytes": 9999', 1),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_progress_record_is_detected_and_the_encoding_redone(tmp_path, monkeypatch, damage, capsys):
    import prepare
    from conftest import synthetic_corpus
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(synthetic_corpus(n_docs=3000, seed=2)) + "\n")
    for key, value in dict(dataset=str(corpus), vocab_size=300, seq_len=32, tokenizer_train_chars=50000,
                           progress_minutes=0, workers=1, out_dir=str(tmp_path / "whole")).items():
        monkeypatch.setattr(prepare, key, value)
    prepare.main()
    write_json, records = prepare.write_json, []

    def killed_at_the_third_record(path, obj):
        write_json(path, obj)
        if path.endswith(prepare.PROGRESS_FILE):
            records.append(obj)
            if len(records) == 3:
                raise KeyboardInterrupt
    monkeypatch.setattr(prepare, "write_json", killed_at_the_third_record)
    monkeypatch.setattr(prepare, "out_dir", str(tmp_path / "killed"))
    with pytest.raises(KeyboardInterrupt):
        prepare.main()
    monkeypatch.setattr(prepare, "write_json", write_json)
    record = tmp_path / "killed" / prepare.PROGRESS_FILE
    record.write_text(DAMAGES[damage](record.read_text()))
    capsys.readouterr()
    prepare.main()
    assert "is damaged" in capsys.readouterr().out
    for name in ("train.bin", "val.bin", "meta.json"):
        whole, killed = (tmp_path / "whole" / name).read_bytes(), (tmp_path / "killed" / name).read_bytes()
        assert killed == whole or name == "meta.json", name
    assert load_meta(tmp_path / "killed")["train_sequences"] == load_meta(tmp_path / "whole")["train_sequences"]


def test_a_prepared_folder_that_disagrees_with_its_meta_is_named_damaged(prepared, tmp_path, corpus_file):
    damaged = tmp_path / "damaged"
    shutil.copytree(prepared, damaged)
    with open(damaged / "train.bin", "r+b") as f:
        f.truncate(1000)
    args = [f"--dataset={corpus_file}", f"--out_dir={damaged}", "--vocab_size=384", "--seq_len=32",
            "--val_fraction=0.05"]
    assert "is damaged" in error_of("prepare.py", *args)  # not "already prepared"
    assert "delete it and run prepare.py again" in error_of("train.py", f"--data_dir={damaged}", *TINY_MODEL,
                                                             f"--out_dir={tmp_path / 'run'}")
    for meta in ('{"vocab_size": 384}', "[1]", '{"vocab_size": '):  # a meta.json cut short or of another shape
        (damaged / "meta.json").write_text(meta)
        assert "meta.json" in error_of("train.py", f"--data_dir={damaged}", *TINY_MODEL, f"--out_dir={tmp_path / 'run'}")


def test_export_never_overwrites_other_files(pretrained, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("my notes")
    assert "holds files this export did not write" in error_of("tools/export.py", f"--checkpoint={pretrained}",
                                                         f"--out_dir={folder}")
    assert (folder / "README.md").read_text() == "my notes"
    run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={tmp_path / 'hf'}")
    run_script("tools/export.py", f"--checkpoint={pretrained}", f"--out_dir={tmp_path / 'hf'}")  # an earlier export


# ------------------------------------------------------------------ 6. wrong results are not reported as success
def test_empty_or_degenerate_glue_data_is_an_error(pretrained, tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain\tx\t2012\t0\tnone\tnone\tA man plays.\tA man plays a guitar.\t{}\n"
    cases = {"no training rows": (header, header + row.format(3.0) + row.format(1.0), "no train examples"),
             "no dev rows": (header + row.format(3.0), header, "no stsb examples"),
             "constant dev scores": (header + row.format(3.0), header + row.format(2.0) * 3, "scores are all 2.0")}
    for case, (train, dev, fragment) in cases.items():
        glue_dir = tmp_path / case.replace(" ", "_")
        (glue_dir / "STS-B").mkdir(parents=True)
        (glue_dir / "STS-B" / "train.tsv").write_text(train)
        (glue_dir / "STS-B" / "dev.tsv").write_text(dev)
        assert fragment in error_of("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={glue_dir}",
                                    "--tasks=stsb", "--device=cpu", f"--out_json={tmp_path / 'glue.json'}"), case
    assert not (tmp_path / "glue.json").exists()


# ------------------------------------------------------------------ 7. the machine's own faults
def test_an_unwritable_result_path_fails_before_the_work(pretrained, tmp_path):
    (tmp_path / "a_folder").mkdir()
    for path, fragment in ((tmp_path / "a_folder", "is a folder"), ("/proc/glue.json", "cannot write")):
        assert fragment in error_of("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}",
                                    "--tasks=rte", f"--out_json={path}")  # before the (missing) data is read


def test_a_full_disk_keeps_the_last_good_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    write_atomically(path, lambda tmp: torch.save({"step": 1}, tmp))

    def full(obj, tmp):
        with open(tmp, "wb") as f:
            f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(SystemExit, match="the disk is full: free space") as stop:
        write_atomically(path, lambda tmp: full({"step": 2}, tmp))
    assert "\n" not in str(stop.value)
    assert torch.load(path)["step"] == 1 and os.listdir(tmp_path) == ["ckpt.pt"]


def test_claiming_a_folder_removes_a_killed_save_s_temporary_file_and_nothing_else(tmp_path):
    """A SIGKILL during a save leaves write_atomically's ckpt.pt.<pid>.tmp (a checkpoint's size, a new pid at each
    requeue); the next run that locks the folder removes it, and only the temporary copies of the files it owns."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("ckpt.pt.4242.tmp", "metrics.jsonl.77.tmp", "notes.txt.1.tmp", "ckpt.pt", "ckpt_00000010.pt"):
        (run / name).write_text("x")
    claim_folder(str(run), files=("ckpt.pt", "metrics.jsonl"))
    assert sorted(os.listdir(run)) == [".lock", "ckpt.pt", "ckpt_00000010.pt", "notes.txt.1.tmp"]


def test_a_folder_without_room_for_a_checkpoint_is_refused(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(SystemExit, match="GB free and this run needs about"):
        claim_folder(str(tmp_path / "run"), need_bytes=free * 2)
    from cram.files import size_text  # a small disk in its own unit, not "0.0 GB free"
    assert (size_text(1_048_576), size_text(2.5e12), size_text(999)) == ("1.0 MB", "2.5 TB", "999 bytes")
    claim_folder(str(tmp_path / "run"), need_bytes=1)  # and is this process's once claimed
    claim_folder(str(tmp_path / "run"))
    assert os.listdir(tmp_path / "run") == [".lock"]
