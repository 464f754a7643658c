"""The GPU evidence in one command: is this setup healthy, and how good is each recipe here?

    python tools/gpu_report.py --corpus=books.txt.gz --glue_dir=glue      # every phase, ~40 minutes on an H100
    python tools/gpu_report.py --phases=health,transfer --data_dir=data/gpu_call/corpus --glue_dir=data/gpu_call/glue \
        --device=cuda --transfer_minutes=3.5 --deadline_minutes=8 --stop_grace_s=15 --copy_to=$OUT  # the first GPU call
    python tools/gpu_report.py --phases=bench,offload                     # some phases; the report keeps the rest

On one GPU, offline, from a text corpus and a local GLUE folder (tens of MB in all), in phases
that each have their own time limit and settings and can run alone:
  health    seconds: the device, its free memory, and a matmul's speed at the training precision
  transfer  does pretraining lift GLUE above the floor here? train.py's recipe pretrained for
            transfer_minutes (about 1e17 FLOPs on an H100, where MLM starts to transfer) at the
            shape and batch that budget picks (cram/budget.py's shape_for_budget), then
            STS-B, MRPC, RTE and SST-2 fine-tuned once each, and each also from scratch (the
            no-pretraining floor), beside the published rows; its point on the picture of GLUE
            against compute. Resumable: rerun it and the checkpoint and scored seeds are kept
  grid      which fine-tuning settings fit a small encoder? grid_train_args' pretraining (the transfer
            run's 8 x 512 again, to its token count), then each task at every rate x epochs point, once,
            the floor too, 12 processes at a time in order of value: grid.md, each point's dev score
            and its fit on the training examples, the model's and the floor's. Resumable
  prepare   the corpus with a 32k vocabulary into data_dir, unless it is prepared already
  bench     bench.py at the reference shape: tokens/s, MFU, share of the measured matmul speed,
            the original-BERT and HF ratios, and the micro-batch probe
  compile   bench.py's step in each torch.compile mode (default, max-autotune-no-cudagraphs,
            max-autotune) and eager, at the micro-batch the probe chose: tokens/s and warm-up
  float16   the consumer-GPU path: bfloat16 and float16 (loss scaling) trained a few minutes each,
            their validation loss curves, tokens/s and skipped updates side by side
  recipes   each recipe trained for recipe_minutes at the paper's shape (config/shape_paper.py), one after the other,
            and tools/compare.py's validation loss (fixed masks) against minutes and tokens
  glue      finetune_glue.py on the checkpoints of glue_recipes, for the small tasks in glue_dir; their
            points on the picture of GLUE against pretraining compute (tools/glue_plot.py)
  offload   tools/bench_offload.py at the reference shape (off-load beside normal mode, and both
            under a cap normal mode cannot train in); then an encoder whose normal-mode training
            state (16 bytes a parameter) exceeds the GPU but whose off-load state (18 bytes a block
            parameter, cram/offload.py) fits the host: normal mode fails to start (out of memory,
            caught), off-load mode trains a few steps
Writes <out_dir>/report.md (and its pictures): a summary table, then each phase's figures with
the commands, device, versions and date. A phase that fails or runs out of time is reported
and the rest go on. Each phase runs in its own process (a crash or an out-of-memory stays
there) and saves its section, so phases run in separate sessions end up in one report.

With deadline_minutes, everything the command starts has ended that many minutes after it began, on
a machine lent by the call (docs/gpu.md, "The first GPU session": tools/gpu_call.py prepares its data and
prints it); with copy_to, the first 7 of a fixed list of files that exist (COPIED, by value: the report,
the transfer table, the grid's, the pretraining logs, ...) are copied there as each piece finishes, so a
call cut short returns every piece finished by then.

On a CPU the same command runs end to end with tiny settings (tests/test_gpu_report.py):
device_memory_gib then simulates the GPU's memory for the off-load phase.
"""
import functools
import gc
import glob
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]  # the core, and measure.py beside this tool
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.files import check_writable, load_meta, read_json, read_jsonl, unused, write_atomically, write_json  # noqa: E402
from measure import held_below  # noqa: E402
from cram.process import child_env, guarded  # noqa: E402

# -----------------------------------------------------------------------------
corpus = ""                # text for the prepare phase (prepare.py's formats); empty: data_dir must be prepared
data_dir = "data/gpu_report"  # the prepared corpus every phase reads
glue_dir = ""              # a local GLUE folder (original layout); empty: the glue phase fails with a hint
out_dir = "out/gpu_report"  # report.md, its pictures, each phase's section and logs, the recipes' runs
phases = "health,transfer,prepare,bench,compile,float16,recipes,glue,offload"  # which phases to run, in this order
                           # (grid on request: its 8 x 512 and 48 fine-tuning runs want a GPU call of their own)
# transfer: pretraining, then GLUE beside the no-pretraining floor (the first question a GPU answers)
transfer_minutes = 6.0     # > 0: train.py's pretraining budget (compilation included), which picks its shape and batch
transfer_train_args = ""   # more train.py settings for its pretraining (a shape given here replaces the budget's)
transfer_tasks = "stsb,mrpc,rte,sst2"  # fine-tuned with 1 seed, those present in glue_dir; sst2 for 1 epoch, the rest 5
transfer_control = "stsb,mrpc,rte,sst2"  # empty: none; also fine-tuned from scratch (finetune_glue.py --from_scratch=True): the floor
transfer_jobs = 0          # >= 0: fine-tuning processes at once; 0: 8 on a GPU (batches of 16 leave it mostly idle), 1 on a CPU
transfer_glue_args = ""    # more finetune_glue.py settings for its fine-tuning
transfer_limit_minutes = 15.0  # > 0: the phase's time limit (deadline_minutes may end it sooner); a rerun continues
# grid: fine-tuning's rate and epochs at one pretrained width, the floor beside (which settings fit a small encoder?)
grid_train_args = "--n_layers=8 --d_model=512 --batch_size=512 --batch_ramp=0 --lr=0.00122 --budget_tokens=310100000"
                           # more train.py settings (the H100 transfer run's shape, batch, rate and tokens: reproducible)
grid_tasks = "stsb,mrpc,rte,sst2"  # those present in glue_dir, in this order of priority
grid_lr = "4e-5,1e-4,3e-4"  # each point's finetune_glue.py --lr
grid_epochs = "5,10"       # each point's --epochs, for the tasks but SST-2
grid_sst2_epochs = "1"     # SST-2's (67k examples: its runs are the grid's longest)
grid_batch = 32            # >= 1: every point's --batch_size
grid_control = True        # the floor (--from_scratch=True) on the same grid
grid_jobs_at_once = 0      # >= 0: fine-tuning processes at once; 0: 12 on a GPU (16 cores), 1 on a CPU
grid_glue_args = ""        # more finetune_glue.py settings for every point
grid_limit_minutes = 20.0  # > 0: the phase's time limit (deadline_minutes may end it sooner); a rerun continues
# prepare
prepare_args = "--vocab_size=32768"  # more prepare.py settings, space-separated (empty: none)
prepare_minutes = 3.0      # > 0: the phase's time limit
# bench
bench_args = "--shape=reference"  # more bench.py settings (empty: none)
bench_minutes = 8.0        # > 0
# compile: bench.py's crammed row in each torch.compile mode (and eager), at compile_micro_batch
compile_modes = "default,max-autotune-no-cudagraphs,max-autotune"  # bench.py --compile_mode
compile_micro_batch = 0    # >= 0: 0: the largest the bench phase found (its log), else bench.py's default
compile_minutes = 9.0      # > 0
# float16: the consumer-GPU path (no bfloat16 before Ampere) trained beside bfloat16, at the reference shape
float16_minutes = 1.5      # > 0: training budget of each precision
# recipes
recipes = "crammed,full_layers=2,recipe_reference"  # tools/compare.py's variants: crammed is train.py's recipe (the
                           # paper's + smear), full_layers=2 narrows it (NarrowBERT), recipe_reference is the paper's
recipe_minutes = 1.5       # > 0: training budget of each recipe (compilation included, evaluation not)
train_args = ""            # more train.py settings for the recipes and float16 phases (config/shape_paper.py's shape unless given)
# glue
glue_recipes = "crammed,recipe_reference"  # the recipes whose checkpoints are fine-tuned (about 2.5 min each)
glue_tasks = "rte,mrpc,stsb"  # those present in glue_dir are fine-tuned (CoLA: the most steps, and 0 this early)
glue_args = ""             # more finetune_glue.py settings
glue_minutes = 8.0         # > 0
# offload
offload_bench_args = "--shape=reference"  # more tools/bench_offload.py settings (empty: none)
device_memory_gib = 0.0    # >= 0: the device memory the shape must exceed; 0: the GPU's own (on a GPU, less caps the process)
host_memory_gib = 0.0      # >= 0: host memory the off-load state may use 85% of; 0: what the host has available
offload_micro_batch = 64   # >= 1
offload_accum = 2          # >= 1: micro-batches per optimizer step
offload_steps = 3          # >= 1: timed optimizer steps, after one untimed
offload_minutes = 8.0      # > 0
# one call on a lent machine (docs/gpu.md, "The first GPU session")
deadline_minutes = 0.0     # >= 0: if above 0, everything this command starts has ended this many minutes after it began,
                           # SIGKILL graces included (set a device call's timeout_s a minute or more above it)
copy_to = ""               # a folder (a device call's $OUT) that gets COPIED's files, flat, as each piece finishes
stop_grace_s = 30.0        # > 0: seconds from SIGTERM (train.py saves on it) to SIGKILL for a script stopped at its limit
device = "auto"
report = True              # write report.md after the phases (a phase run by the full command leaves it to it)
# -----------------------------------------------------------------------------
# in order of value per GPU minute (docs/gpu.md): health and speed first, then the decisions they feed
PHASES = ("health", "transfer", "grid", "prepare", "bench", "compile", "float16", "recipes", "glue", "offload")
GLUE_FOLDERS = {"rte": "RTE", "mrpc": "MRPC", "stsb": "STS-B", "cola": "CoLA", "sst2": "SST-2", "qnli": "QNLI",
                "qqp": "QQP", "mnli": "MNLI", "wnli": "WNLI"}
# the one call: CALL_ENV marks every process a command starts ("<start> <end> <pid>", end 0 without a deadline);
# a deadline's margins, after its scripts' SIGKILL: a phase saving its section and copies (its environment line may
# start CUDA: a second or two), then the command's sweep, report and copies (milliseconds)
CALL_ENV = "CRAM_GPU_REPORT_CALL"
SETTLE_S, CLOSE_S = 5.0, 3.0
# what copy_to gets (flat, under their own names), each piece as it finishes: the first 7 of these that exist, and
# logs_tail.txt besides: within a device call's 8. The GLUE-against-compute picture is not among them: glue_plot.py
# redraws it from glue.json on any machine
COPIED = ("report.md", "transfer.md", "grid.md", "grid.json", "logs/transfer_train.log", "transfer/glue.json",
          "logs/grid_train.log", "recipes.png", "float16.png")
COPIES_AT_MOST = 7
TAIL_FILE, TAIL_LINES = "logs_tail.txt", 12
WIDTHS = (4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 128, 64)  # off-load shapes to try, widest first


class PhaseFailed(Exception):
    """A phase could not produce its figures; the message says why in one line, `body` what it did measure."""

    def __init__(self, message, body=""):
        super().__init__(message)
        self.body = body


# ---------------------------------------------------------------- running the scripts
def stop_group(proc, grace=None):
    """Stop the process group that `proc` (a subprocess.Popen started with start_new_session) leads, with
    what it started (compare.py's train.py): SIGTERM first, on which a train.py run directly saves a
    checkpoint and finetune_glue.py keeps its scored seeds, then SIGKILL to whatever is left after `grace`
    seconds (stop_grace_s unless given), so nothing holds the GPU into the next phase."""
    grace = stop_grace_s if grace is None else grace
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()  # reaps the leader once it has ended: only the living count below
        try:
            os.killpg(proc.pid, 0)  # anyone left?
        except ProcessLookupError:
            return
        time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def begin_call():
    """Mark this command's processes with CALL_ENV (everything it starts inherits it) unless a command
    above this one did: returns whether this is that command, the one that sweeps at its end."""
    if CALL_ENV in os.environ:
        return False
    start = time.monotonic()
    os.environ[CALL_ENV] = f"{start:.3f} {start + 60 * deadline_minutes if deadline_minutes else 0:.3f} {os.getpid()}"
    return True


def call_times():
    """(start, end) of the command under way, as time.monotonic(); end is 0 without a deadline. Outside a
    command (a test calling a phase), now and no deadline."""
    start, end, _ = os.environ.get(CALL_ENV, f"{time.monotonic()} 0 0").split()
    return float(start), float(end)


def phase_deadline(start, name):
    """When phase `name`, begun at `start`, stops its scripts: at its limit, or early enough that they
    (stop_grace_s), the phase's section (SETTLE_S) and the command's sweep and copies (CLOSE_S) are
    done by the command's deadline."""
    end = call_times()[1]
    limit = start + 60 * phase_limit(name)
    return min(limit, end - CLOSE_S - SETTLE_S - stop_grace_s) if end else limit


def sweep():
    """SIGKILL to every process this command started that is still running, wherever it is: each
    script runs in a session of its own, which a kill of the command (a device call's timeout) would
    not reach. They are found by CALL_ENV in their environment (Linux's /proc; elsewhere the
    deadlines alone stop them), in passes until one finds none: a process that has just started
    shows no environment for a moment. Returns their pids."""
    found, quiet = [], 0
    for _ in range(10):  # until two passes in a row, 0.2 s apart, find none
        killed = sweep_once()
        found += killed
        quiet = 0 if killed else quiet + 1
        if quiet == 2:
            break
        time.sleep(0.2)
    return found


def sweep_once():
    """One pass of sweep: the pids it killed."""
    marker = f"{CALL_ENV}={os.environ.get(CALL_ENV)}".encode()
    killed = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
                    killed.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return killed


PUBLISHING = threading.RLock()  # fine-tuning jobs finish on the threads of run_jobs


def publish():
    """COPIED's files that exist, and the last lines of every log (TAIL_FILE), into copy_to, flat,
    each replaced whole: a device call's $OUT, which a call cut short still returns. At most 8 files
    there (a device call returns no more), none in a folder."""
    if not copy_to:
        return
    with PUBLISHING:
        os.makedirs(copy_to, exist_ok=True)
        for stale in (f for f in os.listdir(copy_to) if f.endswith(".tmp")):  # a writer killed mid-copy left it
            os.remove(os.path.join(copy_to, stale))
        chosen = [name for name in COPIED if os.path.isfile(os.path.join(out_dir, name))][:COPIES_AT_MOST]
        for name in COPIED:  # one copied before that a file of more value now displaces: removed
            if name not in chosen and os.path.isfile(os.path.join(copy_to, os.path.basename(name))):
                os.remove(os.path.join(copy_to, os.path.basename(name)))
        for name in chosen:
            write_atomically(os.path.join(copy_to, os.path.basename(name)),
                             functools.partial(shutil.copyfile, os.path.join(out_dir, name)))
        logs = os.path.join(out_dir, "logs")
        tails = [f"==> {name} <==\n{log_tail(os.path.join(logs, name))}" for name in sorted(os.listdir(logs))
                 ] if os.path.isdir(logs) else []
        write_atomically(os.path.join(copy_to, TAIL_FILE), lambda tmp: Path(tmp).write_text("\n".join(tails), encoding="utf-8"))


def log_tail(path):
    """A log's last TAIL_LINES lines as a terminal showed them: of a progress bar's updates (\\r), the last."""
    lines = [line.rsplit("\r", 1)[-1] for line in Path(path).read_bytes().decode(errors="replace").split("\n")]
    return "\n".join([line for line in lines if line.strip()][-TAIL_LINES:]) + "\n"


def set_aside(paths):
    """Each of `paths` that exists moved to <path>.old (.old2, ...: never over an earlier one, files.unused): fine-tuning
    scores of a checkpoint retrained since, which finetune_glue.py would refuse to mix with the new one's."""
    for old in paths:
        if os.path.exists(old):
            os.replace(old, unused(old + ".old"))


def run_logged(args, log_path, deadline, echo=True, append=False):
    """Run one of the project's scripts (args[0], then its arguments), its output saved to log_path
    (after what it holds if append; and shown as it comes if echo), killed at `deadline` (time.monotonic()).
    Returns the output; PhaseFailed if the script failed or ran out of time."""
    if deadline - time.monotonic() <= 0:
        raise PhaseFailed(f"no time left for {args[0]}")
    command = [sys.executable, os.path.join(ROOT, args[0]), *args[1:]]
    proc = subprocess.Popen(command, env=child_env(dict(os.environ, PYTHONUNBUFFERED="1")), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, encoding="utf-8", errors="replace",
                            start_new_session=True)  # its own process group,
    # which ends with this process, however it ends (child_env: process.follow_parent)
    timer = threading.Timer(deadline - time.monotonic(), stop_group, (proc,))
    timer.daemon = True
    timer.start()
    lines = []
    try:
        with open(log_path, "a" if append else "w", encoding="utf-8") as log:
            log.write(f"$ {' '.join(command)}\n")
            for line in proc.stdout:
                if echo:
                    sys.stdout.write(line)
                log.write(line)
                lines.append(line)
        code = proc.wait()
    except BaseException:  # Ctrl-C or a SIGTERM to this report: its own group would not reach the script's
        timer.cancel()
        stop_group(proc)
        raise
    timer.cancel()
    if code != 0 and time.monotonic() >= deadline:
        raise PhaseFailed(f"{args[0]} ran past the phase's time limit (log: {log_path})")
    if code != 0:
        last = [line.strip() for line in lines if line.strip()][-1:] or ["(no output)"]
        raise PhaseFailed(f"{args[0]} exited with {code}: {last[0]} (log: {log_path})")
    return "".join(lines)


def command_line(args):
    return "python " + " ".join(args)


def shape_args(text):
    return [a for a in text.split() if a]


# ---------------------------------------------------------------- the phases
def phase_health(deadline, logs):
    """Seconds-long: the device torch sees, its free memory (another process on the GPU shows
    here), and a square matmul's speed at the precision training uses, beside the device's peak."""
    import torch
    from cram import runtime
    rt = runtime.setup(device, "auto", compile=False)
    memory = ""
    if rt.device.type == "cuda":  # before this process allocates: what others hold shows
        free, total = torch.cuda.mem_get_info(rt.device)
        memory = f"; {free / 2 ** 30:.1f} of {total / 2 ** 30:.1f} GiB free"
        if total - free > 2 * 2 ** 30:  # more than a CUDA context's worth
            memory += " (another process holds the rest: figures below will be low)"
    size = 8192 if rt.device.type == "cuda" else 1024
    flops = runtime.matmul_speed(rt, size)  # under the run's autocast, as train.py's budget measures it
    peak = runtime.peak_flops(rt.device)
    share = f" ({100 * flops / peak:.0f}% of its {peak / 1e12:.0f} TFLOP/s peak)" if peak else ""
    headline = f"{rt.describe()}{memory}; {size}x{size} {rt.dtype_name()} matmul {flops / 1e12:.3g} TFLOP/s{share}"
    return headline, headline + "."


def phase_prepare(deadline, logs):
    """data_dir prepared from the corpus unless meta.json says it is done."""
    meta_path = os.path.join(data_dir, "meta.json")
    if os.path.isfile(meta_path) and corpus:  # a warm machine's folder from another call's text or settings
        meta, asked = load_meta(data_dir), dict(a[2:].split("=", 1) for a in shape_args(prepare_args) if "=" in a)
        other = [f"{k} {meta[k]}" for k in ("vocab_size", "seq_len") if k in asked and str(meta[k]) != asked[k]]
        if os.path.abspath(meta["source"]) != os.path.abspath(corpus) or other:
            raise PhaseFailed(f"{data_dir} was prepared from {meta['source']}{', ' * bool(other)}{', '.join(other)}: "
                              f"not --corpus={corpus} --prepare_args={prepare_args!r}; give another --data_dir")
    if not os.path.isfile(meta_path):
        if not corpus:
            raise PhaseFailed(f"{data_dir} is not prepared and no --corpus was given")
        args = ["prepare.py", f"--dataset={corpus}", f"--out_dir={data_dir}", *shape_args(prepare_args)]
        start = time.monotonic()
        run_logged(args, os.path.join(logs, "prepare.log"), deadline)
        how = f"`{command_line(args)}` in {time.monotonic() - start:.0f} s"
    else:
        how = "already prepared (nothing to do)"
    meta = load_meta(data_dir)
    train_tokens = os.path.getsize(os.path.join(data_dir, "train.bin")) // (2 if meta["dtype"] == "uint16" else 4)
    headline = f"{train_tokens:,} train tokens, vocabulary {meta['vocab_size']}"
    return headline, f"{data_dir}: {headline}, sequences of {meta['seq_len']}, from {meta['source']}; {how}."


def glue_present(names):
    """Those of the comma-separated GLUE tasks whose folder is in glue_dir; PhaseFailed without the folder."""
    if not glue_dir or not os.path.isdir(glue_dir):
        raise PhaseFailed(f"no GLUE folder at --glue_dir={glue_dir!r}: give one in the original layout (RTE/, MRPC/, ...)")
    return [t for t in names.split(",") if t and os.path.isdir(os.path.join(glue_dir, GLUE_FOLDERS.get(t, t)))]


def run_jobs(jobs, limit, deadline, done=lambda job: None):
    """Run the project's scripts, each (args, log_path), up to `limit` at a time, each killed at
    `deadline`, done(job) called as each one ends well: fine-tuning at batch 16 leaves a GPU mostly
    idle, so several share it. Returns the failures, one line each."""
    with ThreadPoolExecutor(limit) as pool:
        outcomes = pool.map(functools.partial(failure_of, deadline=deadline, done=done), jobs)
        return [failure for failure in outcomes if failure]


def failure_of(job, deadline, done):
    """None if the job (args, log_path) ran to its end (then done(job)), else why not in one line."""
    args, log_path = job
    try:
        run_logged(args, log_path, deadline, echo=False)
    except PhaseFailed as failure:
        return f"{' '.join(a for a in args if a.startswith('--tasks') or a.startswith('--from'))}: {failure}"
    done(job)


PIECES = []  # (what, minutes since the command began) of the transfer phase's pieces, as they finished
TRAIN_LINES = re.compile(r"^(?:budget: |settled: |model: |micro_batch=0: |torch\.compile built |final: |stopped by "
                         r"|.* has spent this budget).*$", re.M)  # train.py's start-up and final lines


def train_lines(phase):
    """The start-up and final lines of a phase's pretraining, from logs/<phase>_train.log (none before it starts)."""
    log = os.path.join(out_dir, "logs", f"{phase}_train.log")
    return TRAIN_LINES.findall(Path(log).read_text(errors="replace")) if os.path.isfile(log) else []


def piece_done(what, write_summary):
    """Say when a piece of a phase (transfer, grid) finished, rewrite its summary and copy what is done."""
    with PUBLISHING:
        PIECES.append((what, (time.monotonic() - call_times()[0]) / 60))
        print(f"== {what}: done at {PIECES[-1][1]:.1f} min", flush=True)
        write_summary()
        publish()


def write_transfer_summary():
    """<out_dir>/transfer.md, the transfer phase's answer so far in one file: the pretraining's start-up
    and final lines (the budget's pick, the validation loss), the fine-tuning table beside the floor
    with the runs finished so far, and the minutes since the command began at which each piece ended."""
    trained = train_lines("transfer")
    results = os.path.join(out_dir, "transfer", "glue.json")
    table = read_json(results, "delete it and run the phase again").get("table", "") \
        if PIECES and os.path.isfile(results) else ""  # (before this command's pretraining ends, an older model's)
    lines = ["# cram transfer: pretraining, then GLUE beside the no-pretraining floor", "",
             "Pretraining (logs/transfer_train.log):", "", *(f"    {line}" for line in trained or ["(no line yet)"]), "",
             table or "(no fine-tuning run has finished)", "", timeline()]
    write_atomically(os.path.join(out_dir, "transfer.md"), lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8"))


def timeline():
    return "Minutes since the command began, as each piece ended: " + (
        ", ".join(f"{what} {minutes:.1f}" for what, minutes in PIECES) or "none yet") + "."


def job_name(job):
    """A fine-tuning job's task, and whether it is the floor: 'rte', 'rte (no pretraining)'."""
    args = job[0]
    task = next(a.split("=", 1)[1] for a in args if a.startswith("--tasks="))
    return task + " (no pretraining)" * ("--from_scratch=True" in args)


def pretrain(phase, train_args, deadline, logs, write_summary):
    """train.py's recipe for transfer_minutes (train_args added: a --budget_tokens there sets the length instead) into
    <out_dir>/<phase>, resumed if its checkpoint is there; the fine-tuning scores of a checkpoint it replaces are set
    aside. Returns the run's folder and train.py's arguments."""
    run = os.path.join(out_dir, phase)
    os.makedirs(run, exist_ok=True)
    resume = os.path.isfile(os.path.join(run, "ckpt.pt"))
    train = ["train.py", f"--data_dir={data_dir}", f"--out_dir={run}", f"--budget_hours={transfer_minutes / 60!r}",
             "--eval_interval_minutes=1", "--ckpt_interval_minutes=2", f"--device={device}", f"--resume={resume}",
             *shape_args(train_args)]
    try:  # a resume's log follows the earlier runs': the start-up lines of the checkpoint's first run stay in it
        trained = run_logged(train, os.path.join(logs, f"{phase}_train.log"), deadline, append=resume)
    except PhaseFailed as failure:
        write_summary()  # its start-up lines, for the copies
        raise PhaseFailed(f"{failure}; run the phase again to continue (its checkpoint is saved every 2 minutes)")
    if "has spent this budget" not in trained:  # the scores of the checkpoint this one replaced, before any summary
        set_aside([os.path.join(run, name) for name in ("glue.json", "glue_runs", "grid")])
    piece_done("pretraining", write_summary)
    return run, train


def phase_transfer(deadline, logs):
    """train.py's recipe pretrained for transfer_minutes on data_dir, then the transfer tasks
    fine-tuned once (and the control tasks from scratch too, the floor) into one glue.json, in
    parallel processes; the table beside the published rows and the point on the picture of GLUE
    against compute. Everything done is kept: a rerun continues where a stop or the limit left it."""
    present, control = glue_present(transfer_tasks), glue_present(transfer_control)
    if not present:
        raise PhaseFailed(f"none of {transfer_tasks} is in {glue_dir}")
    prepared = phase_prepare(deadline, logs)[0]
    run, train = pretrain("transfer", transfer_train_args, deadline, logs, write_transfer_summary)
    results = os.path.join(run, "glue.json")
    base = ["finetune_glue.py", f"--checkpoint={os.path.join(run, 'ckpt.pt')}", f"--glue_dir={glue_dir}",
            f"--out_json={results}", "--seeds=1", f"--device={device}", *shape_args(transfer_glue_args)]
    jobs = [([*base, f"--tasks={t}", *(["--from_scratch=True"] * scratch), *(["--epochs=1"] if t == "sst2" else [])],
             os.path.join(logs, f"transfer_{t}{'_scratch' * scratch}.log"))
            for scratch, tasks in ((False, present), (True, control))
            for t in sorted(tasks, key=lambda t: t != "sst2")]  # the longest first: parallel jobs end together
    failures = run_jobs(jobs, transfer_jobs or (8 if device_kind() == "GPU" else 1), deadline,
                        lambda job: piece_done(job_name(job), write_transfer_summary))
    if failures:  # the section keeps the scores that did finish
        partial = read_json(results, "delete it and run the phase again").get("table", "") \
            if os.path.isfile(results) else ""
        raise PhaseFailed(f"{len(failures)} fine-tuning run(s) did not finish (rerun the phase to continue: the checkpoint "
                          f"and the scored seeds are kept): {failures[0]}",
                          body=f"{timeline()}\n\nThe runs that finished:\n\n{partial}" if partial else timeline())
    scores = read_json(results, "delete it and run the phase again")
    floor = scores.get("no_pretraining_scores", {})
    facts = scores["pretraining"]
    headline = ", ".join(f"{t} {scores['scores'][t]:.1f}" + (f" (no pretraining {floor[t]:.1f})" if t in floor else "")
                         for t in transfer_tasks.split(",") if t in scores["scores"])
    headline += f" after {facts['tokens'] / 1e6:,.1f}M tokens, {facts['flops']:.1e} FLOPs"
    mlm = f", val loss {facts['val_loss']:.4f} (masked-token accuracy {facts['accuracy']:.3f})" if facts["val_loss"] else ""
    pretrained = (f"Pretrained {facts['shape']}: {facts['tokens'] / 1e6:,.1f}M tokens in {60 * facts['hours']:.1f} min, "
                  f"{facts['flops']:.2e} FLOPs{mlm}.")
    body = "\n\n".join([f"Data: {prepared}.", f"`{command_line(train)}`", pretrained, timeline(),
                         "\n".join(f"`{command_line(args)}`" for args, _ in jobs), scores["table"],
                         glue_points(deadline, logs)])
    return headline, body


def grid_jobs(logs):
    """The grid phase's fine-tuning runs, (args, log path) each, in their order of priority: by grid_tasks' order, the
    longest first within a task, the floor beside the model; each point's runs in a glue.json of its own."""
    folder, jobs = os.path.join(out_dir, "grid", "grid"), []
    for task in glue_present(grid_tasks):
        epochs = sorted(map(int, (grid_sst2_epochs if task == "sst2" else grid_epochs).split(",")), reverse=True)
        for n, lr in ((n, float(lr)) for n in epochs for lr in grid_lr.split(",")):
            point = f"{task}-lr{lr:g}-e{n}"
            for scratch in (False, True)[:1 + grid_control]:
                jobs.append((["finetune_glue.py", f"--checkpoint={os.path.join(out_dir, 'grid', 'ckpt.pt')}",
                              f"--glue_dir={glue_dir}", f"--out_json={os.path.join(folder, point + '.json')}", "--seeds=1",
                              f"--device={device}", f"--tasks={task}", f"--lr={lr!r}", f"--batch_size={grid_batch}",
                              f"--epochs={n}", *(["--from_scratch=True"] * scratch), *shape_args(grid_glue_args)],
                             os.path.join(logs, f"grid_{point}{'_scratch' * scratch}.log")))
    return jobs


def grid_points():
    """Each point's scores so far: [{task, lr, batch, epochs, group, dev: {score: {metric: median}}, fit: {metric:
    median} on the training examples, seconds}], from the points' glue.json files."""
    points = []
    for path in sorted(glob.glob(os.path.join(out_dir, "grid", "grid", "*.json"))):
        results = read_json(path, "delete it and run the phase again")
        for group in ("tasks", "no_pretraining"):
            for task, entry in results.get(group, {}).items():
                settings = entry["settings"]
                points.append(dict(task=task, lr=settings["lr"], batch=settings["batch_size"], epochs=settings["epochs"],
                                   group=group, dev=entry["median"], fit=entry.get("fit", {}), seconds=entry["seconds"]))
    return points


def grid_cell(point, key):
    """A point's scores, main metric first, the others in brackets: '81.2 (70.1)'; '-' where it did not finish."""
    values = [] if point is None else [list(point["fit"].values())] if key == "fit" else [
        list(m.values()) for m in point["dev"].values()]
    if not values or not all(values):  # (a run from before fits were scored has none)
        return "-"
    return " / ".join(f"{v[0]:.1f}" + "".join(f" ({o:.1f})" for o in v[1:]) for v in values)


def write_grid_summary():
    """<out_dir>/grid.md and grid.json: the pretraining's lines, then a row per task and point (rate, epochs): dev and
    train scores of the model and of the floor, each task's best point on dev marked; and the minutes as each ended."""
    trained = train_lines("grid")
    points = grid_points() if PIECES else []  # (before this command's pretraining ends, an older model's)
    found = {(p["task"], p["lr"], p["epochs"], p["group"]): p for p in points}
    best = {}
    for p in points:  # a task's best on its first dev set's main metric
        if p["group"] == "tasks" and grid_score(p) > grid_score(best.get(p["task"])):
            best[p["task"]] = p
    lines = ["# cram grid: fine-tuning's rate and epochs at this width, beside the no-pretraining floor", "",
             "Pretraining (logs/grid_train.log):", "", *(f"    {line}" for line in trained or ["(no line yet)"]), "",
             f"Batch {grid_batch}, 1 seed each; main metric, the others in brackets (MRPC: F1 (accuracy); STS-B: Pearson "
             f"(Spearman)); train: the training examples finetune_glue.py scores (its fit); **bold**: the task's best on dev.", "",
             "| task | lr | epochs | dev | train | floor: dev | floor: train |", "|---|---|---|---|---|---|---|"]
    for task, lr, epochs in sorted({(p["task"], p["lr"], p["epochs"]) for p in points}, key=lambda k: (grid_order(k[0]), k)):
        ours, floor = found.get((task, lr, epochs, "tasks")), found.get((task, lr, epochs, "no_pretraining"))
        mark = "**" if ours is not None and ours is best.get(task) else ""
        lines.append(f"| {task} | {lr:g} | {epochs} | {mark}{grid_cell(ours, 'dev')}{mark} | {grid_cell(ours, 'fit')} | "
                     f"{grid_cell(floor, 'dev')} | {grid_cell(floor, 'fit')} |")
    lines += ["", timeline()]
    write_atomically(os.path.join(out_dir, "grid.md"), lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8"))
    write_json(os.path.join(out_dir, "grid.json"), dict(train_lines=trained, points=points))
    return best


def grid_order(task):
    """A task's place in grid_tasks (one an earlier command's grid had: after them)."""
    names = grid_tasks.split(",")
    return names.index(task) if task in names else len(names)


def grid_score(point):
    return -math.inf if point is None else next(iter(next(iter(point["dev"].values())).values()))


def phase_grid(deadline, logs):
    """Fine-tuning's settings at a pretrained width: train.py pretrained as grid_train_args says (the transfer run
    again, reproducibly), then each task fine-tuned at every rate and epoch count of the grid, once, and the floor
    the same, in parallel processes; grid.md says each point's dev and train scores. A rerun continues."""
    if not glue_present(grid_tasks):
        raise PhaseFailed(f"none of {grid_tasks} is in {glue_dir}")
    try:
        epochs = f"{grid_epochs},{grid_sst2_epochs}".split(",")
        valid = min(map(float, grid_lr.split(","))) > 0 and min(map(int, epochs)) > 0
    except ValueError:
        valid = False
    if not valid:
        raise PhaseFailed(f"--grid_lr={grid_lr!r}, --grid_epochs={grid_epochs!r} and --grid_sst2_epochs="
                          f"{grid_sst2_epochs!r} must be comma-separated rates > 0 and epoch counts >= 1")
    prepared = phase_prepare(deadline, logs)[0]
    _, train = pretrain("grid", grid_train_args, deadline, logs, write_grid_summary)
    jobs = grid_jobs(logs)
    failures = run_jobs(jobs, grid_jobs_at_once or (12 if device_kind() == "GPU" else 1), deadline,
                        lambda job: piece_done(os.path.basename(job[1])[5:-4], write_grid_summary))
    best = write_grid_summary()
    grid = Path(out_dir, "grid.md").read_text().split("\n", 2)[2]  # (its title is the section's)
    body = "\n\n".join([f"Data: {prepared}.", f"`{command_line(train)}`", grid, f"`{command_line(jobs[0][0])}` (and "
                          f"the other points: --tasks, --lr, --epochs, --from_scratch)" if jobs else ""])
    if failures:
        raise PhaseFailed(f"{len(failures)} of {len(jobs)} fine-tuning run(s) did not finish (rerun the phase to "
                          f"continue): {failures[0]}", body=body)
    return "best on dev: " + ", ".join(f"{t} {grid_score(p):.1f} at lr {p['lr']:g}, {p['epochs']} epochs"
                                       for t, p in sorted(best.items(), key=lambda i: grid_order(i[0]))
                                       ) + " (grid.md)", body


def phase_bench(deadline, logs):
    args = ["bench.py", f"--data_dir={data_dir}", f"--device={device}", *shape_args(bench_args)]
    output = run_logged(args, os.path.join(logs, "bench.log"), deadline)
    crammed = re.search(r"^\| crammed \| (\d+) \| ([\d,]+) \|.*\| (\d+)% \| ([\d.]+%|-) \|$", output, re.M)
    headline = (f"crammed: {crammed.group(2)} tokens/s at micro-batch {crammed.group(1)}, MFU {crammed.group(4)}, "
                f"{crammed.group(3)}% of the measured matmul speed" if crammed else "see the tables")
    body = output.replace("\n# ", "\n#### ")  # bench's own title line becomes a sub-heading
    return headline, f"`{command_line(args)}`\n\n{body.lstrip('# ')}"


def compile_micro_batch_used(logs):
    """(micro-batch, how it was chosen) for the compile phase: compile_micro_batch, else the bench
    phase's largest (its log), else bench.py's own (0)."""
    bench_log = os.path.join(logs, "bench.log")
    found = re.search(r"largest micro-batch within 90% of the free GPU memory: (\d+)",
                      Path(bench_log).read_text(encoding="utf-8")) if os.path.isfile(bench_log) else None
    if compile_micro_batch:
        return compile_micro_batch, "--compile_micro_batch"
    if found:
        return int(found.group(1)), "the bench phase's largest micro-batch"
    return 0, "bench_args' or bench.py's default micro-batch"


BENCH_ROW = re.compile(r"^\| crammed(?:, ([\w-]+))? \| (\d+) \| ([\d,]+) \| [\d.]+ \| ([\d.]+) \| ([\d.-]+) \|.*$", re.M)


def phase_compile(deadline, logs):
    """bench.py's crammed step in each of compile_modes (warm-up: compilation and autotuning) and
    eager, at the micro-batch training uses; one bench.py run per mode, so that a mode that fails
    (out of memory, a compiler error) or runs out of time costs only its own row."""
    micro, how = compile_micro_batch_used(logs)
    rows, failures, commands = {}, [], []
    for i, mode in enumerate(m for m in compile_modes.split(",") if m):
        args = ["bench.py", f"--data_dir={data_dir}", f"--device={device}", *shape_args(bench_args), "--compile=True",
                f"--compile_mode={mode}", "--baselines=False", "--sweep=False", f"--eager={i == 0}",  # eager once
                *([f"--micro_batch={micro}"] if micro else [])]
        commands.append(f"`{command_line(args)}`")
        try:
            output = run_logged(args, os.path.join(logs, f"compile_{mode}.log"), deadline)
        except PhaseFailed as failure:
            failures.append(f"- {mode}: {failure}")
            continue
        for name, used, speed, warm, peak in BENCH_ROW.findall(output):
            rows.setdefault(name or mode, (used, speed, warm, peak))
    if not rows:
        raise PhaseFailed("no mode could be timed: " + " ".join(failures))
    eager = float(rows["eager"][1].replace(",", "")) if "eager" in rows else None
    table = ["| mode | micro-batch | tokens/s | x eager | warm-up s | peak GiB |", "|---|---|---|---|---|---|"]
    for name, (used, speed, warm, peak) in rows.items():
        ratio = f"{float(speed.replace(',', '')) / eager:.2f}" if eager else "-"
        table.append(f"| {name} | {used} | {speed} | {ratio} | {warm} | {peak} |")
    headline = ", ".join(f"{name} {speed} tokens/s (warm-up {float(warm):.0f} s)"
                         for name, (_, speed, warm, _) in rows.items())
    body = "\n".join([*commands, "", f"Micro-batch: {how}; warm-up: the untimed first steps, compilation and autotuning "
                       "included.", "", *table, "", *failures])
    return f"{headline} at micro-batch {next(iter(rows.values()))[0]}", body


def variant_runs(folder, variants):
    """variant -> the out_dir of its run in <out_dir>/<folder> (tools/compare.py's layout, seed 0)."""
    return {v: os.path.join(out_dir, folder, v, "seed0") for v in variants if v}


def recipe_runs():
    return variant_runs("runs", recipes.split(","))


def run_speed(run):
    """Median tokens/s and MFU of a run's logged windows after the first (compilation), and the
    updates it skipped (non-finite gradients: float16's loss scaler finding its scale)."""
    records = [r for r in read_jsonl(os.path.join(run, "metrics.jsonl")) if r.get("kind") == "train"]
    windows = records[1:]
    if not windows:
        return "-", "-", str(records[-1].get("skipped", 0)) if records else "-"
    middle = sorted(windows, key=lambda r: r["tokens_per_s"])[len(windows) // 2]
    return (f"{middle['tokens_per_s']:,}", f"{100 * middle['mfu']:.1f}%" if middle.get("mfu") else "-",
            str(records[-1].get("skipped", 0)))


def train_variants(variants, minutes, phase, folder, deadline, logs, aside=()):
    """tools/compare.py's variants each trained for `minutes` on data_dir into <out_dir>/<folder>/,
    plotted in <out_dir>/<phase>.png. A rerun of the same command keeps the runs that finished (a phase
    cut off goes on where it stopped); other settings train afresh, first setting `aside` aside (the glue
    phase's scores of the checkpoints they replace). Returns (the command, its output, {variant: run folder})."""
    runs, where = variant_runs(folder, variants), os.path.join(out_dir, folder)
    base = os.path.join(out_dir, f"{phase}_base.py")
    paper_shape = os.path.join(ROOT, "config", "shape_paper.py")  # these phases measure the paper's shape, whatever the budget
    args = ["tools/compare.py", f"--variants={','.join(variants)}", f"--base={base}", f"--budget_minutes={minutes}",
            f"--out_dir={where}", f"--png={os.path.join(out_dir, phase + '.png')}",
            f"--train_args={' '.join([paper_shape, f'--device={device}', *shape_args(train_args)])}"]
    record = os.path.join(where, "phase_args.json")
    fresh = not os.path.isfile(record) or read_json(record, "delete it") != [*args, data_dir]
    if fresh:
        held = held_below(where)
        if held:  # a train.py of a report that was killed: a fresh phase never removes it
            raise PhaseFailed(f"{held[0]} is in use by another process (pid {held[1]}): wait for it to end or stop it")
        set_aside(aside)
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        write_json(record, [*args, data_dir])
    # what every variant shares (the data, evaluations along the way), whole: each run reads it as its config
    shared = f"data_dir = {os.path.abspath(data_dir)!r}\neval_interval_minutes = {minutes / 7!r}\nckpt_interval_minutes = 1e9\n"
    write_atomically(base, lambda tmp: Path(tmp).write_text(shared, encoding="utf-8"))
    return args, run_logged(args, os.path.join(logs, f"{phase}.log"), deadline), runs


def variants_section(args, output, runs, minutes, phase):
    """The section body of a train_variants phase: compare.py's table, speeds, skipped updates, the picture."""
    table = "\n".join(line for line in output.splitlines() if line.startswith("|"))
    speeds = "\n".join(f"| {variant} | {' | '.join(run_speed(run))} |" for variant, run in runs.items())
    finals = "\n".join(f"    {line}" for line in re.findall(r"^final: .*$", output, re.M))
    graphs = ", ".join(re.findall(r"torch.compile built (\d+) graph", output)) or "-"
    return (f"`{command_line(args)}` ({minutes} minutes each; validation loss with fixed 25% masks)\n\n{table}\n\n"
            f"| run | tokens/s (median window) | MFU | updates skipped (non-finite) |\n|---|---|---|---|\n{speeds}\n\n"
            f"![validation loss against minutes and tokens]({phase}.png)\n\n"
            f"torch.compile graphs per run: {graphs}\n\n{finals}")


def final_losses(output, variants):
    """variant -> its final validation loss, from compare.py's table (the first table it prints)."""
    table = "\n".join(line for line in output.splitlines() if line.startswith("|"))
    return dict(zip(variants, re.findall(r"^\| \S+ \| ([\d.]+) ", table, re.M)))


def phase_recipes(deadline, logs):
    """Each recipe trained for recipe_minutes on data_dir (tools/compare.py --variants), then plotted."""
    variants = [v for v in recipes.split(",") if v]
    glue_files = [os.path.join(out_dir, f"glue_{name}{end}") for name in variants for end in (".json", "_runs")]
    args, output, runs = train_variants(variants, recipe_minutes, "recipes", "runs", deadline, logs, glue_files)
    headline = "validation loss " + ", ".join(f"{v} {loss}" for v, loss in final_losses(output, variants).items())
    return headline, variants_section(args, output, runs, recipe_minutes, "recipes")


FLOAT16_VARIANTS = ("dtype=bfloat16", "dtype=float16")


def phase_float16(deadline, logs):
    """bfloat16 and float16 (loss scaling) trained for float16_minutes each at the reference shape."""
    args, output, runs = train_variants(FLOAT16_VARIANTS, float16_minutes, "float16", "float16_runs", deadline, logs)
    losses = final_losses(output, FLOAT16_VARIANTS)
    skipped = {v: run_speed(run)[2] for v, run in runs.items()}
    headline = ", ".join(f"{v.split('=')[1]}: val loss {losses.get(v, '-')}, {skipped[v]} updates skipped"
                         for v in FLOAT16_VARIANTS)
    return headline, variants_section(args, output, runs, float16_minutes, "float16")


def phase_glue(deadline, logs):
    """finetune_glue.py on the checkpoints of glue_recipes, for the tasks present in glue_dir."""
    present = glue_present(glue_tasks)
    if not present:
        raise PhaseFailed(f"none of {glue_tasks} is in {glue_dir}")
    unknown = [r for r in glue_recipes.split(",") if r not in recipe_runs()]
    if unknown:
        raise PhaseFailed(f"--glue_recipes names {', '.join(unknown)}, not among --recipes={recipes}")
    parts, averages = [], []
    for name, run in recipe_runs().items():
        if name not in glue_recipes.split(","):
            continue
        args = ["finetune_glue.py", f"--checkpoint={os.path.join(run, 'ckpt.pt')}", f"--glue_dir={glue_dir}",
                f"--tasks={','.join(present)}", f"--out_json={os.path.join(out_dir, f'glue_{name}.json')}",
                f"--device={device}", *shape_args(glue_args)]
        try:
            output = run_logged(args, os.path.join(logs, f"glue_{name}.log"), deadline)
        except PhaseFailed as failure:  # the other recipes still get their turn
            parts.append(f"#### {name}\n\nfailed: {failure}")
            continue
        average = re.search(r"^\| average \(\d+ of 9\) \| \| ([\d.-]+) \|", output, re.M)
        averages.append(f"{name} {average.group(1) if average else '-'}")
        table = "\n".join(line for line in output.splitlines() if line.startswith("|"))
        parts.append(f"#### {name}\n\n`{command_line(args)}`\n\n{table}")
    if not averages:
        raise PhaseFailed("no checkpoint could be fine-tuned (run the recipes phase first): " + " / ".join(parts))
    parts.append(glue_points(deadline, logs))
    return f"average of {len(present)} tasks: {', '.join(averages)}", "\n\n".join(parts)


def device_kind():
    import torch
    return "GPU" if device != "cpu" and torch.cuda.is_available() else "CPU"


def report_glue_files():
    """{label: glue.json} of every checkpoint this report has fine-tuned: the transfer phase's and
    the glue phase's recipes'."""
    files = {f"{device_kind()} transfer {transfer_minutes:g} min": os.path.join(out_dir, "transfer", "glue.json")}
    files.update({f"{device_kind()} {name} {recipe_minutes:g} min": os.path.join(out_dir, f"glue_{name}.json")
                  for name in recipe_runs() if name in glue_recipes.split(",")})
    return {label: path for label, path in files.items() if os.path.isfile(path)}


def glue_points(deadline, logs):
    """The project's points of GLUE against compute (docs/glue_points.json) with every checkpoint
    this report fine-tuned added (tools/glue_plot.py), and the picture: copy
    <out_dir>/glue_points.json over docs/glue_points.json to keep them."""
    points = os.path.join(out_dir, "glue_points.json")
    shipped = os.path.join(ROOT, "docs", "glue_points.json")
    if os.path.isfile(shipped):  # afresh each time: the shipped points as they are now, then this report's
        write_atomically(points, functools.partial(shutil.copyfile, shipped))
    elif os.path.exists(points):
        os.remove(points)
    done = report_glue_files()
    args = ["tools/glue_plot.py", f"--points={points}", f"--png={os.path.join(out_dir, 'glue_compute.png')}",
            f"--add={','.join(done.values())}", f"--label={','.join(done)}"]
    try:
        output = run_logged(args, os.path.join(logs, "glue_plot.log"), deadline)
    except PhaseFailed as failure:
        return f"#### GLUE against compute\n\nnot drawn: {failure}"
    table = "\n".join(line for line in output.splitlines() if line.startswith(("|", "- ")))
    return (f"#### GLUE against compute\n\n`{command_line(args)}` (keep these points: copy {points} over "
            f"docs/glue_points.json)\n\n![GLUE average against pretraining FLOPs](glue_compute.png)\n\n{table}")


# ---------------------------------------------------------------- off-load: larger than the GPU
def host_available_bytes():
    """MemAvailable from /proc/meminfo (Linux), else the free physical pages; never more than the
    container's limit (memory.memory_capacity)."""
    import torch
    from cram import memory
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            available = int(re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024
    except (OSError, AttributeError):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return min(available, memory.memory_capacity(torch.device("cpu")) or available)


def model_args_for(d_model, n_layers, vocab_size, seq_len):
    """The crammed shape family at width d_model: heads of 64 (or 128 from 2048 up), feed-forward 4x."""
    return dict(vocab_size=vocab_size, seq_len=seq_len, n_layers=n_layers, d_model=d_model,
                n_heads=max(1, d_model // (128 if d_model >= 2048 else 64)), d_ffn=4 * d_model, smear=True)


# the off-load shape's bounds: its normal-mode training state (float32 weights, gradients and two AdamW moments)
# over the device by a margin, its off-load host state (cram/offload.py) within a share of the host
STATE_BYTES, OVER_DEVICE, HOST_BYTES, HOST_SHARE = 16, 1.02, 18, 0.85  # bytes a parameter, x, bytes a block parameter, x


def offload_shape(device_bytes, host_bytes, vocab_size, seq_len):
    """The widest shape of at least 16 blocks whose normal-mode training state (STATE_BYTES a parameter)
    exceeds device_bytes by OVER_DEVICE and whose off-load host state (HOST_BYTES a block parameter)
    stays within HOST_SHARE of host_bytes: (model_args, parameters), or PhaseFailed when no width fits."""
    import torch
    from model import CrammedBert
    for d in WIDTHS:
        with torch.device("meta"):  # shapes only
            one, two = (CrammedBert(**model_args_for(d, n, vocab_size, seq_len)).num_params() for n in (1, 2))
        block, stem = two - one, 2 * one - two
        n_layers = int((OVER_DEVICE * device_bytes / STATE_BYTES - stem) // block) + 1  # the fewest over the device
        if n_layers >= 16 and HOST_BYTES * n_layers * block <= HOST_SHARE * host_bytes:
            return model_args_for(d, n_layers, vocab_size, seq_len), stem + n_layers * block
    raise PhaseFailed(f"no shape between the device ({device_bytes / 2 ** 30:.1f} GiB at {STATE_BYTES} bytes a parameter) "
                      f"and {HOST_SHARE:.0%} of the host ({host_bytes / 2 ** 30:.1f} GiB at {HOST_BYTES}): the host is too "
                      f"small for off-load mode to go beyond this GPU")


def state_bytes(model, optimizer):
    """Bytes of the training state: parameters, gradients and optimizer tensors."""
    params = sum(p.numel() * p.element_size() * (2 if p.grad is not None else 1) for p in model.parameters())
    return params + sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                        if hasattr(t, "numel"))


def gib(n_bytes):
    return f"{n_bytes / 2 ** 30:.3g} GiB"


def try_normal_mode(model_args, rt, device_bytes, batches):
    """One normal-mode step of the shape, built on the device: what happened, in words. On a GPU
    it should run out of memory; a CPU has none to run out of, so there the state's size is
    compared with device_bytes instead."""
    import torch
    from model import CrammedBert, param_groups
    model = optimizer = None
    try:
        with torch.device(rt.device):  # where it would train: no host copy first
            model = CrammedBert(**model_args)
        optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4)
        with rt.autocast():
            loss, _ = model(*batches(1)[0])
        loss.backward()
        optimizer.step()
        needed = state_bytes(model, optimizer)
        if rt.device.type == "cuda":
            raise PhaseFailed(f"normal mode trained the shape in {gib(rt.peak_memory())}: it is not larger "
                              f"than the GPU")
        if needed <= device_bytes:
            raise PhaseFailed(f"normal mode's state ({gib(needed)}) fits the simulated device")
        return (f"its training state needs {gib(needed)}, over the simulated device's {gib(device_bytes)}: would not "
                f"fit (a CPU has no device memory to run out of)")
    except torch.cuda.OutOfMemoryError as error:
        return f"out of memory, as it should: {str(error).splitlines()[0][:160]}"
    finally:
        model = optimizer = loss = None
        gc.collect()
        if rt.device.type == "cuda":
            torch.cuda.empty_cache()
            rt.reset_peak_memory()


def train_offloaded(model_args, rt, batches):
    """A few optimizer steps in off-load mode: seconds per step and losses (one untimed step first)."""
    import torch
    from model import CrammedBert
    from cram.offload import OffloadTrainer
    torch.manual_seed(0)
    start = time.monotonic()
    trainer = OffloadTrainer(CrammedBert(**model_args), rt, lr=1e-4, betas=(0.9, 0.98), eps=1e-12, weight_decay=0.01)
    print(f"off-load: built the model and its host state in {time.monotonic() - start:.0f} s", flush=True)
    seconds, losses = [], []
    for step in range(offload_steps + 1):
        start = time.monotonic()
        loss, applied = trainer.step(batches(offload_accum), 1e-4, 0.5)
        losses.append(loss)
        trainer.synchronize()  # the host updates of the blocks finish before the clock stops
        rt.synchronize()
        seconds.append(time.monotonic() - start)
        print(f"off-load step {step}: loss {losses[-1]:.4f} in {seconds[-1]:.1f} s{'' if applied else ' (skipped)'}",
              flush=True)
    return seconds[1:], losses


def offload_plan(device_bytes, host_bytes, vocab_size, seq_len):
    """offload_shape for this device, or, where the host cannot hold the state of a model beyond the
    whole device (an H200's 139 GiB against a host of 128), for a smaller device simulated by a cap:
    (model_args, parameters, the device bytes to use)."""
    try:
        return (*offload_shape(device_bytes, host_bytes, vocab_size, seq_len), device_bytes)
    except PhaseFailed:
        # a device whose beyond-state the host holds (with a fifth to spare for the stem and whole blocks)
        smaller = int(HOST_SHARE * host_bytes / HOST_BYTES * STATE_BYTES / OVER_DEVICE * 0.8)
        if smaller >= device_bytes:
            raise
        return (*offload_shape(smaller, host_bytes, vocab_size, seq_len), smaller)


def phase_offload(deadline, logs):
    import torch
    from cram import runtime
    from cram.data import RandomBatches, benchmark_tokens
    from model import MASK_RATE, ModelConfig
    args = ["tools/bench_offload.py", f"--data_dir={data_dir}", f"--device={device}", *shape_args(offload_bench_args)]
    bench = f"`{command_line(args)}`\n\n{run_logged(args, os.path.join(logs, 'bench_offload.log'), deadline)}"
    rt = runtime.setup(device, "auto", compile=False)  # after the benchmark: this process holds nothing on the GPU then
    total = torch.cuda.get_device_properties(rt.device).total_memory if rt.device.type == "cuda" else 0
    device_bytes = device_memory_gib * 2 ** 30 or total
    host_bytes = host_memory_gib * 2 ** 30 or host_available_bytes()
    vocab_size, seq_len = 32768, 128
    if os.path.isfile(os.path.join(data_dir, "meta.json")):
        meta = load_meta(data_dir)
        vocab_size, seq_len = meta["vocab_size"], meta["seq_len"]
    try:
        if not device_bytes:
            raise PhaseFailed("on a CPU give --device_memory_gib, the device memory to simulate")
        model_args, n_params, device_bytes = offload_plan(device_bytes, host_bytes, vocab_size, seq_len)
    except PhaseFailed as failure:  # the benchmark's figures stay in the section
        raise PhaseFailed(str(failure), body=bench) from None
    if rt.device.type == "cuda" and device_bytes < total:  # a smaller GPU, simulated by a cap on this process
        torch.cuda.set_per_process_memory_fraction(device_bytes / total)
    shape = f"{model_args['n_layers']}x{model_args['d_model']} (vocabulary {vocab_size}), {n_params / 1e6:,.1f}M parameters"
    print(f"off-load shape: {shape}", flush=True)
    tokens, _ = benchmark_tokens(data_dir, vocab_size, seq_len, seed=0)  # the data's when they match, else random
    batches = RandomBatches(tokens, vocab_size, offload_micro_batch, rt, MASK_RATE)
    normal = try_normal_mode(model_args, rt, device_bytes, batches)
    print(f"normal mode: {normal}", flush=True)
    rt.reset_peak_memory()
    seconds, losses = train_offloaded(model_args, rt, batches)
    flops = ModelConfig(**model_args).flops_per_token(MASK_RATE)
    step = sorted(seconds)[len(seconds) // 2]
    tokens_per_s = offload_micro_batch * offload_accum * seq_len / step
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    device_peak = rt.peak_memory()
    rows = [("shape", shape), ("device memory it must exceed", f"{gib(device_bytes)}{' (simulated)' if device_bytes != total else ''}"),
            ("host memory available", gib(host_bytes)),
            ("normal-mode training state (16 B a parameter)", gib(16 * n_params)),
            ("off-load host state, at most (18 B a parameter; the stem's stay on the device)", gib(18 * n_params)),
            ("normal mode", normal),
            ("off-load micro-batch x steps", f"{offload_micro_batch} x {offload_accum}, {offload_steps} timed steps"),
            ("off-load seconds per step, median (min-max)", f"{step:.2f} ({min(seconds):.2f}-{max(seconds):.2f})"),
            ("off-load tokens/s", f"{tokens_per_s:,.0f}"),
            ("off-load TFLOP/s", f"{flops * tokens_per_s / 1e12:.3g}"),
            ("peak device memory", gib(device_peak) if device_peak is not None else "-"),
            ("peak host memory (RSS)", gib(host_peak)),
            ("losses", ", ".join(f"{x:.3f}" for x in losses))]
    headline = (f"{n_params / 1e6:,.1f}M parameters: normal mode {'out of memory' if 'out of memory' in normal else 'does not fit'}; "
                f"off-load {tokens_per_s:,.0f} tokens/s, {flops * tokens_per_s / 1e12:.3g} TFLOP/s")
    body = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    return headline, f"{body}\n\n{bench}"


# ---------------------------------------------------------------- the report
PHASE_FUNCTIONS = dict(health=phase_health, transfer=phase_transfer, grid=phase_grid, prepare=phase_prepare, bench=phase_bench, compile=phase_compile, float16=phase_float16,
                       recipes=phase_recipes, glue=phase_glue, offload=phase_offload)
PHASE_MINUTES = dict(health=None, transfer="transfer_limit_minutes", grid="grid_limit_minutes", prepare="prepare_minutes", bench="bench_minutes", compile="compile_minutes", float16=None,
                     recipes=None, glue="glue_minutes", offload="offload_minutes")


def phase_limit(name):
    """The phase's time limit in minutes: its own setting; the training phases' from their budgets
    (+ start-up, probe, evaluations and saving for each run)."""
    if name == "recipes":
        return len(recipe_runs()) * (recipe_minutes + 1.5)
    if name == "float16":
        return len(FLOAT16_VARIANTS) * (float16_minutes + 1.5)
    if name == "health":
        return 1.0
    return globals()[PHASE_MINUTES[name]]


def environment():
    """Device, versions, commit and date, for every section."""
    import torch
    if torch.cuda.is_available():
        name = f"{torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2 ** 30:.0f} GiB"
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    return (f"{name} | torch {torch.__version__}{f' (CUDA {torch.version.cuda})' if torch.version.cuda else ''} | "
            f"Python {platform.python_version()} | cram {commit} | {time.strftime('%Y-%m-%d %H:%M')}")


def section_path(name):
    return os.path.join(out_dir, "sections", f"{name}.json")


def save_section(name, status, headline, body, minutes, env):
    os.makedirs(os.path.dirname(section_path(name)), exist_ok=True)
    write_json(section_path(name), dict(phase=name, status=status, headline=headline, body=body,
                                        minutes=round(minutes, 1), environment=env,
                                        command=command_line([os.path.relpath(__file__, ROOT), *sys.argv[1:]])))


def run_phase(name):
    """Run one phase in this process and save its section."""
    logs = os.path.join(out_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    start = time.monotonic()
    deadline = phase_deadline(start, name)
    print(f"== phase {name} (limit {(deadline - start) / 60:.1f} min)", flush=True)
    try:
        headline, body = PHASE_FUNCTIONS[name](deadline, logs)
        status = "ok"
    except (PhaseFailed, SystemExit) as failure:  # SystemExit: a one-line error from the core
        status, headline, body = "failed", str(failure), getattr(failure, "body", "")
    except Exception as error:  # a bug or a device's fault: said in the section, and the phases after go on
        status, headline = "failed", f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        body = f"```\n{traceback.format_exc()[-4000:]}\n```"
    save_section(name, status, headline, body, (time.monotonic() - start) / 60, environment())
    print(f"== phase {name}: {status}: {headline}", flush=True)
    publish()


def run_in_child(name):
    """Run one phase in its own process (an out-of-memory or a crash stays there), within its limit."""
    if os.path.exists(section_path(name)):
        os.remove(section_path(name))
    command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], f"--phases={name}", "--report=False"]
    start, end = time.monotonic(), call_times()[1]
    if end and phase_deadline(start, name) <= start:
        return save_section(name, "failed", "no time left before --deadline_minutes", "", 0.0, "")
    wait = min(60 * phase_limit(name) + 120, end - CLOSE_S - start) if end else 60 * phase_limit(name) + 120
    proc = subprocess.Popen(command, start_new_session=True, env=child_env())
    try:
        why = f"its process ended with {proc.wait(timeout=wait)}"
    except subprocess.TimeoutExpired:
        if end:  # the phase had its graceful stop at its own deadline: now nothing may outlive the command's
            sweep()
        else:  # (the phase stops its own script first, in up to stop_grace_s)
            stop_group(proc, grace=stop_grace_s + 15)
        proc.wait()
        why = "it ran past --deadline_minutes" if end else f"it ran past its limit of {phase_limit(name):.1f} minutes"
    except BaseException:  # Ctrl-C or a SIGTERM to this report: the phase (its own group) stops too
        stop_group(proc, grace=stop_grace_s + 15)
        raise
    if not os.path.exists(section_path(name)):  # killed or crashed before it could say so
        save_section(name, "failed", why, "", (time.monotonic() - start) / 60, "")


def read_section(name):
    return read_json(section_path(name), f"run the phase again (--phases={name})")


def write_report():
    """report.md from every saved section, in phase order: a summary table, then each phase."""
    sections = [read_section(n) for n in PHASES if os.path.exists(section_path(n))]
    lines = ["# cram GPU report", "",
             "Written by tools/gpu_report.py; each phase says its command, device, versions and date.", "",
             "| phase | status | minutes | headline |", "|---|---|---|---|"]
    lines += [f"| {s['phase']} | {s['status']} | {s['minutes']} | {s['headline']} |" for s in sections]
    for s in sections:
        lines += ["", f"## {s['phase']}", "", f"_{s['environment']}_  ", f"_`{s['command']}`_", "",
                  s["body"] or f"**{s['status']}**: {s['headline']}"]
    path = os.path.join(out_dir, "report.md")
    write_atomically(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8"))
    return path


def main():
    names = [p for p in phases.split(",") if p]
    unknown = [p for p in names if p not in PHASES]
    if unknown or not names:
        raise SystemExit(f"error: unknown phase {', '.join(map(repr, unknown)) or '(none given)'} "
                         f"(phases: {', '.join(PHASES)})")
    check_writable(os.path.join(out_dir, "report.md"), "--out_dir")
    if copy_to:
        check_writable(os.path.join(copy_to, "report.md"), "--copy_to")
    top = begin_call()
    try:
        if len(names) == 1:
            run_phase(names[0])
        else:
            for name in names:
                run_in_child(name)
                if report:  # after each phase: a command cut off later leaves a report of what finished
                    write_report()
                    publish()
    finally:
        left = sweep() if top else []  # nothing this command started outlives it
        if left:
            print(f"stopped {len(left)} process(es) left running at the end (SIGKILL)", flush=True)
        if top and deadline_minutes:  # what a device call's plan is checked against
            print(f"== ended {(time.monotonic() - call_times()[0]) / 60:.1f} min after it began (deadline "
                  f"{deadline_minutes:g})", flush=True)
    if report:
        print(f"wrote {write_report()}")
        publish()
    failed = [read_section(n) for n in names]
    failed = [s for s in failed if s["status"] != "ok"]
    if len(failed) == 1:
        raise SystemExit(f"error: phase {failed[0]['phase']} failed: {failed[0]['headline']}")
    if failed:
        raise SystemExit(f"error: {len(failed)} of {len(names)} phase(s) failed: see the report")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, f"finished phases keep their sections in {os.path.join(out_dir, 'sections')}; run the same "
            f"command for the others")
