import json
import os
import random
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))  # the tools import the core; tests import both
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
from cram import runtime, process  # noqa: E402,F401  first: names inductor's cache folder for this CPU capability before any test compiles

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "the king", "our neighbour"]
VERBS = ["saw", "liked", "followed", "painted", "found", "called", "helped", "watched"]
OBJECTS = ["the river", "a red house", "the garden", "an apple", "the green hill", "a letter", "the market", "the sea"]
PLACES = ["in the morning", "at night", "after dinner", "in the rain", "on sunday", "before the storm"]


def synthetic_corpus(n_docs=400, seed=0):
    """Documents of sentences from a small grammar: low entropy, so a tiny model learns fast."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = [f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                     f"{rng.choice(PLACES)}." for _ in range(rng.randint(3, 12))]
        docs.append(" ".join(sentences))
    return docs


def default_signals():
    """preexec_fn for a child that a test signals: the stop signals at their default disposition, even
    where the suite itself runs under nohup (SIGHUP ignored) or as a shell script's background job
    (SIGINT ignored), which a child would keep, as it should."""
    import signal
    for signum in process.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


CHILDREN = []  # the processes spawn() started in the running test


def spawn(args, **kwargs):
    """subprocess.Popen of a child that a test drives and signals (default_signals), killed when the
    test ends if it still runs (reap_children): a failing signal test leaves no hour-long run behind."""
    proc = subprocess.Popen(args, preexec_fn=default_signals, **kwargs)
    CHILDREN.append(proc)
    return proc


@pytest.fixture(autouse=True)
def reap_children():
    yield
    while CHILDREN:
        proc = CHILDREN.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_script(*args, cwd=ROOT, check=True, timeout=600):
    """Run one of the project's scripts as a user would (`python script.py args`, its own process);
    returns the CompletedProcess. A script runs in a child of a fork server that has imported torch, its
    optimizers and its compiler already (script_child.py: the same argv, folder, environment, output and exit
    status), which saves 2.5-8 s a run; anything else (`-c`, or an environment that differs in
    what an interpreter reads only as it starts) runs in a fresh interpreter."""
    # one thread: the tiny models gain nothing from more, and busy-waiting OpenMP threads make
    # a wall-clock-budgeted run crawl when the machine is shared
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    args = [os.fspath(arg) for arg in args]  # paths as the shell passes them: strings
    if args and args[0].endswith(".py") and startup_env(env) == FORK_SERVER.get("env", startup_env(env)):
        proc = run_forked(args, cwd, env, timeout)
    else:
        proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


FORK_SERVER = {}  # this test process's: its multiprocessing context, its startup environment, a fresh sys.path


def startup_env(env):
    """The variables an interpreter, OpenMP or torch read only as they start (a forked child keeps the server's)."""
    prefixes = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "TORCH", "CUDA", "LD_")
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


def run_forked(args, cwd, env, timeout):
    import multiprocessing
    import tempfile

    import script_child
    if not FORK_SERVER:
        context = multiprocessing.get_context("forkserver")
        # torch.optim imports torch._dynamo (about 2 s), which every training and fine-tuning run needs, and inductor
        # (3.5 s more) every compiled one. Neither starts a thread; the environment they read as they load is
        # startup_env's TORCH* variables, so a run that sets its own gets a fresh interpreter
        context.set_forkserver_preload(["torch", "numpy", "torch.optim", "torch._inductor.compile_fx"])
        fresh = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                               capture_output=True, text=True, check=True).stdout
        FORK_SERVER.update(context=context, env=startup_env(env), path=json.loads(fresh))
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        child = FORK_SERVER["context"].Process(target=script_child.run, args=(
            os.path.join(cwd, args[0]), args, cwd, env, FORK_SERVER["path"], out, err))
        saved = dict(os.environ)
        os.environ.update(env)  # a server started (or restarted) now imports torch in the run's environment
        try:
            child.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout)
        text = [open(path, encoding="utf-8", errors="replace", newline=None).read() for path in (out, err)]
        code = child.exitcode
        child.close()
    return subprocess.CompletedProcess([sys.executable, *args], code, *text)


def assert_one_line_error(proc, *fragments):
    """The script failed with one 'error: ...' line at the end of stderr and no traceback
    (progress bars may come before it)."""
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error:") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def weights_atol(lr, steps, r=1e-3):
    """How far two runs of the same training may leave a weight apart when only float32 rounding
    differs (another summation order: AVX2 or AVX512 kernels, off-load mode, DDP's all-reduce).
    AdamW moves a weight by lr x m / sqrt(v) per step, about lr whatever the gradient's size, so a
    gradient with a relative rounding error r moves its weight about r x lr: r x lr x steps in all.
    r = 1e-3 lets a gradient lose 10 of float32's 24 bits to cancellation; the off-load comparison
    measured up to 1.7e-4 across ATEN_CPU_CAPABILITY default, avx2 and avx512."""
    return r * lr * steps


# A fork's quick check (tests/README.md): `python -m pytest -q -m quick tests`, about a minute on 2 cores


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: a fork's quick check: the model, a training run, the configurator, "
                                       "an export round trip")


# The slowest tool tests (1.5-2 minutes each on 2 cores) run on request, keeping CI within its 10 minutes
slow = pytest.mark.skipif(os.environ.get("CRAM_SLOW") != "1", reason="slow: CRAM_SLOW=1 runs it")

# float32 pinned: dtype=auto picks bfloat16 on a CPU with AMX, and the tests that compare numbers
# (resume, compiled against eager, off-load against normal) mean the same arithmetic on every host
TINY_MODEL = ["--n_layers=2", "--d_model=64", "--n_heads=2", "--d_ffn=256", "--micro_batch=16", "--batch_size=32",
              "--lr=3e-3", "--log_interval=5", "--eval_sequences=64", "--device=cpu", "--compile=False", "--dtype=float32"]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "grammar.txt"
    path.write_text("\n\n".join(synthetic_corpus()) + "\n")
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, corpus_file):
    """A prepared tiny dataset: 384-token vocabulary, 32-token sequences."""
    out = tmp_path_factory.mktemp("data") / "grammar"
    run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={out}", "--vocab_size=384",
               "--seq_len=32", "--val_fraction=0.05")
    return out


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, prepared):
    """A tiny checkpoint pretrained for a few seconds on the prepared grammar corpus (train.py's
    recipe: smear on, so fine-tuning and the export are tested with it)."""
    out = tmp_path_factory.mktemp("pretrained")
    run_script("train.py", f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL, "--max_steps=60")
    return out / "ckpt.pt"
