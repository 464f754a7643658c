"""Throughput, MFU and memory of the training step, beside baselines timed in the same run.

    python bench.py                       # a GPU: the reference 16x768 shape; a CPU: the quickstart shape
    python bench.py --shape=reference --micro_batch=256 --sweep=False
    python bench.py --shape=cpu --data_dir=data/books32k --baselines=False   # the CPU recipe's shape

Times train.py's step (its model, trainer and compilation; its own micro-batch, 128 by default where training probes for
the largest, random rows, and each step timed to the device's end) after warm-up for train.py's recipe (crammed,
compiled and eager), the original BERT's (config/bert_original.py) and transformers' BertForMaskedLM of the same shape,
if installed; then the ratios, the share of the device's matmul speed at the model's shapes, data loading's cost and
tokens/s per micro-batch up to the largest that fits. Off-load mode and data preparation: tools/bench_offload.py,
tools/bench_prepare.py."""
import dataclasses
import functools
import gc
import os
import re
import sys
import time
from contextlib import nullcontext

from configurator import configure, read_config_file  # first: it checks for the temporary folder torch's import needs
import torch

from cram import memory, process, runtime
from cram.data import RandomBatches, benchmark_tokens
from cram.files import gib
from model import MASK_RATE, SHAPES, CrammedBert, ModelConfig, Trainer, param_groups

# -----------------------------------------------------------------------------
shape = "auto"          # {auto, reference, small, cpu}: model.SHAPES' or train_cpu.py's; auto: reference on a GPU
micro_batch = 0         # >= 0: if 0, 128 on a GPU and 32 on a CPU
accum_steps = 4         # >= 1: micro-batches per optimizer step (training accumulates many)
steps = 0               # >= 0: timed optimizer steps (0: 10 on a GPU, 3 on a CPU)
warmup_steps = 0        # >= 0: untimed steps first, compilation included (0: 3 on a GPU, 1 on a CPU)
baselines = True        # time the original-BERT recipe and BertForMaskedLM too
full_layers = ""        # e.g. '2,4': also time the crammed model with its later layers narrowed after these many
sweep = True            # crammed tokens/s per micro-batch size (on a GPU up to the largest that fits)
data_dir = "data/pydocs"  # real tokens when its vocabulary matches the shape; random tokens otherwise
seq_len = 128           # >= 2
device = "auto"
dtype = "auto"          # {auto, float32, bfloat16, float16}: as train.py
compile = True          # as train.py; the crammed row is also timed eager, for the comparison (unless eager=False)
eager = True            # with compile: also time the crammed row eager
compile_mode = "default"  # torch.compile's mode, or several (a,b): the crammed row timed in each, the baselines in one
profile = False         # print the crammed step's 20 costliest kernels and its time by kind of kernel (torch.profiler)
peak_tflops = 0.0       # >= 0: for MFU; 0 looks the GPU up by name
seed = 0                # [0, 4294967295]
# -----------------------------------------------------------------------------
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
ORIGINAL_BERT = read_config_file(os.path.join(CONFIG_DIR, "bert_original.py"))
CPU_RECIPE_VOCAB = 32768  # config/train_cpu.py's data is prepared with --vocab_size=32768 (its header)
# the profile's kinds of kernel by name, the first match wins: inductor's fused kernels (triton_tem_*: its matmuls),
# then attention before matmuls (some are CUTLASS's; batched products are only model.attend's); the rest.
KERNEL_KINDS = [("fused element-wise", r"cpp_fused|triton_(poi|red|per)"),
                ("attention", r"attention|flash|fmha|sdpa|aten::(bmm|baddbmm)$"),
                ("matmuls", r"aten::(mm|addmm)$|gemm|nvjet|xmma|cutlass|triton_tem"),
                ("optimizer", r"(?i)adam|optimizer")]


def shape_dims(name):
    """A named shape's size fields: model.SHAPES', or 'cpu': config/train_cpu.py's (read: it follows the recipe)."""
    if name != "cpu":
        return SHAPES[name]
    recipe = read_config_file(os.path.join(CONFIG_DIR, "train_cpu.py"))
    return dict({k: recipe[k] for k in SHAPES["small"] if k != "vocab_size"}, vocab_size=CPU_RECIPE_VOCAB)


class HFMaskedLM(torch.nn.Module):
    """transformers' BertForMaskedLM behind our forward(inputs, positions, labels): dense prediction, dropout 0.1."""

    def __init__(self, vocab_size, n_layers, d_model, n_heads, d_ffn):
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM
        config = BertConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=n_layers,
                            num_attention_heads=n_heads, intermediate_size=d_ffn, max_position_embeddings=seq_len)
        config._attn_implementation = "sdpa"
        self.bert = BertForMaskedLM(config)

    def forward(self, inputs, positions, labels):
        targets = torch.full_like(inputs, -100).scatter(1, positions, labels)
        loss = self.bert(input_ids=inputs, labels=targets).loss
        return loss, loss.new_zeros((), dtype=torch.long)


def narrowed_after(text, n_layers):
    """--full_layers' numbers of full layers, each from 1 to n_layers - 1 (else a one-line error)."""
    values = [n.strip() for n in text.split(",") if n.strip()]
    wrong = [n for n in values if not n.isdigit() or not 0 < int(n) < n_layers]
    if wrong:
        raise SystemExit(f"error: --full_layers={text}: {', '.join(wrong)} is not a number of full layers from 1 to "
                         f"{n_layers - 1} (this shape has {n_layers})")
    return [int(n) for n in values]


def recipes(dims, narrowed):
    """name -> (model builder, mask rate, FLOPs per token) of one shape, crammed ones `narrowed` too (--full_layers)."""
    bert_args = {k: v for k, v in ORIGINAL_BERT.items() if k in ModelConfig.__dataclass_fields__}
    ours = dict(seq_len=seq_len, **dims)
    flops_bert = ModelConfig(**ours, **bert_args).flops_per_token(ORIGINAL_BERT["mask_rate"])
    out = {"crammed": (lambda: CrammedBert(**ours), MASK_RATE, ModelConfig(**ours).flops_per_token(MASK_RATE))}
    for n in narrowed:
        flops = ModelConfig(**ours, full_layers=n).flops_per_token(MASK_RATE)
        out[f"crammed, {n} full layers"] = (functools.partial(CrammedBert, **ours, full_layers=n), MASK_RATE, flops)
    if baselines:
        out["original BERT"] = (lambda: CrammedBert(**ours, **bert_args), ORIGINAL_BERT["mask_rate"], flops_bert)
        if process.installed("transformers"):  # optional
            out["HF BertForMaskedLM"] = (lambda: HFMaskedLM(**dims), ORIGINAL_BERT["mask_rate"], flops_bert)
        else:
            print("transformers is not installed: skipping the BertForMaskedLM baseline")
    return out


def time_training(build, mask_rate, micro, tokens, rt, n_steps, n_warmup, profiled=False):
    """Seconds per optimizer step of train.py's step, compiled as rt says, the warm-up seconds (compilation included)
    and the peak memory (bytes; None on a CPU). profiled: print the costliest kernels too."""
    torch.manual_seed(seed)
    model = build().to(rt.device)
    optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12)
    step_model = rt.compile_model(model, fullgraph=isinstance(model, CrammedBert))  # transformers' may break the graph
    vocab = model.config.vocab_size if isinstance(model, CrammedBert) else model.bert.config.vocab_size
    batches = RandomBatches(tokens, vocab, micro, rt, mask_rate, seed)
    trainer = Trainer(model, optimizer, rt.grad_scaler(), step_model, rt.autocast)
    step = lambda: trainer.step(batches(accum_steps), 1e-4, 0.5)  # an optimizer step: backward and update, as train.py's loop runs them
    try:
        warmup_seconds = n_warmup * runtime.best_seconds(step, rt, n_warmup, rounds=1)  # compilation included
        rt.reset_peak_memory()
        profiler = torch.profiler.profile() if profiled else nullcontext()
        with profiler:
            seconds = runtime.best_seconds(step, rt, n_steps, rounds=1)
        if profiled:
            events = profiler.key_averages()
            key = "self_cpu_time_total" if rt.device.type == "cpu" else "self_device_time_total"
            print(events.table(sort_by=key, row_limit=20, max_name_column_width=60))
            print(time_by_kind(events, rt.device.type, n_steps * accum_steps))
        return seconds, warmup_seconds, rt.peak_memory()
    finally:
        del model, optimizer, step_model, trainer, step
        torch._dynamo.reset()  # the next row (another mode) starts with no graphs, CUDA-graph pools or caches held
        gc.collect()
        torch.cuda.empty_cache()  # (nothing unless CUDA is in use)


def time_by_kind(events, device_type, micro_batches):
    """A profile's self time by KERNEL_KINDS per micro-batch: a GPU's kernels', a CPU's ops' (adding up to the step)."""
    on_device = device_type != "cpu"
    totals = dict.fromkeys([kind for kind, _ in KERNEL_KINDS] + ["the rest"], 0.0)
    for e in events:
        if (e.device_type == torch.autograd.DeviceType.CUDA) == on_device:
            kind = next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, e.key)), "the rest")
            totals[kind] += e.self_device_time_total if on_device else e.self_cpu_time_total
    whole = sum(totals.values()) or 1.0
    return "time by kind, ms per micro-batch: " + ", ".join(
        f"{kind} {us / 1e3 / micro_batches:.1f} ({100 * us / whole:.0f}%)" for kind, us in totals.items())


def matmul_flops_per_s(dims, micro, rt):
    """The device's matmul speed at the model's shapes and precision: the blocks' four products and the output layer's
    (at MASK_RATE), each timed alone (the fastest of 3 rounds) and weighted by how often a step does it."""
    n_tokens, d, ffn = micro * seq_len, dims["d_model"], dims["d_ffn"]
    shapes = [(n_tokens, k, n, dims["n_layers"]) for k, n in ((d, 3 * d), (d, d), (d, ffn), (ffn // 2, d))]
    shapes.append((round(MASK_RATE * n_tokens), d, dims["vocab_size"], 1))  # (m, k, n, how often a step does it)
    repeats, total_flops, total_seconds = (20 if rt.device.type == "cuda" else 5), 0.0, 0.0
    for m, k, n, count in shapes:
        a, b = (torch.randn(*shape, device=rt.device, dtype=rt.dtype) for shape in ((m, k), (k, n)))
        out = torch.empty(m, n, device=rt.device, dtype=rt.dtype)
        torch.mm(a, b, out=out)  # warm-up: library handles, kernel choice, first touch of the memory
        total_seconds += count * runtime.best_seconds(functools.partial(torch.mm, a, b, out=out), rt, repeats, rounds=3)
        total_flops += count * 2 * m * k * n
    return total_flops / total_seconds


def row(name, micro, seconds, warmup_seconds, held, flops, peak, matmul_peak):
    tokens_per_s = micro * accum_steps * seq_len / seconds
    achieved = flops * tokens_per_s
    mfu = f"{100 * achieved / peak:.1f}%" if peak else "-"
    return tokens_per_s, (f"| {name} | {micro} | {tokens_per_s:,.0f} | {1e3 * seconds / accum_steps:.1f} | "
                          f"{warmup_seconds:.1f} | {gib(held)} | {flops / 1e9:.3f} | {achieved / 1e12:.3f} | "
                          f"{100 * achieved / matmul_peak:.0f}% | {mfu} |")


def main():
    modes = [m.strip() for m in compile_mode.split(",") if m.strip()] or ["default"]
    if profile:  # inductor's CPU kernels recorded by name, or the profile shows only the graph that calls them
        from torch._inductor import config as inductor_config  # (torch 2.4 does not import it with torch)
        inductor_config.cpp.enable_kernel_profile = True
    rt = runtime.setup(device, dtype, compile, compile_mode=modes[0])
    for mode in modes[1:]:
        runtime.check_compile_mode(mode, rt.device)
    if len(modes) > 1 and not compile:
        raise SystemExit(f"error: --compile_mode={compile_mode} names modes to time, but --compile=False")
    gpu = rt.device.type == "cuda"
    name = shape if shape != "auto" else ("reference" if gpu else "small")
    dims = shape_dims(name)
    narrowed = narrowed_after(full_layers, dims["n_layers"])  # a bad --full_layers fails now, not after the timings
    micro = micro_batch or (128 if gpu else 32)
    n_steps, n_warmup = steps or (10 if gpu else 3), warmup_steps or (3 if gpu else 1)
    peak = runtime.peak_flops(rt.device, peak_tflops * 1e12)
    memory.check_memory(ModelConfig(**dims, seq_len=seq_len), rt, MASK_RATE, (micro, f"--micro_batch={micro}"))
    tokens, source = benchmark_tokens(data_dir, dims["vocab_size"], seq_len, seed)
    print(f"# {name} shape {dims['n_layers']}x{dims['d_model']}, vocabulary {dims['vocab_size']}, seq {seq_len} | "
          f"{rt.describe()} | torch {torch.__version__} | {torch.get_num_threads()} CPU threads | "
          f"{accum_steps} micro-batches per step | data: {source} | {time.strftime('%Y-%m-%d')}\n")
    matmul_peak = matmul_flops_per_s(dims, micro, rt)
    print(f"measured matmul speed at the model's shapes: {matmul_peak / 1e12:.3f} TFLOP/s"
          f"{f' ({100 * matmul_peak / peak:.0f}% of the vendor peak)' if peak else ''}\n")

    print("| recipe | micro-batch | tokens/s | ms per micro-batch | warm-up s | peak GiB | GFLOP/token | TFLOP/s "
          "| of measured matmul speed | MFU |\n|---|---|---|---|---|---|---|---|---|---|")
    eager_rt = dataclasses.replace(rt, compile=False)
    built = recipes(dims, narrowed)
    runs = [(recipe, build, mask_rate, flops, rt) for recipe, (build, mask_rate, flops) in built.items()]
    if rt.compile:  # the crammed recipe in the other modes and eager: what each buys on this device
        crammed = runs[0][1:4]
        runs[1:1] = [(f"crammed, {mode}", *crammed, dataclasses.replace(rt, compile_mode=mode)) for mode in modes[1:]]
        if eager:
            runs.insert(len(modes), ("crammed, eager", *crammed, eager_rt))
    speeds = {}  # recipe -> tokens/s
    for recipe, build, mask_rate, flops, run_rt in runs:
        try:
            seconds, warmup_seconds, held = time_training(build, mask_rate, micro, tokens, run_rt, n_steps, n_warmup,
                                                            profiled=profile and recipe == "crammed")
        except torch.cuda.OutOfMemoryError:  # a baseline's dense logits can need far more than the crammed step
            if recipe == "crammed":
                raise SystemExit(f"error: the crammed step at --micro_batch={micro} ran out of GPU memory: give a "
                                 f"smaller --micro_batch") from None
            print(f"| {recipe} | {micro} | out of GPU memory |", flush=True)
            torch.cuda.empty_cache()
            continue
        speeds[recipe], line = row(recipe, micro, seconds, warmup_seconds, held, flops, peak, matmul_peak)
        print(line, flush=True)
    for recipe in list(speeds)[1:]:
        print(f"\ncrammed / {recipe}: {speeds['crammed'] / speeds[recipe]:.2f}x tokens/s", end="")
    batches = RandomBatches(tokens, dims["vocab_size"], micro, rt, MASK_RATE, seed)
    data_seconds = runtime.best_seconds(functools.partial(batches, 1), rt, 20, rounds=1)  # load and mask a micro-batch
    print(f"\ndata loading + masking: {1e3 * data_seconds:.2f} ms per micro-batch, "
          f"{100 * data_seconds * speeds['crammed'] / (micro * seq_len):.1f}% of the crammed step if not overlapped")

    if sweep:
        # eager, as train.py's micro_batch=0 probe: a compilation per size would take minutes
        print("\n| crammed micro-batch (eager) | tokens/s | peak GiB |\n|---|---|---|")
        build = built["crammed"][0]

        def peak_bytes(size):
            seconds, _, held = time_training(build, MASK_RATE, size, tokens, eager_rt, max(2, n_steps // 2), n_warmup)
            print(f"| {size} | {size * accum_steps * seq_len / seconds:,.0f} | {gib(held)} |", flush=True)
            return held or 0

        capacity = memory.free_device_memory(rt) if gpu else float("inf")
        largest, tried = memory.largest_micro_batch(peak_bytes, capacity, 8192 if gpu else 64)
        if gpu:
            out_of_memory = [size for size, peak_memory in tried.items() if peak_memory is None]
            print(f"\nlargest micro-batch within 90% of the free GPU memory: {largest} (what train.py's "
                  f"micro_batch=0 picks){f'; {out_of_memory[0]} ran out of memory' if out_of_memory else ''}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    process.guarded(main, "nothing to keep: a benchmark only prints")
