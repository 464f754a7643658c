"""The promise kept by class, not by case (issue 70): inputs drawn from each class of bad input meet
every entry point a user runs, and each ends with status 0 and its result, or with one last line
'error: ...' that names what to change: no traceback, and every file it reads byte for byte as it was.

The classes, each with its generator below: settings (every setting of every entry point, from the
command line and from a config file), checkpoints (each reader), paths and names (path settings and
the names in a folder a script lists), environments (torchrun's variables, OpenMP's, the locale, HOME).
The configurator is cheap, so every (script, setting, value) runs through it here; real runs are a
sample drawn with a fixed seed. CRAM_FUZZ=deep runs every drawn case (BENCHMARKS.md has its counts);
CRAM_FUZZ_SEED draws another sample."""
import csv
import itertools
import json
import math
import os
import random
import runpy
import shutil
import subprocess
import sys

import pytest
import torch

from configurator import config_keys, configure, declarations
from conftest import ROOT, TINY_MODEL, run_script
from test_promise import snapshot

DEEP = os.environ.get("CRAM_FUZZ") == "deep"
SEED = int(os.environ.get("CRAM_FUZZ_SEED", "70"))
SCALE = int(os.environ.get("CRAM_FUZZ_SCALE", "1"))  # CI's sample sizes times this
GLUE = os.path.join(ROOT, "tests", "fixtures", "glue")

# Every script the README or docs/ tell a user to run that takes settings (tools/emulate_bf16.py passes its
# arguments to the script it wraps; the .sh tools run these).
ENTRY_POINTS = ("train.py", "prepare.py", "finetune_glue.py", "bench.py", "tools/export.py", "tools/compare.py",
                "tools/glue_plot.py", "tools/curriculum.py", "tools/shape_plot.py", "tools/bench_offload.py",
                "tools/bench_prepare.py", "tools/bench_memory.py", "tools/bench_attention.py", "tools/gpu_report.py",
                "tools/gpu_call.py", "tools/bench_masking.py")

# A setting's value by class: as typed after --key= ...
COMMAND_LINE = {"empty": "", "whitespace": "   ", "a huge integer": "1" + "0" * 400, "negative": "-1", "zero": "0",
                "NaN": "nan", "inf": "inf", "a float": "2.5", "a word": "abc", "non-ASCII": "é€✓ ü",
                "very long": "x" * 5000, "a path": "/nowhere/at/all.pt", "a newline": "a\nb"}
# ... and as a config file assigns it (Python)
CONFIG_FILE = {"a huge integer": "10**400", "NaN": "float('nan')", "inf": "-float('inf')", "a huge float": "1e308 * 10",
               "NUL": "'a\\x00b'", "empty": "''", "a list": "[1, 2]", "None": "None", "negative": "-1",
               "a float": "2.5", "a word": "'abc'"}


def namespace(script):
    """A script's globals as its settings block leaves them, with how the script calls configure (cls, skip)."""
    ns = runpy.run_path(os.path.join(ROOT, script), run_name="fuzz")  # module level only: main() is not run
    cls = ns.get("ModelConfig") if script == "train.py" else None
    return ns, cls, tuple(ns.get("DATA_FIELDS", ())) + tuple(ns.get("SHAPE_FIELDS", ())) if cls else ()


def configured(ns, argv, cls, skip):
    """configure(), as the script calls it, on a copy of its globals: the settings, or None after its one line."""
    try:
        return configure(dict(ns), argv, cls, skip)
    except SystemExit as e:
        assert isinstance(e.code, str) and e.code.startswith("error: ") and "\n" not in e.code, (argv[-1:], e.code)
        return None


def usable(value, default):
    """What every script may take for granted of an accepted setting."""
    assert type(value) is type(default), (value, default)
    if type(value) is int:
        assert -2 ** 63 <= value < 2 ** 63
    if type(value) is float:
        assert math.isfinite(value)
    if type(value) is str:
        assert "\0" not in value


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_every_setting_takes_every_class_of_value_or_refuses_it_in_one_line(script, tmp_path):
    """Every setting of the script, every value class, from the command line and from a config file."""
    ns, cls, skip = namespace(script)
    keys = [d[1] for d in declarations(ns, cls, skip) if d[0] == "setting"]
    defaults = configure(dict(ns), [], cls, skip)
    assert set(keys) == set(defaults), "a setting with no line in the settings block"
    tried = 0
    for key in keys:
        for raw in COMMAND_LINE.values():
            settings = configured(ns, [f"--{key}={raw}"], cls, skip)
            tried += 1
            if settings:
                usable(settings[key], defaults[key])
        for i, source in enumerate(CONFIG_FILE.values()):
            path = tmp_path / f"c{i}.py"
            path.write_text(f"{key} = {source}\n", encoding="utf-8")
            settings = configured(ns, [str(path)], cls, skip)
            tried += 1
            if settings:
                usable(settings[key], defaults[key])
    assert tried == len(keys) * (len(COMMAND_LINE) + len(CONFIG_FILE))


# ------------------------------------------------------------------ real runs: each script on tiny inputs
def base_args(script, inputs, out):
    """The script's tiny run on the session's inputs, its outputs under `out`."""
    return {"train.py": [f"--data_dir={inputs['prepared']}", f"--out_dir={out / 'run'}", *TINY_MODEL, "--max_steps=3",
                         "--budget_hours=0.003", "--fill_in_examples=0"],
            "prepare.py": [f"--dataset={inputs['corpus']}", f"--out_dir={out / 'prep'}", "--vocab_size=300",
                           "--seq_len=32", "--val_fraction=0.05"],
            "finetune_glue.py": [f"--checkpoint={inputs['checkpoint']}", f"--glue_dir={GLUE}", "--tasks=rte",
                                 "--epochs=1", "--seeds=1", "--device=cpu", f"--out_json={out / 'glue.json'}"],
            "tools/export.py": [f"--checkpoint={inputs['checkpoint']}", f"--out_dir={out / 'hf'}"]}[script]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, corpus_file, prepared, pretrained):
    """The files the real runs read: copies, so that a run that changed one shows it."""
    root = tmp_path_factory.mktemp("fuzz_inputs")
    shutil.copytree(prepared, root / "prepared")
    shutil.copytree(pretrained.parent, root / "pretrained")
    shutil.copy(corpus_file, root / "corpus.txt")
    return dict(prepared=root / "prepared", checkpoint=root / "pretrained" / "ckpt.pt", corpus=root / "corpus.txt",
                root=root)


def assert_promise(proc, before, case):
    """Status 0, or one last line 'error: ...' (or a signal's 'stopped by ...'); no traceback; the inputs unchanged."""
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, (case, proc.stderr[-3000:])
    if proc.returncode:
        assert lines and lines[-1].startswith("error: "), (case, proc.returncode, proc.stderr[-3000:])
    after = snapshot(*before["folders"])  # new files are outputs (glue.json beside a checkpoint); none that was there changed
    assert {path: after.get(path) for path in before["files"]} == before["files"], f"{case}: an input changed"


def sample(cases, k):
    """The cases a run tries: all of them with CRAM_FUZZ=deep, else k drawn with the fixed seed."""
    cases = list(cases)
    return cases if DEEP else random.Random(SEED).sample(cases, min(k * SCALE, len(cases)))


REAL = ("train.py", "prepare.py", "finetune_glue.py", "tools/export.py")


def accepted_values():
    """(script, key, raw) for each command-line value the configurator accepts: those refused were shown one line."""
    for script in REAL:
        ns, cls, skip = namespace(script)
        for key in configure(dict(ns), [], cls, skip):
            for name, raw in COMMAND_LINE.items():
                if configured(ns, [f"--{key}={raw}"], cls, skip) is not None:
                    yield pytest.param(script, key, raw, id=f"{script}-{key}-{name}")


@pytest.mark.parametrize("script,key,raw", sample(accepted_values(), 8))
def test_an_accepted_value_runs_or_is_one_line(script, key, raw, inputs, tmp_path):
    before = dict(folders=[inputs["root"]], files=snapshot(inputs["root"]))
    args = [os.path.join(ROOT, script), *base_args(script, inputs, tmp_path), f"--{key}={raw}"]
    proc = run_script(*args, cwd=tmp_path, check=False, timeout=300)
    assert_promise(proc, before, f"{script} --{key}={raw[:40]!r}")


# ------------------------------------------------------------------ checkpoints: every reader
class Code:
    """A pickle that would run code on loading (print): the safe loader must refuse it without running it."""

    def __reduce__(self):
        return print, ("this ran",)


def damaged(checkpoint):
    """{name: what to save, or bytes to write} for each way a checkpoint comes: each top-level key removed in turn
    and each replaced by a value of another type, weights that are not finite or of another shape or dtype, an
    empty file, a file cut short, a pickle that is not a checkpoint."""
    ckpt = torch.load(checkpoint, weights_only=True)
    cases = {}
    for key in ckpt:
        cases[f"no {key}"] = {k: v for k, v in ckpt.items() if k != key}
        cases[f"{key} of another type"] = dict(ckpt, **{key: 7 if isinstance(ckpt[key], str) else "7"})
    name = next(k for k, v in ckpt["model"].items() if v.dim() == 2)
    weight = ckpt["model"][name]
    for case, value in (("a NaN weight", torch.full_like(weight, float("nan"))), ("an inf weight", weight / 0),
                        ("a weight of another shape", weight[:-1]), ("a weight in float16", weight.half()),
                        ("a weight of integers", weight.long())):
        cases[case] = dict(ckpt, model=dict(ckpt["model"], **{name: value}))
    watch = ckpt["spike_watch"]
    cases.update({"spike_watch with an unknown key": dict(ckpt, spike_watch=dict(watch, momentum=0.9)),
                  "spike_watch with a negative spread": dict(ckpt, spike_watch=dict(watch, var=-1.0))})
    cases["the four required keys alone"] = {k: ckpt[k] for k in ("model", "model_args", "meta", "tokenizer")}
    # values another version (or a fork) wrote that this one has no row for: a setting's name, a model's field
    cases["a setting's value this version lacks"] = dict(ckpt, config=dict(ckpt["config"], optim="no_such_optimizer"))
    cases["a model field this version lacks"] = dict(ckpt, model_args=dict(ckpt["model_args"], no_such_field=True))
    data = checkpoint.read_bytes()
    cases.update({"an empty file": b"", "a file cut short": data[:len(data) // 2], "a list": [1, 2],
                  "a pickle that runs code": Code()})
    return cases


def write_case(value, path):
    if isinstance(value, bytes):
        path.write_bytes(value)
    elif isinstance(value, Code):
        import pickle
        path.write_bytes(pickle.dumps(value))
    else:
        torch.save(value, path)


READERS = {"resume": "train.py", "fine-tuning": "finetune_glue.py", "export": "tools/export.py"}
CHECKPOINT_CASES = ["no model", "no optimizer", "no step", "no config", "no meta", "no tokenizer", "no budget",
                    "no final", "no scaler", "no elapsed", "no tokens", "no init_val_loss", "no model_args",
                    "no data_dir", "model of another type", "optimizer of another type", "step of another type",
                    "config of another type", "meta of another type", "tokenizer of another type",
                    "budget of another type", "final of another type", "scaler of another type",
                    "elapsed of another type", "tokens of another type", "init_val_loss of another type",
                    "model_args of another type", "data_dir of another type", "a NaN weight", "an inf weight",
                    "a weight of another shape", "a weight in float16", "a weight of integers", "an empty file",
                    "a file cut short", "a list", "a pickle that runs code", "the four required keys alone",
                    "no spike_watch", "spike_watch of another type", "spike_watch with an unknown key",
                    "spike_watch with a negative spread", "no run", "run of another type",
                    "a setting's value this version lacks", "a model field this version lacks"]


@pytest.mark.parametrize("reader,case", sample([(r, c) for r in READERS for c in CHECKPOINT_CASES], 6))
def test_every_reader_takes_a_checkpoint_or_refuses_it_in_one_line(reader, case, inputs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(inputs["checkpoint"].parent, run)
    cases = damaged(inputs["checkpoint"])
    assert set(cases) == set(CHECKPOINT_CASES), "a key train.py saves that the cases miss"
    write_case(cases[case], run / "ckpt.pt")
    saved = (run / "ckpt.pt").read_bytes()
    before = dict(folders=[inputs["root"]], files=snapshot(inputs["root"]))
    script = READERS[reader]
    args = (base_args(script, inputs, tmp_path) + [f"--checkpoint={run / 'ckpt.pt'}"] if reader != "resume" else
            base_args(script, inputs, tmp_path) + [f"--out_dir={run}", "--resume=True", "--max_steps=62"])
    proc = run_script(os.path.join(ROOT, script), *args, cwd=tmp_path, check=False, timeout=300)
    assert_promise(proc, before, f"{reader}: {case}")
    assert "this ran" not in proc.stdout + proc.stderr
    if proc.returncode:
        assert (run / "ckpt.pt").read_bytes() == saved, "a refused checkpoint changed"


# ------------------------------------------------------------------ paths and names
def odd_names(tmp_path):
    """{class: a path setting's value} for each way a path comes, made under tmp_path where it needs a file."""
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "a_folder").mkdir()
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    return {"empty": "", ".": ".", "-": "-", "a leading dash": "-x", "spaces": "a b", "a newline": "a\nb",
            "glob characters": "[x]*?", "latin-1 bytes": os.fsdecode(b"caf\xe9"), "a 255-byte component": "x" * 255,
            "a 256-byte component": "x" * 256, "a file for a folder": str(tmp_path / "a_file" / "sub"),
            "a folder for a file": str(tmp_path / "a_folder"), "a dangling link": str(tmp_path / "dangling")}


PATH_SETTINGS = {"train.py": ("data_dir", "out_dir"), "prepare.py": ("dataset", "out_dir"),
                 "finetune_glue.py": ("checkpoint", "glue_dir", "out_json"), "tools/export.py": ("checkpoint", "out_dir")}
NAME_CASES = ["empty", ".", "-", "a leading dash", "spaces", "a newline", "glob characters", "latin-1 bytes",
              "a 255-byte component", "a 256-byte component", "a file for a folder", "a folder for a file",
              "a dangling link"]


@pytest.mark.parametrize("script,key,case", sample([(s, k, c) for s, keys in PATH_SETTINGS.items() for k in keys
                                                    for c in NAME_CASES], 6))
def test_a_path_of_any_name_runs_or_is_one_line(script, key, case, inputs, tmp_path):
    before = dict(folders=[inputs["root"]], files=snapshot(inputs["root"]))
    value = odd_names(tmp_path)[case]
    proc = run_script(os.path.join(ROOT, script), *base_args(script, inputs, tmp_path), f"--{key}={value}",
                      cwd=tmp_path, check=False, timeout=300)
    assert_promise(proc, before, f"{script} --{key}: {case}")


def test_a_corpus_folder_of_odd_names_is_read_whole_or_named(inputs, tmp_path):
    """prepare.py lists a corpus folder: each odd name read (or said skipped), none a traceback."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    text = inputs["corpus"].read_text()
    names = ["-leading.txt", "a b.txt", "new\nline.txt", "[glob]*?.txt", os.fsdecode(b"caf\xe9.txt"),
             "x" * 251 + ".txt", "é€✓.txt"]
    for i, name in enumerate(names):
        (folder / name).write_text(text[i * len(text) // len(names):(i + 1) * len(text) // len(names)])
    os.symlink(tmp_path / "gone.txt", folder / "dangling.txt")
    (folder / "sub.txt").mkdir()
    proc = run_script(os.path.join(ROOT, "prepare.py"), f"--dataset={folder}", f"--out_dir={tmp_path / 'prep'}",
                      "--vocab_size=300", "--seq_len=32", "--val_fraction=0.05", cwd=tmp_path, check=False)
    assert_promise(proc, dict(folders=[inputs["root"]], files=snapshot(inputs["root"])), "a corpus of odd names")
    if proc.returncode == 0:
        import json
        meta = json.loads((tmp_path / "prep" / "meta.json").read_text())
        assert meta["train_tokens"] > 0


# ------------------------------------------------------------------ environments
ENVIRONMENTS = {"RANK alone": {"RANK": "0"}, "WORLD_SIZE alone": {"WORLD_SIZE": "1"},
                "LOCAL_RANK alone": {"LOCAL_RANK": "0"}, "MASTER_ADDR alone": {"MASTER_ADDR": "localhost"},
                "MASTER_PORT alone": {"MASTER_PORT": "29512"},
                "no MASTER_ADDR": {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "29512"},
                "no RANK": {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "29512"},
                "junk WORLD_SIZE": {"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"},
                "OMP_NUM_THREADS junk": {"OMP_NUM_THREADS": "abc"}, "OMP_NUM_THREADS 0": {"OMP_NUM_THREADS": "0"},
                "CUDA_VISIBLE_DEVICES junk": {"CUDA_VISIBLE_DEVICES": "junk"},
                "LANG=C, an ASCII stdout": {"LANG": "C", "LC_ALL": "C", "PYTHONIOENCODING": "ascii"},
                "a cp1252 stdout": {"PYTHONIOENCODING": "cp1252"}, "HOME unset": {"HOME": None}}


@pytest.mark.parametrize("script,case", sample([(s, c) for s in REAL for c in ENVIRONMENTS], 4))
def test_any_environment_runs_or_is_one_line(script, case, inputs, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **ENVIRONMENTS[case]}
    env = {k: v for k, v in env.items() if v is not None}  # None: unset
    before = dict(folders=[inputs["root"]], files=snapshot(inputs["root"]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, base_args(script, inputs, tmp_path))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, errors="replace", timeout=300)
    assert_promise(proc, before, f"{script} with {case}")


# ------------------------------------------------------------------ fine-tuning's result files, damaged in every way
def strict_json(text):
    """JSON as the standard has it: NaN and Infinity, which Python's parser takes, refused."""
    return json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"{name} in JSON")))


RESULT_FORMS = {"an empty file": lambda real: b"", "cut short": lambda real: real[:len(real) // 2],
                "not UTF-8": lambda real: b"\xff\xfe" + real, "a list": lambda real: b"[1, 2]",
                "nested past the parser's depth": lambda real: b"[" * 100_000 + b"]" * 100_000,
                "a NaN score": lambda real: real.replace(b'"accuracy": ', b'"accuracy": NaN, "was": ', 1),
                "an infinite score": lambda real: real.replace(b'"accuracy": ', b'"accuracy": -Infinity, "was": ', 1)}
RESULT_FILES = ("glue.json", "the run's file")


@pytest.fixture(scope="module")
def finetuned(inputs, tmp_path_factory):
    """One tiny fine-tuning's results (glue.json and glue_runs/), which each case damages a copy of."""
    out = tmp_path_factory.mktemp("finetuned")
    run_script("finetune_glue.py", *base_args("finetune_glue.py", inputs, out))
    return out


@pytest.mark.parametrize("file,form", sample([(f, c) for f in RESULT_FILES for c in RESULT_FORMS], 3))
def test_a_damaged_result_file_is_made_again_or_said_in_one_line(file, form, finetuned, inputs, tmp_path):
    """glue.json or a run's file in any damaged form: the rerun ends with status 0 and a glue.json of standard JSON
    scoring rte (the damaged file set aside, a non-finite score never a result), or with one line."""
    shutil.copytree(finetuned, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "glue.json" if file == "glue.json" else next((tmp_path / "glue_runs" / "tasks" / "rte").glob("seed0*.json"))
    path.write_bytes(RESULT_FORMS[form](path.read_bytes()))
    before = dict(folders=[inputs["root"]], files=snapshot(inputs["root"]))
    proc = run_script("finetune_glue.py", *base_args("finetune_glue.py", inputs, tmp_path), check=False, timeout=300)
    assert_promise(proc, before, f"{file}: {form}")
    if proc.returncode == 0:
        results = strict_json((tmp_path / "glue.json").read_text())
        assert "rte" in results["tasks"] and all(math.isfinite(v) for v in results["scores"].values()), results["scores"]


# ------------------------------------------------------------------ task files as other tools write them (issue 93)
TASK_TEXTS = ["A plain one.", "A\ttab.", 'He said " the witness " lied .', '" wonderful " is too small a word .', '"Stop."',
              'She said ""hi"".', "Two\nlines.", "Two\r\nlines.", "", "caf\u00e9 \u2713"]
TASK_WRITERS = {"csv's writer (pandas' to_csv)": csv.QUOTE_MINIMAL, "every field quoted": csv.QUOTE_ALL,
                "GLUE's layout (quotes are text)": None, "jsonl": "jsonl"}
ROW_FORMS = ["as written", "a column too many", "a column too few", "a null value", "a list for a value"]


def task_file(path, writer, rows):
    """rows (dicts of one header) written as `writer` writes them: a tsv by the csv module or joined at tabs, or jsonl."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        if writer == "jsonl":
            f.write("".join(json.dumps(row) + "\n" for row in rows))
        elif writer is None:
            f.write("".join("\t".join(map(str, line)) + "\n" for line in [[*rows[0]], *(r.values() for r in rows)]))
        else:
            csv.writer(f, delimiter="\t", quoting=writer, lineterminator="\n").writerows([[*rows[0]], *(r.values() for r in rows)])


@pytest.mark.parametrize("writer,form", [(w, f) for w in TASK_WRITERS for f in ROW_FORMS])
def test_a_task_file_in_any_form_is_read_as_written_or_said(writer, form, tmp_path, monkeypatch, capsys):
    """A train, dev or test file of an RTE-like task, written as a tool writes it, holding a row of every kind of text in
    `form`: every row kept reads exactly as written, in order; a row that does not (another width, a null or a list
    for a value, a line break GLUE's layout cannot hold) is left out and counted aloud (a train or dev file) or the
    file is one line (a test file; a piece of a row that reads as no label): never read amiss. In-process and cheap, so
    every text, writer and form runs."""
    import finetune_glue as glue
    mode = TASK_WRITERS[writer]
    row = glue.task("rte", folder="RTE", labels=("entailment", "not_entailment"), test_text=("sentence1", "sentence2"),
                    **(dict(reader="jsonl", train="train.jsonl", dev={"rte": ("dev.jsonl", "validation")},
                            tests={"RTE": ("test.jsonl", "rte", "test")}) if mode == "jsonl" else {}))
    monkeypatch.setitem(glue.TASKS, "rte", row)
    monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
    (tmp_path / "RTE").mkdir()
    files = {"train": row["train"], "rte": row["dev"]["rte"][0], "test:RTE": row["tests"]["RTE"][0]}
    good = {split: [dict(index=i, sentence1=f"Premise {i}.", sentence2="H.", **{} if split.startswith("test") else
                         dict(label="entailment")) for i in range(4)] for split in files}
    for (split, file), text in itertools.product(files.items(), TASK_TEXTS):
        if mode is None and form != "as written" and set(text) & set("\t\r\n"):
            continue  # GLUE's layout cannot hold these: such a row is of another width already, which a second fault may undo
        odd = dict(good[split][2], sentence1=text)
        if form == "a column too many" and mode != "jsonl":
            odd["extra"] = "x"
        if form == "a column too few" or form in ("a null value", "a list for a value") and mode != "jsonl":
            del odd["sentence2"]  # (tsv: nothing holds a null; a row short of its last column)
        if form in ("a null value", "a list for a value") and mode == "jsonl":
            odd["sentence1"] = None if form == "a null value" else [text]
        rows = [*good[split][:2], odd, good[split][3]]
        for other, name in files.items():  # the task's other files as they should be
            task_file(tmp_path / "RTE" / name, mode, rows if other == split else good[other])
        case = f"{writer}, {form}, {text!r} in {file}"
        try:
            texts = glue.load_task("rte", tests=True)[split][0]
        except SystemExit as e:
            assert e.code.startswith(f"error: {tmp_path / 'RTE' / file}") and "\n" not in e.code, (case, e.code)
            continue
        expected = [(r["sentence1"], r.get("sentence2")) for r in rows]
        assert texts in (expected, expected[:2] + expected[3:]), (case, texts)
        said = capsys.readouterr().out
        assert (texts == expected) != (f"{tmp_path / 'RTE' / file}: left out" in said), (case, said)
