"""What users bring besides bad settings, class by class: checkpoints of every shape, names and
encodings, containers, launchers' environments, process trees, inputs that change, time that stops.
Each class has one mechanism; each test here takes at least two cases of its class. Nothing that
existed before a refusal changes."""
import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from cram import process, runtime
from conftest import ROOT, TINY_MODEL, assert_one_line_error, run_script, spawn
from test_reliability import error_of

GLUE_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "glue")


# ------------------------------------------------------------------ checkpoints of every shape
def test_a_checkpoint_without_what_its_reader_needs_is_one_line_and_left_as_it_was(pretrained, prepared, tmp_path):
    """Resume needs the optimizer state that fits the model and the run's counters; fine-tuning and
    the export need finite weights. Each reader says what is missing and how to go on."""
    good = torch.load(pretrained, weights_only=True)

    def variant(name, change):
        ckpt = torch.load(pretrained, weights_only=True)
        change(ckpt)
        folder = tmp_path / name
        folder.mkdir()
        torch.save(ckpt, folder / "ckpt.pt")
        return folder
    stripped = variant("stripped", lambda c: c.pop("optimizer"))  # shared without its optimizer state
    groups = variant("groups", lambda c: c["optimizer"]["param_groups"].pop())  # another number of groups
    counters = variant("counters", lambda c: c.pop("elapsed"))  # an older or hand-made file
    shapes = variant("shapes", lambda c: c["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)))
    nan = variant("nan", lambda c: c["model"]["blocks.0.ffn.up.weight"].view(-1)[0].fill_(float("nan")))
    resume = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--resume=True"]
    for folder, fragment in ((stripped, "has no optimizer (weights shared without the training state?)"),
                             (groups, "parameter groups of [" + str(len(good["optimizer"]["param_groups"][0]["params"]))),
                             (counters, "has no elapsed"), (shapes, "does not fit the model's parameters (entry 0)"),
                             (nan, "holds non-finite weights")):
        before = (folder / "ckpt.pt").read_bytes()
        message = error_of(*resume, f"--out_dir={folder}")
        assert fragment in message and "cannot be resumed" in message, message
        assert (folder / "ckpt.pt").read_bytes() == before  # and nothing else written there but the lock
        assert sorted(p.name for p in folder.iterdir()) in (["ckpt.pt"], [".lock", "ckpt.pt"])
    assert "fine-tune it (finetune_glue.py) or export it" in error_of(*resume, f"--out_dir={stripped}")
    # the readers of weights refuse non-finite ones; a stripped checkpoint is theirs to use
    export = tmp_path / "export"
    for script, args in (("finetune_glue.py", [f"--out_json={tmp_path / 'glue.json'}"]),
                         ("tools/export.py", [f"--out_dir={export}"])):
        assert "cannot be fine-tuned or exported" in error_of(script, f"--checkpoint={nan / 'ckpt.pt'}", *args)
    assert not export.exists() and not (tmp_path / "glue.json").exists()
    run_script("tools/export.py", f"--checkpoint={stripped / 'ckpt.pt'}", f"--out_dir={export}")
    assert (export / "config.json").exists()


def test_a_resume_takes_its_settings_from_its_checkpoint_or_refuses(pretrained, prepared, tmp_path):
    """Issue 100, class 3. Named: a checkpoint that keeps its settings under another key (`settings`, not `config`)
    resumed silently with the command's defaults (a 24-hour budget, a batch of 8192 where the run had 32) and wrote them
    into the checkpoint as the run's own; the export's card said "nan% of the tokens masked". Now the resume is one
    line, the file as it was, and the card says the share is not recorded. Unnamed: a config that lacks a setting the
    resume reads (batch_size, which the resume took as 8192), and the export of that checkpoint, which knows its share."""
    import export
    from cram.files import load_checkpoint
    ckpt = torch.load(pretrained, weights_only=True)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    torch.save(dict({k: v for k, v in ckpt.items() if k != "config"}, settings=ckpt["config"]), renamed / "ckpt.pt")
    before = (renamed / "ckpt.pt").read_bytes()
    message = error_of("train.py", f"--data_dir={prepared}", f"--out_dir={renamed}", "--resume=True", "--device=cpu")
    assert "has no config" in message and "cannot be resumed" in message, message
    assert (renamed / "ckpt.pt").read_bytes() == before
    lines = export.training_facts(load_checkpoint(str(renamed / "ckpt.pt")), str(tmp_path))
    assert "the share masked not recorded" in "\n".join(lines) and "nan" not in "\n".join(lines)
    lacking = tmp_path / "lacking.pt"
    torch.save(dict(ckpt, config={k: v for k, v in ckpt["config"].items() if k != "batch_size"}), lacking)
    with pytest.raises(SystemExit, match=r"has no config\['batch_size'\] .*: it cannot be resumed"):
        load_checkpoint(str(lacking), "resume")
    assert "25% of the tokens masked" in "\n".join(export.training_facts(load_checkpoint(str(lacking)), str(tmp_path)))


# ------------------------------------------------------------------ names and encodings
def test_what_a_checkpoint_carries_that_this_version_lacks_is_one_line(pretrained, prepared, tmp_path):
    """Every value a checkpoint carries is checked against this version's tables before use, as a command line's is:
    a fork's optimizer (issue 93: `lion`, which ended in KeyError: 'lion'), a newer cram's schedule, data order or a
    value of another type, and a model field this version lacks (the loader's line, kept): one line each, nothing
    written."""
    cases = {"optim": ("no_such_optimizer", "optim=no_such_optimizer is not allowed: optim must be one of adamw"),
             "lr_schedule": ("no_such_schedule", "lr_schedule=no_such_schedule is not allowed: lr_schedule must be one of"),
             "data_order": ("no_such_order", "data_order=no_such_order is not allowed"),
             "grad_clip": ("0.5", "grad_clip=0.5 is not allowed: not float")}
    for key, (value, fragment) in [*cases.items(), ("no_such_field", (2, "unknown model_args field(s) no_such_field"))]:
        ckpt = torch.load(pretrained, weights_only=True)
        (ckpt["model_args"] if key == "no_such_field" else ckpt["config"])[key] = value
        folder = tmp_path / key
        folder.mkdir()
        torch.save(ckpt, folder / "ckpt.pt")
        message = error_of("train.py", f"--data_dir={prepared}", f"--out_dir={folder}", *TINY_MODEL, "--resume=True")
        assert fragment in message and ("resume it with the cram that wrote it" in message or key == "no_such_field"), message
        assert sorted(p.name for p in folder.iterdir()) == ["ckpt.pt"]


def test_output_survives_any_stdout_encoding(tmp_path, prepared):
    """A character stdout cannot encode is replaced, never a traceback: in this process under cp1252
    (Windows' `> log.txt`), and a whole run under ASCII into a folder whose name it cannot write."""
    raw = io.BytesIO()
    stdout, sys.stdout = sys.stdout, io.TextIOWrapper(raw, encoding="cp1252")
    wrapper = sys.stdout  # kept: a dropped wrapper closes `raw`
    try:
        process.guarded(print, "nothing to keep", "fill in: -> ' x' \u2192 \u2713 \u4e2d")
        sys.stdout.flush()
    finally:
        sys.stdout = stdout
    assert raw.getvalue().decode("cp1252") == "fill in: -> ' x' ? ? ?\n" and not wrapper.closed
    out = tmp_path / "r\u00e9sum\u00e9 \u2713"
    proc = subprocess.run([sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL,
                           "--max_steps=5", "--fill_in_examples=1"], cwd=ROOT, capture_output=True, timeout=300,
                          env=dict(os.environ, PYTHONIOENCODING="ascii", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"saved " in proc.stdout and b"r?sum? ?" in proc.stdout and (out / "ckpt.pt").exists()


@pytest.mark.parametrize("closed", [(1,), (1, 2)])
def test_a_script_runs_with_its_standard_streams_closed(prepared, corpus_file, tmp_path, closed):
    """`>&-`, `2>&-` and daemon wrappers start a script with stdout (or both) closed: it does its work, its lines
    dropped, and exits 0 (train.py ended in AttributeError: 'NoneType' object has no attribute 'write')."""
    from cram.files import load_meta

    def close():
        for fd in closed:
            os.close(fd)

    env = dict(os.environ, OMP_NUM_THREADS="1")
    for args in (["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL, "--max_steps=3",
                  "--fill_in_examples=1"],
                 ["prepare.py", f"--dataset={corpus_file}", f"--out_dir={tmp_path / 'data'}", "--vocab_size=300"]):
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, preexec_fn=close, timeout=300,
                              stdout=None if 1 in closed else subprocess.DEVNULL,
                              stderr=None if 2 in closed else subprocess.PIPE)
        assert proc.returncode == 0, proc.stderr
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 3
    assert load_meta(tmp_path / "data")["vocab_size"] == 300


def test_output_into_a_pipe_whose_reader_has_gone_ends_quietly(prepared, corpus_file):
    """Issue 93. Named: `python train.py --help | head -1` (and prepare.py, finetune_glue.py, bench.py, tools/export.py)
    ended in a BrokenPipeError traceback once head had gone; unnamed: tools/style.py's figures and prepare.py's
    "already prepared" line, which are not --help. Each now ends quietly, as Unix tools do, with its own status: one
    handler where every script starts (configurator.configure), `true` standing for a head that has exited."""
    commands = [[script, "--help"] for script in ("train.py", "prepare.py", "finetune_glue.py", "bench.py", "tools/export.py")]
    commands += [["tools/style.py"], ["prepare.py", f"--dataset={corpus_file}", f"--out_dir={prepared}", "--vocab_size=384",
                                      "--seq_len=32", "--val_fraction=0.05"]]
    for args in commands:
        proc = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | true', "-", sys.executable, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.stderr == "" and proc.returncode in ((0, 1) if args == ["tools/style.py"] else (0,)), (args, proc.stderr)


def test_a_locale_s_encoding_reads_cram_s_own_text_as_utf8(tmp_path, prepared):
    """Under a locale whose encoding is not UTF-8 (Windows' cp1252; here ASCII, with Python's UTF-8 mode off),
    cram still reads its text as UTF-8: a tool whose source holds a non-ASCII character (its settings are
    read from it), a config file a user wrote with one, the files a run writes and reads back."""
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", OMP_NUM_THREADS="1")
    probe = [sys.executable, "-c", "import locale; print(locale.getpreferredencoding(False))"]
    assert "utf" not in subprocess.run(probe, env=env, capture_output=True, text=True).stdout.lower()
    config = tmp_path / "r\u00e9glages.py"
    config.write_text("# r\u00e9glages de Zo\u00e9 \u2713\nmax_steps = 3\n", encoding="utf-8")
    for args in (["tools/curriculum.py", "--help"],
                 ["train.py", str(config), f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL,
                  "--fill_in_examples=0"]):
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 3


def test_a_text_file_is_read_as_its_writer_saved_it(tmp_path):
    """Issue 100, class 1: a file is read by its byte-order mark, never with the mark as a character. Named: a folder of
    .txt files saved by Notepad (a UTF-8 mark each, CRLF) reads as the same files without. Unnamed: Excel's UTF-16 (LE)
    and UTF-16 BE, a gzipped Notepad file, a config file saved by Notepad; a .jsonl file in UTF-16, which the JSON
    reader cannot take, is one line whose command, followed as written (gzipped too), converts it."""
    import codecs
    import gzip
    import prepare
    from configurator import configure
    from conftest import synthetic_corpus
    docs = synthetic_corpus(30)
    text = "\n\n".join(docs) + "\n"
    saved = {"plain.txt": text.encode(), "notepad.txt": codecs.BOM_UTF8 + text.replace("\n", "\r\n").encode(),
             "excel.txt": text.encode("utf-16"), "big_endian.txt": codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
             "notepad.txt.gz": gzip.compress(codecs.BOM_UTF8 + text.encode())}
    for name, data in saved.items():
        (tmp_path / name).write_bytes(data)
        assert list(prepare.text_file_documents(str(tmp_path / name))) == docs, name
    for folder, mark in (("plain", b""), ("notepad", codecs.BOM_UTF8)):  # the named case, as prepare.py reads a folder
        (tmp_path / folder).mkdir()
        for i in range(3):
            (tmp_path / folder / f"{i}.txt").write_bytes(mark + "\r\n\r\n".join(docs[i::3]).encode())
    assert [list(prepare.document_source(str(tmp_path / f))[1]()) for f in ("plain", "notepad")] == [
        [d for i in range(3) for d in docs[i::3]]] * 2
    config = tmp_path / "notepad_config.py"
    config.write_bytes(codecs.BOM_UTF8 + b"steps = 3\r\n")
    assert configure({"steps": 1}, [str(config)])["steps"] == 3
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    for name, data in (("excel.jsonl", lines.encode("utf-16")), ("excel.jsonl.gz", gzip.compress(lines.encode("utf-16")))):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(SystemExit, match="is UTF-16 text") as refusal:
            prepare.document_source(str(path))
        command = str(refusal.value).split("convert it in place with ", 1)[1]
        subprocess.run(command, shell=True, check=True)
        assert list(prepare.document_source(str(path))[1]()) == docs
    (tmp_path / "notepad.jsonl").write_bytes(codecs.BOM_UTF8 + lines.encode())
    assert list(prepare.document_source(str(tmp_path / "notepad.jsonl"))[1]()) == docs


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_that_cannot_lock_is_said_as_such(tmp_path, monkeypatch, code):
    """flock answers ENOSYS on Lustre mounted without -o flock, ENOLCK on NFS without its lock daemon: no
    process holds the folder, and the line says what is true; a tool finds nothing held there either."""
    import fcntl

    from cram import files
    from measure import held_below

    def refuse(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(SystemExit, match=r"^error: .*'s file system cannot lock a file \(") as refused:
        files.claim_folder(str(tmp_path / "run"))
    assert "in use" not in str(refused.value)
    (tmp_path / "run" / files.LOCK_FILE).write_text("123\n")
    assert held_below(str(tmp_path)) is None


def test_a_folder_name_is_a_path_not_a_pattern(tmp_path):
    """Fine-tuning finds its run files in folders named as sweeps name them (brackets, an asterisk)."""
    import finetune_glue
    for name in ("sweep[lr=2e-3]", "best*run"):
        runs = tmp_path / name / "glue_runs" / "tasks" / "rte"
        runs.mkdir(parents=True)
        (runs / "seed0.json").write_text("{}")
        found = finetune_glue.run_files(str(tmp_path / name / "glue.json"))
        assert [path for path, _ in found] == [str(runs / "seed0.json")]


# ------------------------------------------------------------------ the machine a process is really given
def test_threads_and_workers_follow_the_cpus_the_process_may_use(tmp_path, monkeypatch):
    """A container's CPU quota (cgroup v2 or v1) caps what the affinity allows; threads that cannot
    start (a process limit) leave fewer workers, or the calling thread, and the same results."""
    mine = runtime.usable_cpus(str(tmp_path / "none"))
    assert mine == len(os.sched_getaffinity(0))
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cpu.max").write_text("150000 100000\n")  # docker --cpus=1.5
    assert runtime.usable_cpus(str(tmp_path / "v2")) == 1
    (tmp_path / "v2" / "cpu.max").write_text("max 100000\n")  # no quota
    assert runtime.usable_cpus(str(tmp_path / "v2")) == mine
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "v1" / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "v1" / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert runtime.usable_cpus(str(tmp_path / "v1")) == 1
    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)
    torch.set_num_threads(2)
    try:
        runtime.fit_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)

    import prepare
    start, started = threading.Thread.start, []

    def limited(thread):  # a process limit: only `room` more live threads
        if sum(t.is_alive() for t in started) >= room:
            raise RuntimeError("can't start new thread")
        started.append(thread)
        start(thread)
    monkeypatch.setattr(threading.Thread, "start", limited)
    for room, expected in ((2, 2), (0, None)):
        started.clear()
        pool = prepare.start_pool(4)
        assert (pool._max_workers if expected else None) == expected
        assert list(pool.map(str.upper, ["a", "b", "c"])) == ["A", "B", "C"]
        pool.shutdown()


# ------------------------------------------------------------------ the environment a launcher leaves
def test_a_partial_distributed_environment_is_one_line_naming_what_is_missing(prepared, tmp_path, monkeypatch):
    full = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    assert runtime.launcher({}) == (False, 1) and runtime.launcher(full) == (True, 2)
    for env, fragment in ((dict(RANK="0"), "RANK set but not WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"),
                          (dict(LOCAL_RANK="0"), "unset LOCAL_RANK for one"),
                          (dict(full, RANK="2"), "RANK=2, LOCAL_RANK=1 do not fit WORLD_SIZE=2"),
                          (dict(full, WORLD_SIZE="two"), "must be whole numbers")):
        with pytest.raises(SystemExit, match=fragment.replace("(", r"\(").replace("[", r"\[")):
            runtime.launcher(env)
    monkeypatch.setenv("RANK", "0")  # a job wrapper's, without torchrun: refused before any work
    assert "not torchrun's environment" in error_of("train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}",
                                                    *TINY_MODEL)
    assert not tmp_path.joinpath("ckpt.pt").exists()


# ------------------------------------------------------------------ process trees
PARENT = """import subprocess, sys, time
sys.path.insert(0, {root!r})
from cram.process import child_env
child = subprocess.Popen([sys.executable, "-c", {child!r}], env=child_env(), stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "up\\n"  # past process.follow_parent
print(child.pid, flush=True)
time.sleep(120)
"""
CHILD = "import sys, time; sys.path.insert(0, {root!r}); from cram import process; " \
        "process.guarded(lambda: (print('up', flush=True), time.sleep(120)), 'nothing')"
HOLD = "import sys, time; sys.path.insert(0, {root!r}); from cram.files import claim_folder; claim_folder({out!r}); " \
       "print('held', flush=True); time.sleep(120)"


def test_a_limit_on_any_of_the_process_s_own_cgroups_holds(tmp_path):
    """SLURM's --mem and systemd-run -p MemoryMax= limit a child cgroup below the root: memory and CPUs follow the
    process's own cgroups (/proc/self/cgroup) up to the root, cgroup v2 and v1 (controllers mounted together too)."""
    from cram import memory
    host = memory.memory_capacity(torch.device("cpu"), str(tmp_path / "none"), str(tmp_path / "none"))
    v2 = tmp_path / "v2" / "user.slice" / "job.scope"
    v2.mkdir(parents=True)
    (v2.parent / "memory.max").write_text(f"{700 << 20}\n")  # on the way up, not at the root
    (v2 / "memory.max").write_text("max\n")
    (v2 / "cpu.max").write_text("100000 100000\n")
    (tmp_path / "own2").write_text("0::/user.slice/job.scope\n")
    assert memory.memory_capacity(torch.device("cpu"), str(tmp_path / "v2"), str(tmp_path / "own2")) == 700 << 20
    assert runtime.usable_cpus(str(tmp_path / "v2"), str(tmp_path / "own2")) == 1
    v1 = tmp_path / "v1" / "memory" / "slurm" / "uid_0" / "job_7"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{300 << 20}\n")
    (tmp_path / "v1" / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "own1").write_text("9:cpu,cpuacct:/slurm/uid_0/job_7\n4:memory:/slurm/uid_0/job_7\n0::/\n")
    assert memory.memory_capacity(torch.device("cpu"), str(tmp_path / "v1"), str(tmp_path / "own1")) == 300 << 20
    assert memory.memory_capacity(torch.device("cpu"), str(tmp_path / "v1"), str(tmp_path / "none")) == host
    assert runtime.usable_cpus(str(tmp_path / "v1"), str(tmp_path / "own1")) == len(os.sched_getaffinity(0))


def test_a_read_only_container_runs_with_its_outputs_on_a_volume(prepared, tmp_path):
    """docker --read-only: /tmp, /var/tmp, HOME and the code read-only, the outputs and TMPDIR on a volume: train.py
    trains and fine-tuning scores, writing to the volume alone (cram's runtime asked for a temporary folder at import).
    Without TMPDIR there is none, and torch's own import asks for one where dill is installed (datasets installs it):
    every script ended in `FileNotFoundError: No usable temporary directory found`; now one line says what to mount."""
    import shlex
    import shutil
    import tempfile
    if os.geteuid() != 0 or not shutil.which("unshare") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("a read-only bind mount needs root, unshare and /dev/shm for the volume")
    volume = tempfile.mkdtemp(dir="/dev/shm")
    places = [d for d in ("/tmp", "/var/tmp", "/usr/tmp", ROOT, os.path.expanduser("~")) if os.path.isdir(d)]
    mounts = " && ".join(f"mount --bind {shlex.quote(d)} {shlex.quote(d)} && mount -o remount,ro,bind {shlex.quote(d)}"
                         for d in places)

    def run(*args, tmp=os.path.join(volume, "tmp")):  # in a mount namespace of its own: the read-only places end with it
        command = f"{mounts} && cd {shlex.quote(ROOT)} && exec {' '.join(map(shlex.quote, [sys.executable, *args]))}"
        return subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=300,
                              env=dict(clean, OMP_NUM_THREADS="1", **({"TMPDIR": tmp} if tmp else {})))
    clean = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # this process's, on /tmp
    os.mkdir(os.path.join(volume, "tmp"))
    try:
        trained = run("train.py", f"--data_dir={prepared}", f"--out_dir={volume}/run", *TINY_MODEL, "--max_steps=2")
        assert trained.returncode == 0 and "Traceback" not in trained.stderr, trained.stderr[-2000:]
        bare = subprocess.run([sys.executable, "-c", "import tempfile, torch; tempfile.gettempdir = "
                               "lambda: open('/nowhere/x'); import cram.runtime, os; "
                               "print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"], cwd=ROOT, capture_output=True,
                              text=True, env=clean)
        assert bare.returncode == 0 and bare.stdout.strip() == "None", bare.stderr[-2000:]
        scored = run("finetune_glue.py", f"--checkpoint={volume}/run/ckpt.pt", f"--glue_dir={GLUE_FIXTURES}",
                     "--tasks=rte", "--epochs=1", "--seeds=1", "--device=cpu")
        assert scored.returncode == 0 and os.path.isfile(f"{volume}/run/glue.json"), scored.stderr[-2000:]
        for script in ("train.py", "prepare.py", "finetune_glue.py", "tools/export.py"):  # no TMPDIR: nowhere to write
            assert_one_line_error(run(script, "--help", tmp=None), "no writable temporary folder", "TMPDIR")
    finally:
        shutil.rmtree(volume)


def as_another_user(*args, cwd=ROOT):
    """A script run by a user who does not own the files it reads: root without the capabilities that pass over file
    permissions (setpriv), so files owned by another uid answer EACCES as they would on a shared cluster."""
    drop = "-dac_override,-dac_read_search"
    return subprocess.run(["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", sys.executable, *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_another_user_s_files_are_permission_denied_not_missing_or_damaged(prepared, pretrained, tmp_path):
    """A shared cluster folder written under umask 077 (another uid): the lines said "not prepared", "damaged ... run
    prepare.py again" and "checkpoint not found", advice that would delete someone's data. Each reader now says
    permission denied, for a folder it may not search and for a file it may not read, and changes nothing."""
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("another user's files need root (to chown) and setpriv (to drop the capabilities)")
    from test_promise import snapshot
    shutil.copytree(prepared, tmp_path / "data")
    shutil.copytree(pretrained.parent, tmp_path / "run")
    shutil.copy(os.path.join(ROOT, "config", "train_quickstart.py"), tmp_path / "config.py")
    for d, folders, names in os.walk(tmp_path):
        for name in folders + names:
            os.chown(os.path.join(d, name), 65534, 65534)
            os.chmod(os.path.join(d, name), 0o700 if name in folders else 0o600)
    before = snapshot(tmp_path)
    train = ["train.py", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'mine'}", *TINY_MODEL]
    tune = ["finetune_glue.py", f"--checkpoint={tmp_path / 'run' / 'ckpt.pt'}", f"--glue_dir={GLUE_FIXTURES}",
            "--tasks=rte", f"--out_json={tmp_path / 'glue.json'}"]
    export = ["tools/export.py", f"--checkpoint={tmp_path / 'run' / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf'}"]
    os.chmod(tmp_path, 0o755)
    for searchable, readers in ((False, (train, tune, ["train.py", tmp_path / "config.py"])), (True, (train, export))):
        for folder in (tmp_path / "data", tmp_path / "run"):  # closed (700), then open (755) with the files still 600
            os.chmod(folder, 0o755 if searchable else 0o700)
        for args in readers:
            assert_one_line_error(as_another_user(*args), "permission denied")
    assert snapshot(tmp_path) == before


def child_memory_cgroup(limit):
    """A memory cgroup below this process's own with `limit` bytes (v2's memory.max or v1's limit_in_bytes), made the
    way a batch system makes one; None where this process may not (not root, no writable hierarchy)."""
    for folder in runtime.cgroup_folders("memory"):
        child = os.path.join(folder, f"cram_test_{os.getpid()}")
        try:
            os.mkdir(child)
        except OSError:
            continue
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                with open(os.path.join(child, name), "w") as f:
                    f.write(str(limit))
                return child
            except OSError:
                pass
        os.rmdir(child)
    return None


def test_train_py_sees_the_memory_limit_of_a_job_s_cgroup(prepared, tmp_path):
    """train.py in a 600 MiB child cgroup, with a model and micro-batch needing more: one line before any work (it was
    killed by the kernel's OOM killer after its first evaluation), and a run that fits trains there."""
    child = child_memory_cgroup(600 << 20)
    if child is None:
        pytest.skip("cannot make a child memory cgroup here (needs root and a writable cgroup hierarchy)")
    enter = lambda: open(os.path.join(child, "cgroup.procs"), "w").write(str(os.getpid()))  # noqa: E731
    args = [sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL,
            "--max_steps=2"]
    try:
        big = subprocess.run([*args, "--d_model=1024", "--n_heads=8", "--d_ffn=4096", "--micro_batch=256",
                              "--batch_size=256"], cwd=ROOT, preexec_fn=enter, capture_output=True, text=True,
                             timeout=300)
        assert_one_line_error(big, "more than this machine's 629.1 MB")
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
        fits = subprocess.run(args, cwd=ROOT, preexec_fn=enter, capture_output=True, text=True, timeout=300)
        assert fits.returncode == 0, fits.stderr[-2000:]
    finally:
        os.rmdir(child)

def test_a_tool_s_child_ends_with_it_and_a_rerun_never_removes_a_live_run(tmp_path):
    """A cram script a tool started (process.child_env) gets SIGTERM when the tool is killed with
    SIGKILL (the OOM killer); compare.py and the GPU report refuse to restart a run whose folder a live process
    still holds."""
    parent = spawn([sys.executable, "-c", PARENT.format(root=ROOT, child=CHILD.format(root=ROOT))], stdout=subprocess.PIPE,
                   text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(f"/proc/{child}") and \
            open(f"/proc/{child}/stat").read().split()[2] != "Z":
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"
    out = tmp_path / "compare"
    run = out / "crammed" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')  # an unfinished run's, still training
    holder = spawn([sys.executable, "-c", HOLD.format(root=ROOT, out=str(run))], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"}
    proc = run_script("tools/compare.py", "--variants=crammed", "--budget_minutes=0.05", f"--out_dir={out}",
                      check=False)
    assert_one_line_error(proc, f"{run} is in use by another process (pid {holder.pid})")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == before
    from measure import held_below  # what a fresh GPU report phase asks of its whole folder before removing it
    assert held_below(str(out)) == (str(run), str(holder.pid)) and held_below(str(tmp_path / "none")) is None


# ------------------------------------------------------------------ inputs that change under the reader
def test_a_corpus_that_changed_since_or_while_it_was_read_is_said(tmp_path, corpus_file, monkeypatch):
    text = corpus_file.read_text()
    args = ["--vocab_size=300", "--seq_len=32", "--tokenizer_train_chars=20000"]
    single = tmp_path / "books.txt"
    single.write_text(text[: len(text) // 2])
    folder = tmp_path / "shelf"
    folder.mkdir()
    (folder / "a.txt").write_text(text[: len(text) // 2])
    for source, grow in ((single, lambda: single.write_text(text)),  # a download that went on
                         (folder, lambda: (folder / "b.txt").write_text(text[len(text) // 2:]))):  # a book added
        out = tmp_path / f"out_{source.name}"
        run_script("prepare.py", f"--dataset={source}", f"--out_dir={out}", *args)
        grow()
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}
        assert "prepared from another version of this corpus" in error_of("prepare.py", f"--dataset={source}",
                                                                          f"--out_dir={out}", *args)
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before
    # one still being written while it is read: refused, nothing finished, and the next run starts over
    import prepare
    versions = iter(["before", "after"])
    monkeypatch.setattr(prepare, "fingerprint", lambda dataset: next(versions, "after"))
    out = tmp_path / "growing"
    settings = dict(dataset=str(single), out_dir=str(out), vocab_size=300, seq_len=32, tokenizer_train_chars=20000)
    for name, value in settings.items():
        monkeypatch.setattr(prepare, name, value)
    with pytest.raises(SystemExit, match="changed while it was read"):
        prepare.main()
    assert not (out / "meta.json").exists()


# ------------------------------------------------------------------ time that stops
def test_stopped_time_is_not_training_time(prepared, tmp_path):
    """Ctrl-Z (SIGTSTP) or a batch system's SIGSTOP, then SIGCONT: the steps the stops fell in are
    charged as the step before, so the clock, the schedules and the budget see no jump."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = spawn([sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL,
                  "--budget_hours=0.002", "--log_interval=1", "--fill_in_examples=0", "--eval_interval_minutes=10"],
                 cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("step 20 "):
            break
    for stop in (signal.SIGSTOP, signal.SIGTSTP):
        proc.send_signal(stop)
        time.sleep(2.0)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
    proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    seconds = [r["elapsed"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
               if r.get("kind") == "train"]
    jumps = [b - a for a, b in zip(seconds, seconds[1:])]
    assert len(seconds) > 30 and max(jumps) < 1.0, jumps


@pytest.mark.skipif(not hasattr(signal, "SIGCONT"), reason="POSIX's SIGCONT")
def test_a_continue_is_noted_on_the_step_s_clock():
    """The loop leaves a pause off the clock when the process continued after the step began: TrainingClock notes a
    SIGCONT as a perf_counter reading, comparable with the step's start, and nothing else moves it. A step in which the
    process continued counts as no longer than the step before; one without a continue counts in full."""
    from cram import process
    from train import TrainingClock
    handlers = {signum: signal.getsignal(signum) for signum in (*process.STOP_SIGNALS, signal.SIGCONT)}
    try:
        clock = TrainingClock(10.0)  # a resume's seconds
        assert clock.start_step() == (10.0, False) and clock.continued_at < clock.started  # never continued
        time.sleep(0.05)
        first = clock.end_step() - 10.0
        assert first >= 0.05
        clock.start_step()
        os.kill(os.getpid(), signal.SIGCONT)  # continued during the step, after a pause of 0.3 s, say
        time.sleep(0.3)
        assert clock.started <= clock.continued_at <= time.perf_counter()
        assert clock.end_step() == pytest.approx(10.0 + 2 * first)  # the paused step counts as the one before
        clock.start_step()
        time.sleep(0.2)
        assert clock.end_step() >= 10.0 + 2 * first + 0.2  # no continue since it began: counted in full
        assert clock.signum is None  # a continue is not a stop
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("limit", ["RLIMIT_AS", "RLIMIT_DATA"])
def test_train_py_sees_the_process_s_own_memory_limit(limit, prepared, tmp_path):
    """ulimit -v (RLIMIT_AS, as SGE's h_vmem sets) or -d (RLIMIT_DATA) of 2.5 GiB, with a model needing more (8 x 1536,
    3 GB of weights, gradients and AdamW state): one line before any work, not the allocator's traceback; a run that
    fits trains under the same limit."""
    import resource

    def limited():
        resource.setrlimit(getattr(resource, limit), (5 << 29, 5 << 29))
    args = [sys.executable, "train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path / 'run'}", *TINY_MODEL,
            "--max_steps=2", "--fill_in_examples=0"]
    big = subprocess.run([*args, "--n_layers=8", "--d_model=1536", "--n_heads=12", "--d_ffn=6144"], cwd=ROOT,
                         preexec_fn=limited, capture_output=True, text=True, timeout=300)
    assert_one_line_error(big, "needs at least 3.", "more than this machine's 2.7 GB")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    fits = subprocess.run(args, cwd=ROOT, preexec_fn=limited, capture_output=True, text=True, timeout=300)
    assert fits.returncode == 0, fits.stderr[-2000:]
