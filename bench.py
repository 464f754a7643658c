"""Throughput, MFU and memory of the training step, beside baselines timed in the same run.

    python bench.py                       # a GPU: the reference 16x768 shape; a CPU: the quickstart shape
    python bench.py --shape=reference --micro_batch=256 --sweep=False

Times train.py's own step (masking on the device, sparse prediction, autocast, torch.compile,
fused AdamW, all set up by runtime.py as in training) after warm-up, with the device
synchronised, for:
  crammed        our model with the paper's crammed recipe (model.py's defaults; train.py's smear
                 adds 1% of the reference shape's FLOPs), compiled and eager,
  original BERT  our model switched to the original recipe (config/bert_original.py),
  HF BERT        transformers' BertForMaskedLM of the same shape (SDPA attention), if installed;
then reports the ratios, the share of the device's own matmul speed that the step reaches (the
matmul shapes of the model timed alone in the same run: the practical ceiling), the cost of data
loading and masking, and tokens/s per micro-batch size up to the largest that fits (the search
train.py's micro_batch=0 uses).

offload=True adds off-load mode (train.py --offload=True, offload.py) beside normal mode, both
eager, timed in alternation (A B A B: a shared machine drifts), with the host AdamW's speed
(one fused AdamW per block, as off-load mode steps, against one over the same tensors); on a
GPU also the peak memory of each, the bandwidth of a pinned host-to-device copy, and both
modes run with the process capped (set_per_process_memory_fraction) at 0.3 of what
normal mode needs: normal mode runs out of memory there, off-load mode trains.

    python bench.py --offload=True --baselines=False --sweep=False

encode=<corpus> times data preparation instead: prepare.py's encoding pass against raw tiktoken.

    python bench.py --encode=books.txt.gz --data_dir=data/books --repeats=3
"""
import dataclasses
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn

import runtime
from configurator import read_config_file, configure
from data import get_batch, load_meta, load_tokenizer, load_tokens, mask_tokens
from model import CrammedBert, param_groups
from offload import OffloadTrainer
from train import MODEL_KEYS, train_step

# -----------------------------------------------------------------------------
shape = "auto"          # 'reference' (16x768, vocabulary 32768), 'small' (4x256, 8192); auto: by device
micro_batch = 0         # 0: 128 on a GPU, 32 on a CPU
accum_steps = 4         # micro-batches per optimizer step (training accumulates many)
steps = 0               # timed optimizer steps (0: 10 on a GPU, 3 on a CPU)
warmup_steps = 0        # untimed steps first, compilation included (0: 3 on a GPU, 1 on a CPU)
baselines = True        # time the original-BERT recipe and BertForMaskedLM too
sweep = True            # crammed tokens/s per micro-batch size (on a GPU up to the largest that fits)
data_dir = "data/pydocs"  # real tokens when its vocabulary matches the shape; random tokens otherwise
seq_len = 128
device = "auto"
dtype = "auto"          # as train.py: bfloat16 on a GPU, float32 on a CPU
compile = True          # as train.py; the crammed row is also timed eager, for the comparison
offload = False         # also time off-load mode against normal mode (both eager), interleaved
repeats = 3             # off-load comparison: alternating rounds of `steps` steps per mode
profile = False         # print the crammed step's 20 costliest kernels (torch.profiler over the timed steps)
peak_tflops = 0.0       # for MFU; 0 looks the GPU up by name
seed = 0
encode = ""             # instead: a corpus (file or folder) to time prepare.py's encoding pass on, against raw
                        # tiktoken on the same text and threads (data_dir's tokenizer; `repeats` rounds)
encode_chars = 0        # with encode: only the corpus' first documents up to this many characters (0: all)
# -----------------------------------------------------------------------------
SHAPES = {"reference": dict(n_layers=16, d_model=768, n_heads=12, d_ffn=3072, vocab_size=32768),
          "small": dict(n_layers=4, d_model=256, n_heads=4, d_ffn=1024, vocab_size=8192)}
N_SPECIAL = 4  # [PAD] [CLS] [SEP] [MASK] take the last ids
ORIGINAL_BERT = read_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "bert_original.py"))


class HFMaskedLM(nn.Module):
    """transformers' BertForMaskedLM behind our forward(inputs, positions, labels) signature.
    Dense prediction (its loss ignores the unmasked positions), dropout 0.1 as published."""

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


def recipes(dims):
    """name -> (model builder, mask rate, FLOPs per token), all of one shape."""
    bert_args = {k: v for k, v in ORIGINAL_BERT.items() if k in MODEL_KEYS}
    ours = dict(seq_len=seq_len, **dims)
    with torch.device("meta"):  # shapes only: counting FLOPs allocates nothing
        flops_crammed = CrammedBert(**ours).flops_per_token(0.25)
        flops_bert = CrammedBert(**ours, **bert_args).flops_per_token(ORIGINAL_BERT["mask_rate"])
    out = {"crammed": (lambda: CrammedBert(**ours), 0.25, flops_crammed)}
    if baselines:
        out["original BERT"] = (lambda: CrammedBert(**ours, **bert_args), ORIGINAL_BERT["mask_rate"], flops_bert)
        try:
            import transformers  # noqa: F401  (optional)
            out["HF BertForMaskedLM"] = (lambda: HFMaskedLM(**dims), ORIGINAL_BERT["mask_rate"], flops_bert)
        except ImportError:
            print("transformers is not installed: skipping the BertForMaskedLM baseline")
    return out


def token_source(vocab_size):
    """Prepared sequences when data_dir matches the shape, else random regular tokens."""
    try:
        meta = load_meta(data_dir)
        if meta["vocab_size"] == vocab_size and meta["seq_len"] == seq_len:
            return load_tokens(data_dir, "train", meta), data_dir
    except SystemExit:
        pass
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size - N_SPECIAL, (4096, seq_len)).astype(np.uint16), "random tokens"


def time_training(build, mask_rate, micro, tokens, rt, n_steps, n_warmup, compiled, profiled=False):
    """Seconds per optimizer step of train.py's step, the warm-up seconds (compilation included)
    and the peak memory (bytes; None on a CPU). profiled: print the costliest kernels too."""
    torch.manual_seed(seed)
    model = build().to(rt.device)
    optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12)
    scaler = rt.grad_scaler()
    fullgraph = isinstance(model, CrammedBert)  # ours must have no graph break; transformers' may
    step_model = dataclasses.replace(rt, compile=compiled).compile_model(model, fullgraph=fullgraph)
    vocab = model.args["vocab_size"] if hasattr(model, "args") else model.bert.config.vocab_size
    rng = np.random.default_rng(seed)

    def batch_at(micro_step):
        idx = get_batch(tokens, rng.integers(0, len(tokens), micro), rt.device)
        return mask_tokens(idx, mask_rate, vocab - 1, vocab - N_SPECIAL)

    def step():
        return train_step(step_model, optimizer, scaler, batch_at, accum_steps, 1e-4, 0.5, rt)[0]

    try:
        start = time.perf_counter()
        for _ in range(n_warmup):
            step()
        rt.synchronize()
        warmup_seconds = time.perf_counter() - start
        rt.reset_peak_memory()
        profiler = torch.profiler.profile() if profiled else nullcontext()
        with profiler:
            start = time.perf_counter()
            for _ in range(n_steps):
                loss = step()
            loss.item()
            rt.synchronize()
            seconds = (time.perf_counter() - start) / n_steps
        if profiled:
            key = "self_cpu_time_total" if rt.device.type == "cpu" else "self_device_time_total"
            print(profiler.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=60))
        return seconds, warmup_seconds, rt.peak_memory()
    finally:
        del model, optimizer, step_model
        if rt.device.type == "cuda":
            torch.cuda.empty_cache()


def matmul_flops_per_s(dims, micro, rt, repeats=0, rounds=3):
    """The device's own matmul speed at the model's shapes, in the run's precision: the
    blocks' four products for micro x seq_len tokens and the output layer for the predicted
    quarter of them, each timed alone (the fastest of `rounds`, as a ceiling should be) and
    weighted by how often a step does it."""
    n_tokens, d, ffn, vocab = micro * seq_len, dims["d_model"], dims["d_ffn"], dims["vocab_size"]
    shapes = [(n_tokens, d, 3 * d, dims["n_layers"]), (n_tokens, d, d, dims["n_layers"]),
              (n_tokens, d, ffn, dims["n_layers"]), (n_tokens, ffn // 2, d, dims["n_layers"]),
              (n_tokens // 4, d, vocab, 1)]
    repeats = repeats or (20 if rt.device.type == "cuda" else 5)
    total_flops = total_seconds = 0.0
    for m, k, n, count in shapes:
        a = torch.randn(m, k, device=rt.device, dtype=rt.dtype)
        b = torch.randn(k, n, device=rt.device, dtype=rt.dtype)
        out = torch.empty(m, n, device=rt.device, dtype=rt.dtype)
        torch.mm(a, b, out=out)  # warm-up: library handles, kernel choice, first touch of the memory
        best = float("inf")
        for _ in range(rounds):
            rt.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b, out=out)
            rt.synchronize()
            best = min(best, (time.perf_counter() - start) / repeats)
        total_seconds += count * best
        total_flops += count * 2 * m * k * n
    return total_flops / total_seconds


def time_data(tokens, micro, rt, vocab, n=20):
    """Seconds to load and mask one micro-batch, device synchronised."""
    rng = np.random.default_rng(seed)
    rt.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        mask_tokens(get_batch(tokens, rng.integers(0, len(tokens), micro), rt.device), 0.25, vocab - 1,
                    vocab - N_SPECIAL)
    rt.synchronize()
    return (time.perf_counter() - start) / n


def alternate(timers, n_repeats):
    """{name: [seconds per call, one per round]}, the timers called in turn each round (A B A B),
    so that a drifting machine slows all of them alike."""
    times = {name: [] for name in timers}
    for _ in range(n_repeats):
        for name, timer in timers.items():
            times[name].append(timer())
    return times


def spread(values, fmt="{:,.0f}"):
    """median (min-max)"""
    return f"{fmt.format(np.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def bench_offload(dims, micro, tokens, rt, n_steps, n_warmup):
    """Off-load mode beside normal mode (both eager, train.py's steps), the host AdamW per block
    against one fused AdamW over the same tensors, and on a GPU memory, bus bandwidth and a run
    capped at 0.3 of normal mode's memory."""
    rt = dataclasses.replace(rt, compile=False)
    gpu = rt.device.type == "cuda"
    ours = dict(seq_len=seq_len, **dims)
    rng = np.random.default_rng(seed)
    vocab = dims["vocab_size"]

    def batch_at(micro_step):
        idx = get_batch(tokens, rng.integers(0, len(tokens), micro), rt.device)
        return mask_tokens(idx, 0.25, vocab - 1, vocab - N_SPECIAL)

    torch.manual_seed(seed)
    model = CrammedBert(**ours).to(rt.device)
    optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12)
    scaler = rt.grad_scaler()
    trainer = OffloadTrainer(CrammedBert(**ours), rt, 1e-4, (0.9, 0.98), 1e-12, 0.01)
    steps = {"normal, eager": lambda: train_step(model, optimizer, scaler, batch_at, accum_steps, 1e-4, 0.5, rt)[0],
             "off-load": lambda: trainer.step(batch_at, accum_steps, 1e-4, 0.5)[0]}
    # the blocks' host updates run on past step(); a timing waits for them like the next step would
    finish = {"normal, eager": rt.synchronize, "off-load": lambda: (trainer.synchronize(), rt.synchronize())}
    peaks = {}

    def timer(name):
        def run():
            rt.reset_peak_memory()
            start = time.perf_counter()
            for _ in range(n_steps):
                loss = steps[name]()
            loss.item()
            finish[name]()
            peaks[name] = rt.peak_memory()
            return (time.perf_counter() - start) / n_steps
        return run

    for name in steps:  # warm-up
        for _ in range(n_warmup):
            steps[name]()
    times = alternate({name: timer(name) for name in steps}, repeats)
    flops = model.flops_per_token(0.25)
    print(f"\n| mode (eager) | micro-batch | tokens/s, median (min-max) of {repeats} alternating rounds | "
          f"TFLOP/s | ms per micro-batch | peak GiB |\n|---|---|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {micro} | {spread([micro * accum_steps * seq_len / t for t in seconds])} | "
              f"{flops * micro * accum_steps * seq_len / np.median(seconds) / 1e12:.3g} | "
              f"{1e3 * np.median(seconds) / accum_steps:.1f} | {gib(peaks[name])} |")
    ratios = [n / o for n, o in zip(times["normal, eager"], times["off-load"])]
    print(f"\noff-load / normal tokens/s: {spread(ratios, '{:.2f}')}x (per round)")

    # the host AdamW: off-load mode's one fused AdamW per block against one over all the blocks
    trainer.synchronize()
    masters = [p for params in trainer.masters for p in params]
    for p in masters:
        p.grad.normal_()
    whole = torch.optim.AdamW(param_groups(trainer.host_blocks, 0.01), lr=1e-4, fused=True)

    def adamw(optimizers):
        def run():
            start = time.perf_counter()
            for _ in range(n_steps):
                for o in optimizers:
                    o.step()
            return (time.perf_counter() - start) / n_steps
        return run
    n_params = sum(p.numel() for p in masters)
    whole.step()  # its state is allocated on the first step: not timed, as the per-block ones are warm
    times = alternate({"per block": adamw(trainer.block_optimizers), "one over all": adamw([whole])}, repeats)
    print(f"host AdamW (fused, {len(trainer.block_optimizers)} blocks, {n_params / 1e6:.1f}M parameters, "
          f"{torch.get_num_threads()} threads), M parameters/s, median (min-max): per block "
          f"{spread([n_params / 1e6 / t for t in times['per block']])}, one AdamW over the same tensors "
          f"{spread([n_params / 1e6 / t for t in times['one over all']])}")
    torch._foreach_zero_([p.grad for p in masters])  # the accumulators are the trainer's again
    if not gpu:
        return
    pinned = torch.empty(2 ** 28, dtype=torch.uint8).pin_memory()  # 256 MiB
    on_device = torch.empty_like(pinned, device=rt.device)
    seconds = []
    for _ in range(5):
        rt.synchronize()
        start = time.perf_counter()
        on_device.copy_(pinned, non_blocking=True)
        rt.synchronize()
        seconds.append(time.perf_counter() - start)
    bandwidth = spread([pinned.numel() / t / 1e9 for t in seconds], "{:.1f}")
    print(f"pinned host-to-device copy of 256 MiB: {bandwidth} GB/s")
    del model, optimizer, pinned, on_device
    torch.cuda.empty_cache()
    # both modes under a cap below a third of normal mode's peak: normal mode, built afresh under
    # it, runs out of memory; off-load mode trains
    cap = 0.3 * peaks["normal, eager"]
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(rt.device).total_memory)
    try:
        for name in steps:
            try:
                if name == "normal, eager":
                    model = CrammedBert(**ours).to(rt.device)
                    optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12)
                result = f"{micro * accum_steps * seq_len / timer(name)():,.0f} tokens/s, peak {gib(peaks[name])} GiB"
            except torch.cuda.OutOfMemoryError:
                result = "out of memory"
            finally:
                model = optimizer = None
                torch.cuda.empty_cache()
            print(f"{name} capped at {gib(cap)} GiB (0.3 of normal mode's peak): {result}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def bench_encoding(corpus):
    """prepare.py's encoding pass (reading and decompressing the corpus, its compression median,
    encoding, de-duplication hashing, writing the token files) against tiktoken's raw batch encoder
    over the same documents already in memory, on the same threads, in alternating rounds (A B A B)."""
    import shutil
    import tempfile

    import prepare
    enc = load_tokenizer(data_dir)
    meta = load_meta(data_dir)
    threads = os.cpu_count() or 1
    _, documents = prepare.document_source(corpus)

    def first_documents():
        chars = 0
        for text in documents():
            if encode_chars and chars >= encode_chars:
                return
            chars += len(text)
            yield text

    texts = list(first_documents())
    n_bytes = sum(len(t.encode()) for t in texts)

    def raw():  # at its best: 256 whole documents a call, however long (prepare.py also caps a batch at 4M characters)
        start = time.perf_counter()
        for i in range(0, len(texts), 256):
            enc.encode_ordinary_batch(texts[i:i + 256], num_threads=threads)
        return time.perf_counter() - start

    def encoding_pass():
        out = tempfile.mkdtemp()
        try:
            start = time.perf_counter()
            median = prepare.median_tokens_per_char(first_documents, enc)
            prepare.encode_corpus(first_documents, enc, meta["special_ids"], meta["dtype"],
                                  prepare.max_compression * median, out, workers=threads)
            return time.perf_counter() - start
        finally:
            shutil.rmtree(out)

    print(f"# {corpus}: {len(texts):,} documents, {n_bytes / 1e6:,.1f} MB of text | {data_dir}'s tokenizer "
          f"({enc.n_vocab} tokens) | {threads} threads | {time.strftime('%Y-%m-%d')}")
    times = alternate({"raw tiktoken": raw, "prepare.py's encoding pass": encoding_pass}, repeats)
    print(f"\n| | MB/s, median (min-max) of {repeats} alternating rounds |\n|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {spread([n_bytes / 1e6 / t for t in seconds], '{:.1f}')} |")
    ratios = [r / p for r, p in zip(times["raw tiktoken"], times["prepare.py's encoding pass"])]
    print(f"\nthe pass at {spread([100 * r for r in ratios], '{:.0f}%')} of raw tiktoken's speed (per round)")


def gib(memory):
    return f"{memory / 2 ** 30:.1f}" if memory is not None else "-"


def row(name, micro, seconds, warmup_seconds, memory, flops, peak, matmul_peak):
    tokens_per_s = micro * accum_steps * seq_len / seconds
    achieved = flops * tokens_per_s
    mfu = f"{100 * achieved / peak:.1f}%" if peak else "-"
    return tokens_per_s, (f"| {name} | {micro} | {tokens_per_s:,.0f} | {1e3 * seconds / accum_steps:.1f} | "
                          f"{warmup_seconds:.1f} | {gib(memory)} | {flops / 1e9:.3f} | {achieved / 1e12:.3f} | "
                          f"{100 * achieved / matmul_peak:.0f}% | {mfu} |")


def main():
    if encode:
        return bench_encoding(encode)
    rt = runtime.setup(device, dtype, compile)
    gpu = rt.device.type == "cuda"
    name = shape if shape != "auto" else ("reference" if gpu else "small")
    if name not in SHAPES:
        raise SystemExit(f"error: unknown shape '{name}' ({', '.join(SHAPES)})")
    dims = SHAPES[name]
    micro = micro_batch or (128 if gpu else 32)
    n_steps = steps or (10 if gpu else 3)
    n_warmup = warmup_steps or (3 if gpu else 1)
    peak = runtime.peak_flops(rt.device, peak_tflops * 1e12)
    tokens, source = token_source(dims["vocab_size"])
    print(f"# {name} shape {dims['n_layers']}x{dims['d_model']}, vocabulary {dims['vocab_size']}, seq {seq_len} | "
          f"{rt.describe()} | torch {torch.__version__} | {torch.get_num_threads()} CPU threads | "
          f"{accum_steps} micro-batches per step | data: {source} | {time.strftime('%Y-%m-%d')}\n")
    matmul_peak = matmul_flops_per_s(dims, micro, rt)
    print(f"measured matmul speed at the model's shapes: {matmul_peak / 1e12:.3f} TFLOP/s"
          f"{f' ({100 * matmul_peak / peak:.0f}% of the vendor peak)' if peak else ''}\n")

    print("| recipe | micro-batch | tokens/s | ms per micro-batch | warm-up s | peak GiB | GFLOP/token | TFLOP/s "
          "| of measured matmul speed | MFU |\n|---|---|---|---|---|---|---|---|---|---|")
    runs = [(recipe, build, mask_rate, flops, rt.compile) for recipe, (build, mask_rate, flops) in recipes(dims).items()]
    if rt.compile:  # the crammed recipe eager too: what compilation buys on this device
        runs.insert(1, ("crammed, eager", *runs[0][1:4], False))
    speeds, crammed_seconds = {}, None
    for recipe, build, mask_rate, flops, compiled in runs:
        seconds, warmup_seconds, memory = time_training(build, mask_rate, micro, tokens, rt, n_steps, n_warmup, compiled,
                                                        profiled=profile and recipe == "crammed")
        speeds[recipe], line = row(recipe, micro, seconds, warmup_seconds, memory, flops, peak, matmul_peak)
        crammed_seconds = crammed_seconds or seconds
        print(line, flush=True)
    for recipe in list(speeds)[1:]:
        print(f"\ncrammed / {recipe}: {speeds['crammed'] / speeds[recipe]:.2f}x tokens/s", end="")
    data_seconds = time_data(tokens, micro, rt, dims["vocab_size"])
    print(f"\ndata loading + masking: {1e3 * data_seconds:.2f} ms per micro-batch, "
          f"{100 * data_seconds * accum_steps / crammed_seconds:.1f}% of the crammed step if not overlapped")

    if offload:
        bench_offload(dims, micro, tokens, rt, n_steps, n_warmup)

    if sweep:
        # eager, as train.py's micro_batch=0 probe: a compilation per size would take minutes
        print("\n| crammed micro-batch (eager) | tokens/s | peak GiB |\n|---|---|---|")
        build, _, flops = recipes(dims)["crammed"]

        def peak_bytes(size):
            seconds, _, memory = time_training(build, 0.25, size, tokens, rt, max(2, n_steps // 2), n_warmup, False)
            print(f"| {size} | {size * accum_steps * seq_len / seconds:,.0f} | {gib(memory)} |", flush=True)
            return memory or 0

        capacity = runtime.free_device_memory(rt) if gpu else float("inf")
        largest, tried = runtime.largest_micro_batch(peak_bytes, capacity, 8192 if gpu else 64)
        if gpu:
            out_of_memory = [size for size, peak_memory in tried.items() if peak_memory is None]
            print(f"\nlargest micro-batch within 90% of the free GPU memory: {largest} (what train.py's "
                  f"micro_batch=0 picks){f'; {out_of_memory[0]} ran out of memory' if out_of_memory else ''}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
