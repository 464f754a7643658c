"""Off-load mode (train.py --offload=True, cram/offload.py) beside normal mode: speed, memory, the host
AdamW, the bus, and both modes under a memory cap that normal mode cannot train in.

    python tools/bench_offload.py                      # a GPU: the reference shape at micro-batch 128
    python tools/bench_offload.py --micro_batch=512    # large enough to hide the transfers (docs/offload.md)

Both modes eager (off-load mode runs the blocks eagerly), train.py's steps, timed in alternation
(A B A B: a shared machine drifts); then the host AdamW, off-load mode's one fused AdamW per block
against one over the same tensors; on a GPU also the bandwidth of a pinned host-to-device copy,
and both modes with the process capped (set_per_process_memory_fraction) at `cap` of what normal
mode needs: normal mode, built afresh under the cap, runs out of memory; off-load mode trains.
"""
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up; first, for torch's temporary folder)
import torch  # noqa: E402
from cram import process, runtime  # noqa: E402
from cram.data import RandomBatches  # noqa: E402
from cram.data import benchmark_tokens  # noqa: E402
from cram.files import gib  # noqa: E402
from measure import alternate, spread  # noqa: E402
from model import MASK_RATE, SHAPES, CrammedBert, ModelConfig, Trainer, param_groups  # noqa: E402
from cram.offload import OffloadTrainer  # noqa: E402

# -----------------------------------------------------------------------------
shape = "auto"          # {auto, reference, small}: 16x768 with 32768 tokens, 4x256 with 8192; auto: by device
micro_batch = 0         # >= 0: if 0, 128 on a GPU and 32 on a CPU
accum_steps = 4         # >= 1: micro-batches per optimizer step
steps = 0               # >= 0: timed optimizer steps per round (0: 10 on a GPU, 3 on a CPU)
warmup_steps = 0        # >= 0: untimed steps first (0: 3 on a GPU, 1 on a CPU)
repeats = 3             # >= 1: alternating rounds of `steps` steps per mode
cap = 0.3               # (0, 1]: on a GPU: both modes capped at this share of normal mode's peak memory
data_dir = "data/pydocs"  # real tokens when its vocabulary matches the shape; random tokens otherwise
seq_len = 128           # >= 2
device = "auto"
dtype = "auto"          # {auto, float32, bfloat16, float16}: as train.py
seed = 0                # [0, 4294967295]
# -----------------------------------------------------------------------------


class NormalMode:
    name = "normal, eager"

    def __init__(self, dims, rt):
        model = CrammedBert(seq_len=seq_len, **dims).to(rt.device)
        optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12)
        self.trainer, self.rt = Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast), rt

    def step(self, batches):
        return self.trainer.step(batches(accum_steps), 1e-4, 0.5)[0]

    def finish(self):
        self.rt.synchronize()


class OffloadMode:
    name = "off-load"

    def __init__(self, dims, rt):
        self.trainer = OffloadTrainer(CrammedBert(seq_len=seq_len, **dims), rt, 1e-4, (0.9, 0.98), 1e-12, 0.01)
        self.rt = rt

    def step(self, batches):
        return self.trainer.step(batches(accum_steps), 1e-4, 0.5)[0]

    def finish(self):  # the blocks' host updates run on past step(); a timing waits for them as the next step would
        self.trainer.synchronize()
        self.rt.synchronize()


def time_mode(mode, batches, n_steps, rt):
    """Seconds per optimizer step of `mode`, and its peak device memory (None on a CPU)."""
    rt.reset_peak_memory()
    start = time.perf_counter()
    for _ in range(n_steps):
        mode.step(batches)  # the step's loss is a float: each step waits for the device
    mode.finish()
    return (time.perf_counter() - start) / n_steps, rt.peak_memory()


def compare_modes(modes, batches, n_steps, n_warmup, rt):
    """{name: [seconds per step, one per round]} and {name: peak bytes}, the modes in turn each round."""
    for mode in modes:
        for _ in range(n_warmup):
            mode.step(batches)
    times, peaks = {mode.name: [] for mode in modes}, {}
    for _ in range(repeats):
        for mode in modes:
            seconds, peaks[mode.name] = time_mode(mode, batches, n_steps, rt)
            times[mode.name].append(seconds)
    return times, peaks


def print_modes(times, peaks, micro, flops):
    tokens = micro * accum_steps * seq_len
    print(f"\n| mode (eager) | micro-batch | tokens/s, median (min-max) of {repeats} alternating rounds | "
          f"TFLOP/s | ms per micro-batch | peak GiB |\n|---|---|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {micro} | {spread([tokens / t for t in seconds])} | {flops * tokens / np.median(seconds) / 1e12:.3g} "
              f"| {1e3 * np.median(seconds) / accum_steps:.1f} | {gib(peaks[name])} |")
    ratios = [n / o for n, o in zip(times[NormalMode.name], times[OffloadMode.name])]
    print(f"\noff-load / normal tokens/s: {spread(ratios, '{:.2f}')}x (per round)")


def step_optimizers(optimizers, n_steps):
    start = time.perf_counter()
    for _ in range(n_steps):
        for optimizer in optimizers:
            optimizer.step()
    return (time.perf_counter() - start) / n_steps


def time_host_adamw(trainer, n_steps):
    """Off-load mode's one fused AdamW per block against one AdamW over the same tensors."""
    trainer.synchronize()
    masters = [p for params in trainer.host.masters for p in params]
    for p in masters:
        p.grad.normal_()
    whole = torch.optim.AdamW(param_groups(trainer.host.blocks, 0.01), lr=1e-4, fused=True)
    whole.step()  # its state is allocated on the first step: not timed, as the per-block ones are warm
    times = alternate({"per block": lambda: step_optimizers(trainer.host.optimizers, n_steps),
                       "one over all": lambda: step_optimizers([whole], n_steps)}, repeats)
    n_params = sum(p.numel() for p in masters)
    print(f"host AdamW (fused, {len(trainer.host.optimizers)} blocks, {n_params / 1e6:.1f}M parameters, "
          f"{torch.get_num_threads()} threads), M parameters/s, median (min-max): per block "
          f"{spread([n_params / 1e6 / t for t in times['per block']])}, one AdamW over the same tensors "
          f"{spread([n_params / 1e6 / t for t in times['one over all']])}")
    torch._foreach_zero_([p.grad for p in masters])  # the accumulators are the trainer's again


def bus_bandwidth(rt):
    pinned = torch.empty(2 ** 28, dtype=torch.uint8).pin_memory()  # 256 MiB
    on_device = torch.empty_like(pinned, device=rt.device)
    seconds = []
    for _ in range(5):
        rt.synchronize()
        start = time.perf_counter()
        on_device.copy_(pinned, non_blocking=True)
        rt.synchronize()
        seconds.append(time.perf_counter() - start)
    print(f"pinned host-to-device copy of 256 MiB: {spread([pinned.numel() / t / 1e9 for t in seconds], '{:.1f}')} GB/s")


def capped_run(build, batches, n_steps, rt, micro):
    """tokens/s and peak of a mode built by build() and stepped under the cap, or 'out of memory'."""
    mode = None
    try:
        mode = build()
        seconds, peak = time_mode(mode, batches, n_steps, rt)
        return f"{micro * accum_steps * seq_len / seconds:,.0f} tokens/s, peak {gib(peak)} GiB"
    except torch.cuda.OutOfMemoryError:
        return "out of memory"
    finally:
        mode = None
        torch.cuda.empty_cache()


def main():
    rt = runtime.setup(device, dtype, compile=False)
    gpu = rt.device.type == "cuda"
    name = shape if shape != "auto" else ("reference" if gpu else "small")
    dims, micro = SHAPES[name], micro_batch or (128 if gpu else 32)
    n_steps, n_warmup = steps or (10 if gpu else 3), warmup_steps or (3 if gpu else 1)
    tokens, source = benchmark_tokens(data_dir, dims["vocab_size"], seq_len, seed)
    print(f"# off-load mode beside normal mode | {name} shape {dims['n_layers']}x{dims['d_model']} | {rt.describe()} | "
          f"torch {torch.__version__} | {accum_steps} micro-batches per step | data: {source} | {time.strftime('%Y-%m-%d')}")
    batches = RandomBatches(tokens, dims["vocab_size"], micro, rt, MASK_RATE, seed)
    torch.manual_seed(seed)
    offloaded = OffloadMode(dims, rt)
    times, peaks = compare_modes([NormalMode(dims, rt), offloaded], batches, n_steps, n_warmup, rt)
    flops = ModelConfig(seq_len=seq_len, **dims).flops_per_token(MASK_RATE)
    print_modes(times, peaks, micro, flops)
    time_host_adamw(offloaded.trainer, n_steps)
    if not gpu:
        return
    bus_bandwidth(rt)
    torch.cuda.empty_cache()  # the comparison's normal-mode model is gone: its memory goes back before the cap
    limit = cap * peaks[NormalMode.name]
    torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.get_device_properties(rt.device).total_memory)
    try:
        for mode_name, build in ((NormalMode.name, lambda: NormalMode(dims, rt)), (OffloadMode.name, lambda: offloaded)):
            result = capped_run(build, batches, n_steps, rt, micro)
            print(f"{mode_name} capped at {gib(limit)} GiB ({cap} of normal mode's peak): {result}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    process.guarded(main, "nothing to keep: a benchmark only prints")
