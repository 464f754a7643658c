"""The memory a run needs against the memory it has, before any work: a one-line error for a step that surely cannot
fit (check_memory, by lower estimates), and the micro-batch (choose_micro_batch: a GPU's largest that fits, probed)."""
import contextlib
import os

import torch
import torch.distributed as dist

from .data import RandomBatches, random_tokens
from .files import size_text
from .runtime import cgroup_folders
from model import OPTIMIZERS, CrammedBert, ModelConfig, Trainer, param_groups


def free_device_memory(rt):
    """Bytes this process could use on its GPU: what is free plus what its allocator holds."""
    free, _ = torch.cuda.mem_get_info(rt.device)
    return free + torch.cuda.memory_reserved(rt.device)


def largest_micro_batch(peak_bytes, capacity, largest, margin=0.1, smallest=8):
    """(the largest power of two from `smallest` up to `largest` whose peak_bytes(size), a step's, stays under (1 - margin)
    of `capacity`, {size: its peak bytes, None where torch.cuda.OutOfMemoryError})."""
    smallest = min(smallest, 1 << (largest.bit_length() - 1))
    tried, best, size = {}, None, smallest
    while size <= largest:
        try:
            tried[size] = peak_bytes(size)
        except torch.cuda.OutOfMemoryError:
            tried[size] = None
            break
        if tried[size] > (1 - margin) * capacity:
            break
        best, size = size, size * 2
    if best is None:
        raise SystemExit(f"error: not even a micro-batch of {smallest} sequences fits in "
                         f"{(1 - margin) * capacity / 2 ** 30:.1f} GiB; use a smaller model or a larger GPU")
    return best, tried


def probe_micro_batch(model_args, rt, largest, mask_rate):
    """largest_micro_batch's answer on the GPU, by a throwaway model of the shape, its optimizer and one eager step per
    size (eager keeps at least a compiled step's activations)."""
    scaler, model = rt.grad_scaler(), CrammedBert(**model_args).to(rt.device)
    optimizer, vocab = rt.optimizer(param_groups(model, 0.0, rt.optim), lr=0.0), model.config.vocab_size

    def peak_bytes(size):  # the peak device bytes of one eager training step at micro-batch `size` (random tokens)
        batches = RandomBatches(random_tokens(vocab, model.config.seq_len), vocab, size, rt, mask_rate)(1)
        rt.reset_peak_memory()
        Trainer(model, optimizer, scaler, autocast=rt.autocast).step(batches, 0.0, 1.0)
        rt.synchronize()
        return rt.peak_memory()

    try:
        return largest_micro_batch(peak_bytes, free_device_memory(rt), largest)
    finally:
        del model, optimizer
        torch.cuda.empty_cache()
        rt.reset_peak_memory()  # the training log reports training's own peak


def memory_capacity(device, cgroup="/sys/fs/cgroup", own="/proc/self/cgroup"):
    """Bytes a run can hold: a GPU's memory; on a CPU the host's physical memory or a lower limit: its cgroups' (v2's
    memory.max, v1's memory.limit_in_bytes) or its own (ulimit -v, -d, h_vmem); None where unknown (Windows)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        import resource  # POSIX's, as sysconf
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError, ImportError):
        return None
    for soft, _ in map(resource.getrlimit, (resource.RLIMIT_AS, resource.RLIMIT_DATA)):
        total = total if soft == resource.RLIM_INFINITY else min(total, soft)
    for folder in cgroup_folders("memory", cgroup, own):
        for name in ("memory.max", "memory.limit_in_bytes"):  # a file that cannot be read holds no limit
            with contextlib.suppress(OSError), open(os.path.join(folder, name), encoding="utf-8") as f:
                limit = f.read().strip()
                total = min(total, int(limit)) if limit.isdigit() else total
    return total


def least_bytes(config, rt, mask_rate, training=True, offload=False):
    """check_memory's lower estimates: (weights, gradients and the optimizer's state_bytes; a sequence's activations)."""
    value_bytes = 4 if rt.dtype == torch.float32 else 2
    state_bytes = 8 + OPTIMIZERS[rt.optim].state_bytes
    return state_bytes * config.parameters_at_least(), config.step_bytes(mask_rate, value_bytes, training, offload)


def check_memory(config, rt, mask_rate, micro, batch=(0, ""), training=True, offload=False, capacity=None):
    """A one-line error for a step that surely cannot fit `capacity` (memory_capacity's; docs/training.md): least_bytes'
    and the token ids, 12 bytes a position. micro, batch: (sequences, what chose them: '--micro_batch=32'); the error
    names that (or the shape) and the largest that fits."""
    (micro, micro_name), (batch, batch_name) = micro, batch
    capacity = capacity or memory_capacity(rt.device)
    if not capacity:
        return
    params, where = config.parameters_at_least(), f"this {'GPU' if rt.device.type == 'cuda' else 'machine'}'s"
    model_bytes, per_sequence = least_bytes(config, rt, mask_rate, training, offload)
    state, ids = model_bytes * (not offload), 12 * config.seq_len * batch
    fix = "choose a smaller --n_layers or --d_model" + ", or --offload=True" * (rt.device.type == "cuda" and not offload)
    host = memory_capacity(torch.device("cpu")) if offload else None
    if host and model_bytes > host:  # off-load's masters and AdamW state live in host memory
        state, where, capacity = model_bytes, "the host's", host
    if state + per_sequence > capacity:
        raise SystemExit(f"error: a model of {config.n_layers} x {config.d_model} ({params / 1e6:,.0f}M parameters) "
                         f"needs at least {size_text(state + per_sequence)} for its weights, gradients and --optim={rt.optim} state "
                         f"and one sequence, more than {where} {size_text(capacity)}: {fix}")
    if state + per_sequence + ids > capacity:
        largest = (capacity - state - per_sequence) // (12 * config.seq_len)
        raise SystemExit(f"error: {batch_name} needs at least {size_text(state + per_sequence + ids)} (its "
                         f"token ids, the model and one sequence's activations), more than {where} "
                         f"{size_text(capacity)}: the largest that fits is about {largest:,}")
    if state + per_sequence * micro + ids > capacity:
        largest = (capacity - state - ids) // per_sequence
        raise SystemExit(f"error: {micro_name} needs at least {size_text(state + per_sequence * micro + ids)} "
                         f"({size_text(per_sequence)} of activations a sequence, and the model), more than {where} "
                         f"{size_text(capacity)}: the largest that fits is about {largest:,}")


def choose_micro_batch(micro_batch, batch_size, model_args, rt, *, world, mask_rate, offload, log):
    """The micro-batch cap setup.split_micro_batches splits every batch by: micro_batch, or if 0 a GPU's largest power of
    two that fits (the probe; under torchrun the ranks' smallest), else 32 or a process's share; check_memory first."""
    probe = not (micro_batch or rt.device.type != "cuda" or offload)  # the probe measures normal mode
    chosen = micro_batch or (1 if probe else min(32, batch_size // world))
    name = f"--micro_batch={chosen}" if micro_batch else \
        f"a micro-batch of {chosen} (micro_batch=0 {'in off-load mode' if offload else 'on a CPU'})"
    check_memory(ModelConfig(**model_args), rt, mask_rate, (chosen, name), (batch_size // world, f"--batch_size={batch_size}"),
                 offload=offload)
    if not probe:
        return chosen
    chosen, tried = probe_micro_batch(model_args, rt, batch_size // world, mask_rate)
    if world > 1:
        t = torch.tensor([chosen], device=rt.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        chosen = int(t.item())
    peaks = ", ".join(f"{s}: {b / 2 ** 30:.1f}" if b else f"{s}: out of memory" for s, b in tried.items())
    log(f"micro_batch=0: chose {chosen}, the largest power of two within 90% of the GPU's free memory "
        f"(peak GiB by size: {peaks})")
    return chosen
