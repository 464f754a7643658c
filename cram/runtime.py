"""Where and how the arithmetic runs: device, precision, TF32, compilation and DDP, decided once for
train.py, bench.py and finetune_glue.py. Every call runs on a CPU too (inductor, autocast, fused AdamW, the grad scaler),
so tests run the GPU's code path anywhere."""
import atexit
import contextlib
import dataclasses
import functools
import os
import tempfile
import time
import timeit
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from model import OPTIMIZERS

# inductor's kernel cache ignores ATEN_CPU_CAPABILITY (torch 2.13): a kernel built for one vector width, reused under
# another, gives NaN losses or corrupts the heap. So each capability gets a folder, named on import, before inductor
# fixes its own (a user's TORCHINDUCTOR_CACHE_DIR wins); no temporary folder: the configurator said so already.
with contextlib.suppress(FileNotFoundError):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "torchinductor_{}_{}".format(
        os.getuid() if hasattr(os, "getuid") else "user", torch.backends.cpu.get_cpu_capability().lower())))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense bf16 tensor-core peaks (FLOP/s) used for MFU (the V100's is float16's: it has no bfloat16); matched on the device
# name, the longest key first. An H100 is the SXM card's unless its name says PCIe or NVL. Another GPU: --peak_tflops.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "GH200": 989e12,
                  "A100": 312e12, "A6000": 154.8e12, "A40": 149.7e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12,
                  "A10": 125e12, "4090": 165e12, "3090": 71e12, "V100": 125e12, "A4000": 76.7e12}

# torch.compile's modes: inductor's defaults, autotuned GEMMs, CUDA graphs (one launch a step) with or without them. The
# reference trains with max-autotune; cram keeps inductor's until a GPU report shows one faster (bench.py times them).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
CUDA_GRAPH_MODES = ("max-autotune", "reduce-overhead")
MAX_GRAPHS = 32  # the graphs one compiled function may build: 8 masking levels x 2 micro-batch sizes (3 for a fork's batch schedule), and room

# dtype=auto on a CPU: bfloat16 where its matmuls run at least this many times float32's; below it the step's other
# work, at float32's pace, eats the gain (BENCHMARKS.md, "The CPU's precision", has the hosts measured)
BF16_PICK_RATIO = 1.5


def peak_flops(device, override=0.0):
    """The peak bfloat16 FLOP/s of a CUDA device by its name, for MFU, or 0 when unknown (then MFU is not shown)."""
    if override or device.type != "cuda":
        return override or 0.0
    name = torch.cuda.get_device_name(device)  # the longest name first: "L40S" before "L40" and "L4"
    return next((GPU_PEAK_FLOPS[key] for key in sorted(GPU_PEAK_FLOPS, key=len, reverse=True) if key in name), 0.0)


def check_compile_mode(mode, device):
    """A one-line error for a mode torch.compile does not have, or one that needs a GPU."""
    if mode not in COMPILE_MODES:
        raise SystemExit(f"error: unknown compile mode '{mode}' ({', '.join(COMPILE_MODES)})")
    if mode in CUDA_GRAPH_MODES and device.type != "cuda":
        raise SystemExit(f"error: compile mode '{mode}' records CUDA graphs, which need a GPU; on a {device.type} use "
                         f"default or max-autotune-no-cudagraphs")


class CudaGraphRuns(torch.nn.Module):
    """A model compiled to record CUDA graphs, whose replay overwrites the last one's outputs, gradients included: each
    call gives every parameter a gradient buffer of its own (autograd adds into it) and marks a new run."""

    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        for p in self.parameters():
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(*args)


@dataclasses.dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    compile: bool
    compile_mode: str = "default"  # one of COMPILE_MODES (checked by setup)
    why: str = ""  # why this dtype: auto's reason (auto_dtype), or "" where the setting named it
    bf16_speedup: float = 0.0  # a CPU's bfloat16 matmul speed over float32's where dtype=auto timed it, else 0
    optim: str = "adamw"  # the optimizer that optimizer() builds and the memory check counts: a key of model.OPTIMIZERS
    peak_flops: float = 0.0  # the device's peak FLOP/s (peak_flops), against which train.py reports MFU; 0: unknown

    def autocast(self):
        return contextlib.nullcontext() if self.dtype == torch.float32 else torch.autocast(self.device.type, dtype=self.dtype)

    def grad_scaler(self):
        """Loss scaling for float16, whose small gradients underflow; a pass-through otherwise."""
        return torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)

    def optimizer(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        """OPTIMIZERS[self.optim]'s row built over `params` (model.param_groups's groups), the row train.py's
        make_trainer builds, with the rate, betas and eps given here. bench.py, fine-tuning (both "adamw") and the
        memory probe (--optim's row) build theirs here."""
        return OPTIMIZERS[self.optim].build(params, lr, betas, eps)

    def compile_model(self, model, fullgraph=True):
        """The model compiled by torch.compile, if compilation is on; its forward and backward then run as compiled
        kernels. fullgraph=True makes a graph break an error rather than a silent slowdown, and dynamic=False gives
        each shape (each masking-rate level) a graph of its own."""
        if not self.compile:
            return model
        if self.device.type == "cpu":
            prepare_inductor()
        # A run compiles a graph for each masking level and micro-batch size it meets, up to 8 x 3. Past torch's
        # limit of 8 graphs a function, a fullgraph model fails, so the limit is raised to what a run may need.
        limits = torch._dynamo.config
        name = "recompile_limit" if hasattr(limits, "recompile_limit") else "cache_size_limit"  # older torch's name
        setattr(limits, name, max(getattr(limits, name), MAX_GRAPHS))
        mode = None if self.compile_mode == "default" else self.compile_mode
        compiled = torch.compile(model, fullgraph=fullgraph, dynamic=False, mode=mode)
        return CudaGraphRuns(compiled) if self.compile_mode in CUDA_GRAPH_MODES else compiled

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak_memory(self):
        """Peak bytes allocated on a GPU since the last reset_peak_memory(), or None on a CPU."""
        return torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None

    def reset_peak_memory(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def describe(self):
        name = f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        mode = f", compiled ({self.compile_mode})" if self.compile_mode != "default" else ", compiled"
        return f"{self.device}{name}, {self.dtype_name()}{f' ({self.why})' if self.why else ''}{mode * self.compile}"

    def dtype_name(self):
        """The autocast precision as the dtype setting names it ('float32', 'bfloat16', 'float16')."""
        return str(self.dtype).replace("torch.", "")


def setup(device="auto", dtype="auto", compile=True, compile_mode="default", continues=None):
    """The Runtime for the settings device ('auto', 'cpu', 'cuda', 'cuda:N': under torchrun LOCAL_RANK's), dtype ('auto'
    or DTYPES'), compile and compile_mode; `continues`: the (device type, dtype) a resumed run had (auto_dtype)."""
    fit_threads()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SystemExit(f"error: unknown device '{device}' (auto, cpu, cuda, cuda:N)")
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"error: unsupported device '{device}' (auto, cpu, cuda, cuda:N)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"error: --device={device} but torch sees no CUDA GPU (torch {torch.__version__}); "
                             "use --device=cpu or install a CUDA build of torch")
        index = dev.index if dev.index is not None else int(os.environ.get("LOCAL_RANK", 0))
        if index >= torch.cuda.device_count():
            raise SystemExit(f"error: --device={device}: there are only {torch.cuda.device_count()} GPUs")
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls outside autocast on tensor cores
        torch.backends.cudnn.allow_tf32 = True
    dtype, why, speedup = auto_dtype(dev, continues=continues) if dtype == "auto" else (dtype, "", 0.0)
    if dtype not in DTYPES:
        raise SystemExit(f"error: unknown dtype '{dtype}' (auto, {', '.join(DTYPES)})")
    check_compile_mode(compile_mode, dev)  # with compile off too: a mode that cannot run here is a mistake to report
    problem = compile and compile_problem(dev)
    if problem:
        if os.environ.get("RANK", "0") == "0":
            print(f"warning: torch.compile cannot build here: {problem}; this run goes on eager (the same results, "
                  f"somewhat slower), and --compile=False skips this check", flush=True)
        compile = False
    return Runtime(dev, DTYPES[dtype], compile, compile_mode, why, speedup)


def auto_dtype(device, continues=None, speedup=None):
    """dtype='auto': (the precision, why, the CPU's timed speed-up or 0): the continued run's (`continues`) on its device
    type; a GPU's bfloat16 or float16; a CPU's bfloat16 where its matmuls are BF16_PICK_RATIO x float32's, else float32."""
    bfloat16 = device.type == "cpu" or torch.cuda.is_bf16_supported()
    if continues and continues[0] == device.type and continues[1] in DTYPES and (continues[1] != "bfloat16" or bfloat16):
        return continues[1], "auto: as the run it continues", 0.0
    if device.type == "cuda":
        return ("bfloat16", "auto: a GPU with bfloat16", 0.0) if bfloat16 else ("float16", "auto: a GPU without bfloat16", 0.0)
    speedup = bf16_speedup() if speedup is None else speedup
    pick, than = ("bfloat16", "at least") if speedup >= BF16_PICK_RATIO else ("float32", "under")
    return pick, f"auto: bfloat16 matmuls {speedup:.2g}x float32's here, {than} {BF16_PICK_RATIO}x", speedup


def bf16_speedup(size=512, rounds=3, seconds=0.05):
    """float32's speed times which a size^3 matmul runs in bfloat16 autocast on one thread of this CPU: the best of
    `rounds` rounds in turns, a round as many products as fit `seconds`; one far below the threshold ends it early."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best, threads = {torch.float32: 0.0, torch.bfloat16: 0.0}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for i in range(rounds + 1):  # the first: warm-up, kept only where it is the best
                for dtype in best:
                    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                        start, count = time.perf_counter(), 0
                        while count == 0 or time.perf_counter() - start < seconds:
                            a @ b
                            count += 1
                        best[dtype] = max(best[dtype], count / (time.perf_counter() - start))
                if i and best[torch.bfloat16] < best[torch.float32] * BF16_PICK_RATIO / 4:
                    break  # far below: more rounds would not change the pick
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / best[torch.float32]


def rank0_precision(rt):
    """Under DDP: rank 0's precision and speed-up on every rank (near the threshold two ranks' timings could differ)."""
    names = list(DTYPES)
    name = names[round(from_rank0(names.index(rt.dtype_name()), rt.device))]
    return dataclasses.replace(rt, dtype=DTYPES[name], bf16_speedup=from_rank0(rt.bf16_speedup, rt.device),
                               why=rt.why if name == rt.dtype_name() else "auto: rank 0's")


def compile_problem(device):
    """Why torch.compile cannot build here, in a few words, or None: a small function compiled before any work (a failure
    at the first backward would leave a step half done); its graph taken off compiled_graphs' count."""
    from torch._dynamo.utils import counters
    before = dict(counters["stats"])
    try:
        if device.type == "cpu":
            prepare_inductor()  # which builds code to learn the CPU's vector width
        torch.compile(lambda x: torch.sin(x) * 2, fullgraph=True, dynamic=False)(torch.ones(8, device=device))
        return None
    except Exception as e:  # inductor wraps the toolchain's errors in its own; their first line says what failed
        text = " ".join(str(e).split())
        if "C++ compiler" in text or "InvalidCxxCompiler" in type(e).__name__ + text or "is not found" in text:
            return (f"it needs a C++ compiler and none works ({text[-160:]}): install one (Debian, Ubuntu: apt install "
                    f"g++; Fedora: dnf install gcc-c++; macOS: xcode-select --install; conda: conda install -c "
                    f"conda-forge gxx) or point CXX at it")
        triton = " (Triton needs a C compiler, gcc or clang, and pip install triton)" * (device.type == "cuda")
        return f"{type(e).__name__}: {text[:200]}{triton}"  # Triton builds a small C launcher for its kernels
    finally:
        counters["stats"].clear()
        counters["stats"].update(before)


def prepare_inductor():
    """Under ATEN_CPU_CAPABILITY=default inductor's scalar C++ does not build smear's shifted gather (torch 2.13): it
    gets the CPU's narrowest vector width, while ATen's kernels keep the capability asked for."""
    from torch._inductor import config
    try:
        from torch._inductor import cpu_vec_isa
    except ImportError:  # torch 2.4 keeps the vector ISAs in codecache
        from torch._inductor import codecache as cpu_vec_isa
    if config.cpp.simdlen is None and not cpu_vec_isa.pick_vec_isa():
        config.cpp.simdlen = min((isa.bit_width() for isa in cpu_vec_isa.valid_vec_isa_list()), default=None)


def launcher(env=os.environ):
    """(whether this process is one of torchrun's, how many processes there are): torchrun's environment whole or none of
    it; a part (a job wrapper's RANK=0) is a one-line error naming what is missing, not a guess."""
    torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what it sets in each process
    present = [k for k in torchrun if k in env]
    if not present:
        return False, 1
    missing = [k for k in torchrun if k not in env]
    if missing:
        raise SystemExit(f"error: {', '.join(present)} set but not {', '.join(missing)}: not torchrun's environment; "
                         f"launch with torchrun for several processes, or unset {', '.join(present)} for one")
    try:
        rank, world, local = (int(env[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except ValueError:
        raise SystemExit(f"error: RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (they are "
                         f"{env['RANK']!r}, {env['WORLD_SIZE']!r}, {env['LOCAL_RANK']!r})")
    if not (0 <= rank < world and 0 <= local <= rank):
        raise SystemExit(f"error: RANK={rank}, LOCAL_RANK={local} do not fit WORLD_SIZE={world}")
    return True, world


def cgroup_folders(controller, root="/sys/fs/cgroup", own="/proc/self/cgroup"):
    """The folders of this process's cgroups (v2's tree, v1's `controller` hierarchy), innermost first, up to each root:
    a limit anywhere on the way holds, a job's (SLURM's --mem) as a container's."""
    entries = []
    with contextlib.suppress(OSError), open(own, encoding="utf-8") as f:
        entries = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    trees = [(root if kinds == "" else os.path.join(root, controller), path) for _, kinds, path in entries
             if kinds == "" or controller in kinds.split(",")] + [(root, "/"), (os.path.join(root, controller), "/")]
    parts = [(base, [name for name in path.split("/") if name]) for base, path in trees]
    folders = [os.path.join(base, *names[:i]) for base, names in parts for i in range(len(names), -1, -1)]
    return [f for f in dict.fromkeys(folders) if os.path.isdir(f)]


def usable_cpus(cgroup="/sys/fs/cgroup", own="/proc/self/cgroup"):
    """The CPUs this process may really use (os.cpu_count() is the host's): its affinity (taskset, a cpuset), capped by
    a CPU quota on any of its cgroups (v2's cpu.max, v1's cfs quota: Docker's --cpus), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for folder in cgroup_folders("cpu", cgroup, own):
        for names in (("cpu.max",), ("cpu.cfs_quota_us", "cpu.cfs_period_us")):  # v2's one file, v1's two
            try:
                fields = " ".join(Path(folder, name).read_text(encoding="utf-8") for name in names).split()
                quota, period = int(fields[0]), int(fields[1])  # v2 'max 100000' (no quota) raises; v1's -1 is skipped
            except (OSError, ValueError, IndexError):
                continue
            if quota > 0 and period > 0:
                cpus = min(cpus, max(1, quota // period))
    return max(1, cpus)


def fit_threads():
    """torch's threads down to usable_cpus() unless OMP_NUM_THREADS says: more wait on each other at every operation."""
    cpus = usable_cpus()
    if "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > cpus:
        torch.set_num_threads(cpus)


def join_process_group(device, minutes):
    """Under torchrun: this process joins the others (NCCL on GPUs, gloo on CPUs) within `minutes`, or ends in one line
    (one that refused or died ends the rest: process.guarded); returns its rank. The work's waits: set_waits(30)."""
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=minutes))
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())  # a refusal's exit: the group's
    dist.barrier()  # threads end before the interpreter's, which would abort it ("terminate called without ...")
    return dist.get_rank()


def set_waits(minutes):
    dist.distributed_c10d._set_pg_timeout(timedelta(minutes=minutes))


def leave_process_group():
    """The end of a DDP run, once the DDP model is deleted: its reducer freed before the group (at the interpreter's exit
    it can abort the process), a barrier (rank 0 evaluates and saves alone), and the group's end. Without a process
    group (one process), nothing."""
    if not (dist.is_available() and dist.is_initialized()):  # as agree_on_clock asks
        return
    import gc
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def from_rank0(value, device):
    """Under DDP: rank 0's number, on every rank (a measurement one rank makes for all)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, 0)
    return t.item()


def agree_on_clock(seconds, stop):
    """Under DDP, every process takes rank 0's clock and stops if any process was asked to stop, so that all take the
    same batch and stop at the same step. One process keeps its own values."""
    if not (dist.is_available() and dist.is_initialized()):
        return seconds, stop
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    both = torch.tensor([seconds if dist.get_rank() == 0 else 0.0, float(stop)], dtype=torch.float64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # the others send 0 seconds, so the largest is rank 0's
    return both[0].item(), bool(both[1].item())


def matmul_speed(rt, size=2048):
    """FLOP/s of a size^3 matmul at `rt`'s precision, the budget's measure of a device (budget_compute passes float32 on
    a CPU): the best of three rounds after 0.1 s of warm-up, its operands made in that precision (autocast's casts cost
    an H100 as much as the product)."""
    a, b = (torch.randn(size, size, device=rt.device).to(rt.dtype) for _ in range(2))
    with torch.no_grad(), rt.autocast():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.1:
            a @ b
            rt.synchronize()
        return 2 * size ** 3 / best_seconds(functools.partial(torch.mm, a, b), rt, 20 if rt.device.type == "cuda" else 1)


def best_seconds(work, rt, repeats, rounds=3):
    """Seconds a call of work() takes: the fastest of `rounds` timings of `repeats` calls, synchronised around each."""
    def clock():  # a reading first waits for the device: a round's time is all of its work's
        rt.synchronize()
        return time.perf_counter()
    return min(timeit.repeat(work, timer=clock, repeat=rounds, number=repeats)) / repeats


def compiled_graphs():
    """How many graphs torch.compile has built in this process (a recompilation adds one)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def cpu_warning(flops_per_step, threads=None, cpu_flops_per_thread=75e9):
    """A one-line warning where a step at the full batch takes over 10 minutes on this CPU (about 75 GFLOP/s a thread)."""
    minutes = flops_per_step / (cpu_flops_per_thread * (threads or torch.get_num_threads())) / 60
    return (f"warning: on this CPU one optimizer step at the full batch takes about {minutes:.0f} minutes: this shape needs"
            f" a GPU. For a run of a few minutes: python train.py config/train_quickstart.py") if minutes > 10 else None
