"""Throughput, MFU and memory of the training step, beside baselines timed in the same run.

    python bench.py                       # a GPU: the reference 16x768 shape; a CPU: the quickstart shape
    python bench.py --shape=reference --micro_batch=256 --sweep=False

Times train.py's own step (masking on the device, sparse prediction, bf16 autocast and
torch.compile on a GPU, AdamW) after warm-up, with the device synchronised, for:
  crammed        our model with the crammed recipe (the defaults),
  original BERT  our model switched to the original recipe (config/bert_original.py),
  HF BERT        transformers' BertForMaskedLM of the same shape (SDPA attention), if installed;
then reports the ratios, the cost of data loading and masking, and tokens/s per micro-batch
size up to the largest that fits in GPU memory.
"""
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn

from configurator import read_config_file, configure
from data import get_batch, load_meta, load_tokens, mask_tokens
from model import CrammedBert, param_groups, peak_flops
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
compile = True          # torch.compile on a GPU, as train.py
peak_tflops = 0.0       # for MFU; 0 looks the GPU up by name
seed = 0
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


def synchronize(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_training(build, mask_rate, micro, tokens, dev, n_steps, n_warmup):
    """Seconds per optimizer step of train.py's step, and the peak memory (GiB, GPU only)."""
    torch.manual_seed(seed)
    model = build().to(dev)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), eps=1e-12,
                                  fused=dev.type == "cuda")
    step_model = torch.compile(model) if compile and dev.type == "cuda" else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext()
    vocab = model.args["vocab_size"] if hasattr(model, "args") else model.bert.config.vocab_size
    rng = np.random.default_rng(seed)

    def next_batch():
        return get_batch(tokens, rng.integers(0, len(tokens), micro), dev)

    def mask(idx):
        return mask_tokens(idx, mask_rate, vocab - 1, vocab - N_SPECIAL)

    try:
        for _ in range(n_warmup):
            train_step(step_model, optimizer, next_batch, accum_steps, 1e-4, mask, autocast, 0.5)
        synchronize(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        start = time.perf_counter()
        for _ in range(n_steps):
            loss = train_step(step_model, optimizer, next_batch, accum_steps, 1e-4, mask, autocast, 0.5)
        loss.item()
        synchronize(dev)
        seconds = (time.perf_counter() - start) / n_steps
        memory = torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else None
        return seconds, memory
    finally:
        del model, optimizer, step_model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def time_data(tokens, micro, dev, vocab, n=20):
    """Seconds to load and mask one micro-batch, device synchronised."""
    rng = np.random.default_rng(seed)
    synchronize(dev)
    start = time.perf_counter()
    for _ in range(n):
        mask_tokens(get_batch(tokens, rng.integers(0, len(tokens), micro), dev), 0.25, vocab - 1, vocab - N_SPECIAL)
    synchronize(dev)
    return (time.perf_counter() - start) / n


def row(name, micro, seconds, memory, flops, peak):
    tokens_per_s = micro * accum_steps * seq_len / seconds
    tflops = flops * tokens_per_s / 1e12
    mfu = f"{100 * tflops * 1e12 / peak:.1f}%" if peak else "-"
    memory = f"{memory:.1f}" if memory is not None else "-"
    return tokens_per_s, (f"| {name} | {micro} | {tokens_per_s:,.0f} | {1e3 * seconds / accum_steps:.1f} | {memory} | "
                          f"{flops / 1e9:.3f} | {tflops:.2f} | {mfu} |")


def main():
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    name = shape if shape != "auto" else ("reference" if dev.type == "cuda" else "small")
    if name not in SHAPES:
        raise SystemExit(f"error: unknown shape '{name}' ({', '.join(SHAPES)})")
    dims = SHAPES[name]
    micro = micro_batch or (128 if dev.type == "cuda" else 32)
    n_steps = steps or (10 if dev.type == "cuda" else 3)
    n_warmup = warmup_steps or (3 if dev.type == "cuda" else 1)
    peak = peak_flops(dev, peak_tflops * 1e12)
    tokens, source = token_source(dims["vocab_size"])
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"# {name} shape {dims['n_layers']}x{dims['d_model']}, vocabulary {dims['vocab_size']}, seq {seq_len} | "
          f"{gpu}, torch {torch.__version__}, {'bf16 + compile' if dev.type == 'cuda' else 'float32'} | "
          f"{accum_steps} micro-batches per step | data: {source} | {time.strftime('%Y-%m-%d')}\n")

    header = ("| recipe | micro-batch | tokens/s | ms per micro-batch | peak GiB | GFLOP/token | TFLOP/s | MFU |\n"
              "|---|---|---|---|---|---|---|---|")
    print(header)
    speeds, crammed_seconds = {}, None
    for recipe, (build, mask_rate, flops) in recipes(dims).items():
        seconds, memory = time_training(build, mask_rate, micro, tokens, dev, n_steps, n_warmup)
        speeds[recipe], line = row(recipe, micro, seconds, memory, flops, peak)
        crammed_seconds = crammed_seconds or seconds
        print(line, flush=True)
    for recipe in list(speeds)[1:]:
        print(f"\ncrammed / {recipe}: {speeds['crammed'] / speeds[recipe]:.2f}x tokens/s", end="")
    data_seconds = time_data(tokens, micro, dev, dims["vocab_size"])
    print(f"\ndata loading + masking: {1e3 * data_seconds:.2f} ms per micro-batch, "
          f"{100 * data_seconds * accum_steps / crammed_seconds:.1f}% of the crammed step if not overlapped")

    if sweep:
        print("\n| crammed micro-batch | tokens/s | peak GiB |\n|---|---|---|")
        build, _, flops = recipes(dims)["crammed"]
        sizes = [8, 16, 32, 64] if dev.type == "cpu" else [2 ** i for i in range(5, 14)]
        largest = None
        for size in sizes:
            try:
                seconds, memory = time_training(build, 0.25, size, tokens, dev, max(2, n_steps // 2), n_warmup)
            except torch.OutOfMemoryError:
                print(f"| {size} | out of memory | - |")
                break
            largest = size
            memory = f"{memory:.1f}" if memory is not None else "-"
            print(f"| {size} | {size * accum_steps * seq_len / seconds:,.0f} | {memory} |", flush=True)
        if dev.type == "cuda":
            print(f"\nlargest micro-batch that fits: {largest}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
