"""Wall-clock-budgeted MLM pretraining of crammed BERT.

    python train.py config/train_quickstart.py          # a few minutes on a CPU
    python train.py --budget_hours=24                   # the reference recipe (+ smear) on one GPU
    python train.py config/recipe_reference.py          # the paper's recipe exactly (no smear)
    torchrun --standalone --nproc_per_node=8 train.py --budget_hours=3
    python train.py --resume=True                       # continue out_dir/ckpt.pt

The learning rate and the batch size follow the fraction of the budget spent, not the step
count (the reference's choice: the run ends on time, whatever the hardware). The budget counts
training time, compilation included; evaluation and checkpointing are not counted. Ctrl-C or
SIGTERM finishes the step, saves and exits (130, 143); after any stop, the same command with
--resume=True continues the schedules and the data order where they were.
"""
import functools
import json
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist

import runtime
from offload import OffloadTrainer
from configurator import configure
from data import (SPECIAL_TOKENS, get_batch, load_checkpoint, load_meta, load_tokens, make_encoding, mask_tokens,
                  parse_ranks, save_checkpoint)
from model import CrammedBert, param_groups
from muon import muon_groups

# -----------------------------------------------------------------------------
data_dir = "data/pydocs"  # written by prepare.py
out_dir = "out"           # ckpt.pt and metrics.jsonl go here
budget_hours = 24.0       # training time, compilation included; the schedules follow the share spent
budget_tokens = 0         # > 0: the schedules follow tokens trained instead of the clock and the run ends there
                          # (reproducible runs, equal-token comparisons); budget_hours is then not used
max_steps = 0             # also stop after this many optimizer steps (0: budget only)
resume = False            # continue from out_dir/ckpt.pt
# model (the reference crammed-BERT shape; vocabulary and sequence length come from the data)
n_layers = 16
d_model = 768
n_heads = 12
d_ffn = 3072              # feed-forward width (split into gate and value halves when glu)
bias = False              # biases in the linear layers
norm_first = True         # pre-LayerNorm (False: the original post-norm)
glu = True                # gated GELU feed-forward
learned_positions = False  # False: scaled sinusoidal positions
head_transform = False    # the original BERT's dense + GELU + LayerNorm before the output layer
dropout = 0.0             # the reference configures 0.1 but turns it off for pretraining
sparse_prediction = True  # only the masked positions reach the output layer
smear = True              # each position also gets a learned map of its neighbours' embeddings (model.py):
                          # cram's one change from the paper's recipe (config/recipe_reference.py turns it off)
# objective
mask_rate = 0.25          # share of each row's tokens to predict (80% [MASK], 10% random, 10% kept)
eval_mask_rate = 0.25     # validation masks this share whatever mask_rate is, so recipes compare
# optimizer and schedules
optim = "adamw"           # 'adamw' (reference), or 'muon': Muon on the blocks' matrices, AdamW on the rest (muon.py)
lr = 1e-3                 # peak learning rate (both optimizers: Muon's updates are scaled to AdamW's size)
beta1 = 0.9
beta2 = 0.98
eps = 1e-12
weight_decay = 0.01       # not on biases, norms and scalars
grad_clip = 0.5           # gradient norm clipping (0: off)
lr_schedule = "triangle"  # 'triangle' (reference, see lr_at) or 'warmup_linear' (original BERT)
warmup = 0.01             # warm-up share of the budget for 'warmup_linear'
micro_batch = 0           # sequences per device per forward pass; 0: on a GPU the largest that fits (a probe), 32 on a CPU
batch_size = 8192         # sequences per optimizer step at the end of the ramp
batch_ramp = 0.6          # share of the budget over which the batch grows from one micro-batch
# system
device = "auto"           # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = "auto"            # autocast: 'auto' (bfloat16 on a GPU that has it, else float16; float32 on a CPU),
                          # 'float32', 'bfloat16', 'float16' (with loss scaling)
compile = True            # torch.compile the training step (inductor; on a CPU too)
offload = False           # blocks' master weights and AdamW state in host memory, streamed through the device:
                          # for encoders whose training state exceeds the GPU (offload.py; one process, AdamW)
peak_tflops = 0.0         # for MFU; 0 looks the GPU up by name
seed = 0                  # model initialisation, data order and masks
data_order = "shuffled"   # or 'file': the first epoch reads train.bin in its order (prepare.py's curriculum), later epochs shuffled
log_interval = 10         # steps
max_skipped_steps = 5     # stop after this many updates in a row skipped for a non-finite gradient
eval_interval_minutes = 30.0
eval_sequences = 4096     # validation sequences per evaluation (fixed masks)
ckpt_interval_minutes = 60.0
fill_in_examples = 3      # at the end, fill-in-the-blank examples from the validation text
wandb_log = False         # also log to Weights & Biases (pip install wandb; imported only when on)
wandb_project = "cram"
wandb_run_name = ""       # default: the name of out_dir
# -----------------------------------------------------------------------------
MODEL_KEYS = ("n_layers", "d_model", "n_heads", "d_ffn", "bias", "norm_first", "glu", "learned_positions",
              "head_transform", "dropout", "sparse_prediction", "smear")


def lr_at(progress, peak, schedule="triangle", warmup=0.01):
    """Learning rate at a fraction `progress` of the budget.
    triangle: 25% of peak at the start, peak at 75%, linear to 0 at the end (reference).
    warmup_linear: linear warm-up over `warmup`, then linear decay to 0 (original BERT)."""
    if schedule == "triangle":
        return peak * max(0.0, min(0.25 + progress, 4.0 - 4.0 * progress))
    if schedule == "warmup_linear":
        if progress < warmup:
            return peak * progress / warmup
        return peak * max(0.0, (1.0 - progress) / (1.0 - warmup))
    raise ValueError(f"unknown lr_schedule '{schedule}' (triangle, warmup_linear)")


def batch_size_at(progress, micro, final, ramp):
    """Sequences per optimizer step: a linear ramp from one micro-batch to `final`, reached
    at `ramp` of the budget, rounded down to a whole number of micro-batches."""
    target = final if ramp <= 0 else micro + (final - micro) * min(1.0, progress / ramp)
    return max(micro, int(target) // micro * micro)


def train_step(model, optimizer, scaler, batch_at, accum_steps, step_lr, clip, rt):
    """One optimizer step over accum_steps micro-batches. batch_at(micro_step) gives the masked
    micro-batch (inputs, positions, labels) on the device. Returns the mean loss (a tensor) and
    whether the update was applied: one with a non-finite gradient norm is skipped."""
    for group in optimizer.param_groups:
        group["lr"] = step_lr
    total = 0.0
    for micro_step in range(accum_steps):
        inputs, positions, labels = batch_at(micro_step)
        # DDP: all-reduce the gradients only on the last micro-batch
        last = micro_step == accum_steps - 1
        with model.no_sync() if hasattr(model, "no_sync") and not last else nullcontext():
            with rt.autocast():
                loss, _ = model(inputs, positions, labels)
            scaler.scale(loss / accum_steps).backward()
        total = total + loss.detach()
    scaler.unscale_(optimizer)  # the true gradients for the norm and the clipping (a no-op unless float16)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip or math.inf)
    # one sync per step, so that a non-finite update never lands; the norm of the all-reduced
    # gradients is the same on every rank, so all ranks decide alike
    applied = math.isfinite(norm.item())
    if applied:
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total / accum_steps, applied


class Trainer:
    """Normal mode: the whole model and its AdamW (or Muon) on the device, stepped by train_step.
    OffloadTrainer (offload.py) is the same contract for off-load mode."""

    def __init__(self, model, step_model, optimizer, scaler, rt):
        self.model, self.step_model, self.optimizer, self.scaler, self.rt = model, step_model, optimizer, scaler, rt

    def step(self, batch_at, accum_steps, step_lr, clip):
        return train_step(self.step_model, self.optimizer, self.scaler, batch_at, accum_steps, step_lr, clip, self.rt)

    def state_dict(self):
        return dict(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                    scaler=self.scaler.state_dict())

    def load_state_dict(self, checkpoint):
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if "scaler" in checkpoint:
            self.scaler.load_state_dict(checkpoint["scaler"])


@functools.lru_cache(maxsize=2)
def epoch_order(n_rows, seed, epoch):
    """The permutation of the training rows that epoch `epoch` visits."""
    if data_order == "file" and epoch == 0:  # the file's own order is the curriculum; repeats are shuffled
        return np.arange(n_rows)
    return np.random.default_rng((seed, epoch)).permutation(n_rows)


def rows_at(start, count, n_rows, seed):
    """Rows of the run's sequences start .. start + count - 1, where sequence i is row
    epoch_order(i // n_rows)[i % n_rows]: every epoch visits each row once, and a resumed run
    continues from the number of sequences consumed (the checkpoint's tokens / seq_len)."""
    parts = []
    while count > 0:
        epoch, offset = divmod(start, n_rows)
        take = min(count, n_rows - offset)
        parts.append(epoch_order(n_rows, seed, epoch)[offset:offset + take])
        start, count = start + take, count - take
    return np.concatenate(parts)


def repeat_warning(expected, train_tokens, basis):
    """A one-line warning when the run will train on more tokens than the data holds, else None;
    basis says where the expected count comes from."""
    if expected > train_tokens:
        return (f"warning: {basis} the run will train about {expected / 1e9:.2f}B tokens, {expected / train_tokens:.1f} "
                f"epochs of the {train_tokens / 1e9:.2f}B training tokens: repeated data overfits; prepare a larger "
                f"corpus (see the README)")
    return None


def cpu_warning(flops_per_step, threads, cpu_flops_per_thread=75e9):
    """A one-line warning when one optimizer step at the full batch takes over 10 minutes on this
    CPU (float32 reaches about 75 GFLOP/s per AVX2 thread), else None."""
    minutes = flops_per_step / (cpu_flops_per_thread * threads) / 60
    if minutes > 10:
        return (f"warning: on this CPU one optimizer step at the full batch takes about {minutes:.0f} minutes: this "
                f"shape needs a GPU. For a run of a few minutes: python train.py config/train_quickstart.py")
    return None


@torch.no_grad()
def evaluate(model, tokens, meta, batch, rt, n_sequences):
    """Validation MLM loss and masked-token accuracy on the first n_sequences, with fixed masks
    (eval_mask_rate of every row, the same whatever the training recipe)."""
    model.eval()
    generator = torch.Generator(device=rt.device).manual_seed(1234)
    n = min(n_sequences, len(tokens))
    loss_sum, correct, predicted = 0.0, 0, 0
    for start in range(0, n, batch):
        idx = get_batch(tokens, np.arange(start, min(n, start + batch)), rt.device)
        inputs, positions, labels = mask_tokens(idx, eval_mask_rate, meta["special_ids"]["[MASK]"],
                                                meta["n_regular"], generator)
        with rt.autocast():
            loss, hits = model(inputs, positions, labels)
        loss_sum += loss.item() * labels.numel()
        correct += hits.item()
        predicted += labels.numel()
    model.train()
    return loss_sum / predicted, correct / predicted


@torch.no_grad()
def fill_in(model, tokens, meta, enc, rt, n, seed):
    """n fill-in-the-blank lines: one word of each of n validation sequences spread over the split
    replaced by [MASK], beside the model's three likeliest tokens for it."""
    rng = np.random.default_rng(seed)
    n_regular, lines = meta["n_regular"], []
    model.eval()
    for ids in np.asarray(tokens[np.linspace(0, len(tokens) - 1, n).astype(int)], dtype=np.int64):
        words = [i for i in range(8, len(ids) - 4) if ids[i] < n_regular and
                 re.fullmatch(r" [A-Za-z]{3,}", enc.decode([int(ids[i])]))]
        if not words:
            continue
        pos = words[rng.integers(len(words))]
        inputs = torch.tensor(ids, device=rt.device)[None]
        inputs[0, pos] = meta["special_ids"]["[MASK]"]
        with rt.autocast():
            logits = model.logits(model.encode(inputs)[:, pos]).float()
        probs, top = logits[0, :n_regular].softmax(-1).topk(3)
        context = f"{enc.decode(ids[max(0, pos - 16):pos].tolist())} ____{enc.decode(ids[pos + 1:pos + 6].tolist())}"
        guesses = ", ".join(f"{enc.decode([t])!r} {p:.2f}" for t, p in zip(top.tolist(), probs.tolist()))
        lines.append(f"fill in: ...{' '.join(context.split())}... -> {guesses} (true: {enc.decode([int(ids[pos])])!r})")
    model.train()
    return lines


def probe_micro_batch(model_args, rt, largest):
    """The largest power-of-two micro-batch (up to `largest`) that fits on the GPU, measured with a
    throwaway model of the real shape, its AdamW state and one eager step per size (eager keeps at
    least the activations a compiled step keeps, so the compiled run fits too)."""
    model = CrammedBert(**model_args).to(rt.device)
    optimizer = rt.optimizer(param_groups(model, weight_decay), lr=0.0)
    scaler = rt.grad_scaler()
    vocab, seq = model_args["vocab_size"], model_args["seq_len"]
    n_regular = vocab - len(SPECIAL_TOKENS)  # the special tokens take the last ids, [MASK] the very last

    def peak_bytes(size):
        idx = torch.randint(0, n_regular, (size, seq), device=rt.device)
        batch = mask_tokens(idx, mask_rate, vocab - 1, n_regular)
        rt.reset_peak_memory()
        train_step(model, optimizer, scaler, lambda micro_step: batch, 1, 0.0, grad_clip, rt)
        rt.synchronize()
        return rt.peak_memory()

    try:
        return runtime.largest_micro_batch(peak_bytes, runtime.free_device_memory(rt), largest)
    finally:
        del model, optimizer
        torch.cuda.empty_cache()
        rt.reset_peak_memory()  # the training log reports training's own peak


def check_settings(world):
    """One-line errors for settings that cannot run, before any work."""
    try:
        lr_at(0.0, lr, lr_schedule, warmup)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    if optim not in ("adamw", "muon"):
        raise SystemExit(f"error: unknown --optim '{optim}' (adamw, muon)")
    if data_order not in ("shuffled", "file"):
        raise SystemExit(f"error: unknown --data_order '{data_order}' (shuffled, file)")
    if budget_tokens < 0 or (budget_tokens == 0 and budget_hours <= 0):
        raise SystemExit(f"error: --budget_hours must be above 0 (got {budget_hours}), or give --budget_tokens")
    if micro_batch < 0 or (micro_batch and batch_size % (micro_batch * world)):
        raise SystemExit(f"error: --batch_size={batch_size} must be a multiple of --micro_batch={micro_batch} times "
                         f"the {world} process(es)")
    if offload and world > 1:
        raise SystemExit("error: --offload=True runs in one process: start it with python, not torchrun")
    if offload and optim != "adamw":
        raise SystemExit(f"error: --offload=True steps AdamW on the host: it does not combine with --optim={optim}")


def main(config):
    global micro_batch
    ddp = "RANK" in os.environ
    check_settings(int(os.environ.get("WORLD_SIZE", 1)))
    if ddp:
        dist.init_process_group(backend="nccl" if device != "cpu" and torch.cuda.is_available() else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    # off-load mode runs the blocks eagerly through two templates: no torch.compile of the whole model
    rt = runtime.setup(device, dtype, compile and not offload, local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    if offload and rt.dtype == torch.float16:
        raise SystemExit("error: --offload=True needs --dtype=bfloat16 or float32 (float16's loss scaling is not "
                         "built for it)")
    master = rank == 0
    log = print if master else (lambda *a, **k: None)

    meta = load_meta(data_dir)
    train_tokens, val_tokens = load_tokens(data_dir, "train", meta), load_tokens(data_dir, "val", meta)
    with open(os.path.join(data_dir, meta["tokenizer_file"])) as f:
        tokenizer_text = f.read()  # checkpoints carry their tokenizer, so fine-tuning needs nothing else
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    model_args = dict(vocab_size=meta["vocab_size"], seq_len=meta["seq_len"], norm_eps=1e-12,
                      **{k: config[k] for k in MODEL_KEYS})
    checkpoint = None
    if resume:
        checkpoint = load_checkpoint(ckpt_path)
        if checkpoint["model_args"] != model_args:
            changed = [k for k in model_args if checkpoint["model_args"].get(k) != model_args[k]]
            raise SystemExit(f"error: the checkpoint's model differs from this config in {', '.join(changed)}")
    elif os.path.exists(ckpt_path):
        raise SystemExit(f"error: {ckpt_path} exists: pass --resume=True to continue it, or choose another --out_dir")
    os.makedirs(out_dir, exist_ok=True)

    if micro_batch == 0 and rt.device.type == "cuda" and not offload:  # the probe measures normal mode
        micro_batch, tried = probe_micro_batch(model_args, rt, batch_size // world)
        if ddp:  # every rank takes the smallest that fits anywhere
            t = torch.tensor([micro_batch], device=rt.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            micro_batch = int(t.item())
        while batch_size % (micro_batch * world):  # a power of two that divides the batch
            micro_batch //= 2
        log(f"micro_batch=0: chose {micro_batch}, the largest power of two within 90% of the GPU's free memory "
            f"(peak GiB by size: {', '.join(f'{s}: {b / 2 ** 30:.1f}' if b else f'{s}: out of memory' for s, b in tried.items())})")
    micro_batch = micro_batch or max(m for m in (1, 2, 4, 8, 16, 32) if batch_size % (m * world) == 0)
    config["micro_batch"] = micro_batch

    torch.manual_seed(seed)
    model = CrammedBert(**model_args)  # on the host: the same initialisation in both modes
    flops_per_token, n_params, n_matmul = model.flops_per_token(mask_rate), model.num_params(), model.num_params(True)
    if offload:
        # eval and fill-in run through the same streaming forward, so nothing needs the whole model on the device
        trainer = OffloadTrainer(model, rt, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        eval_model = trainer
        log("off-load mode: blocks' masters and AdamW in host memory, streamed through 2 device templates; "
            "eager (no torch.compile of the whole model)")
    else:
        model = model.to(rt.device)
        groups = muon_groups(model, weight_decay) if optim == "muon" else param_groups(model, weight_decay)
        optimizer = rt.optimizer(groups, optim, lr=lr, betas=(beta1, beta2), eps=eps)
        step_model = rt.compile_model(model)
        if ddp:
            step_model = torch.nn.parallel.DistributedDataParallel(
                step_model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        trainer, eval_model = Trainer(model, step_model, optimizer, rt.grad_scaler(), rt), model
    step, elapsed, tokens_seen, init_loss, last_saved = 0, 0.0, 0, None, None
    if checkpoint:  # either mode resumes the other's checkpoints: they share the format
        trainer.load_state_dict(checkpoint)
        step, elapsed, tokens_seen = checkpoint["step"], checkpoint["elapsed"], checkpoint["tokens"]
        init_loss, last_saved = checkpoint.get("init_val_loss"), step
        log(f"resuming {ckpt_path} at step {step}, {elapsed / 60:.1f} minutes and {tokens_seen / 1e6:.1f}M tokens in")
    scaler = trainer.scaler
    budget = budget_hours * 3600
    seq_len, n_rows = meta["seq_len"], len(train_tokens)
    peak = runtime.peak_flops(rt.device, peak_tflops * 1e12)
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_matmul / 1e6:.2f}M in matmuls), "
        f"{flops_per_token / 1e9:.3f} GFLOP/token | data: {n_rows:,} train sequences of {seq_len} "
        f"from {meta['source']} | device: {rt.describe()}{f' x{world}' if ddp else ''} | micro-batch {micro_batch}")
    warning = rt.device.type == "cpu" and cpu_warning(flops_per_token * batch_size * seq_len, torch.get_num_threads())
    if warning:
        log(warning)
    warning = budget_tokens and repeat_warning(budget_tokens, n_rows * seq_len,
                                               f"with --budget_tokens={budget_tokens:,}")
    if warning:
        log(warning)

    # every log and evaluation line as JSON: a fresh run starts the file, a resumed one appends
    # (steps redone after a hard kill appear twice; the later line is the one that counts)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    if master and not resume:
        open(metrics_path, "w").close()
    if master and wandb_log:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name or os.path.basename(os.path.abspath(out_dir)),
                   config=config)

    def record(**fields):
        if master:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(fields) + "\n")
            if wandb_log:
                wandb.log(fields, step=fields["step"])

    def save(final=False):
        nonlocal last_saved
        if master:
            save_checkpoint(ckpt_path, dict(
                **trainer.state_dict(), model_args=model_args, step=step, elapsed=elapsed, tokens=tokens_seen,
                config=config, init_val_loss=init_loss, data_dir=os.path.abspath(data_dir), meta=meta, final=final,
                tokenizer=tokenizer_text))
        last_saved = step

    def run_eval():
        val_loss, val_acc = evaluate(eval_model, val_tokens, meta, micro_batch, rt, eval_sequences)
        log(f"eval  step {step} | val loss {val_loss:.4f} | masked-token accuracy {val_acc:.3f} | "
            f"{elapsed / 60:.1f} min, {tokens_seen / 1e6:.1f}M tokens")
        record(kind="eval", step=step, elapsed=round(elapsed, 2), tokens=tokens_seen, val_loss=val_loss,
               accuracy=val_acc)
        return val_loss, val_acc

    if init_loss is None and master:
        init_loss = run_eval()[0]

    mask_id, n_regular = meta["special_ids"]["[MASK]"], meta["n_regular"]
    generator = torch.Generator(device=rt.device)

    def batch_at(consumed, micro_step):
        """The masked micro-batch `micro_step` of this rank in the global batch that starts after
        `consumed` sequences: ranks take disjoint slices, and rows and masks depend only on the
        place in the run's sequence order, so a resumed run or another rank count sees the same."""
        start = consumed + (micro_step * world + rank) * micro_batch
        idx = get_batch(train_tokens, rows_at(start, micro_batch, n_rows, seed), rt.device)
        generator.manual_seed(int(np.random.default_rng((seed, start)).integers(2 ** 62)))
        return mask_tokens(idx, mask_rate, mask_id, n_regular, generator)

    # SIGTERM (schedulers, pre-emption) and SIGINT (Ctrl-C) finish the step, save and exit;
    # a second signal kills at once
    signals = []

    def request_stop(signum, frame):
        signals.append(signum)
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)

    last_eval = last_ckpt = elapsed
    skipped = skipped_in_a_row = 0
    warned_repeat = budget_tokens > 0  # a token budget was checked at the start
    window_start, window_tokens = time.perf_counter(), 0
    clock = time.perf_counter()
    while True:
        now = time.perf_counter()
        elapsed += now - clock
        clock = now
        stop = 1.0 if signals else 0.0
        if ddp:  # every rank follows rank 0's clock, so all take the same batch size, and all stop together
            t = torch.tensor([elapsed if master else 0.0, stop], dtype=torch.float64, device=rt.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed, stop = t.tolist()
        progress = tokens_seen / budget_tokens if budget_tokens else elapsed / budget
        if progress >= 1.0 or (max_steps and step >= max_steps) or stop:
            break
        step_batch = batch_size_at(progress, micro_batch * world, batch_size, batch_ramp)
        accum = step_batch // (micro_batch * world)
        step_lr = lr_at(progress, lr, lr_schedule, warmup)
        consumed = tokens_seen // seq_len
        loss, applied = trainer.step(lambda micro_step: batch_at(consumed, micro_step), accum, step_lr, grad_clip)
        step += 1
        tokens_seen += step_batch * seq_len
        window_tokens += step_batch * seq_len
        # float16's loss scaler skips overflowing steps by design while it halves its scale: only
        # skips at a scale below 1 say that the run itself diverged
        diverging = not applied and (not scaler.is_enabled() or scaler.get_scale() < 1)
        skipped += not applied
        skipped_in_a_row = skipped_in_a_row + 1 if diverging else 0
        if skipped_in_a_row >= max_skipped_steps:
            where = f"the last checkpoint is {ckpt_path} at step {last_saved}" if last_saved is not None else \
                "no checkpoint was saved"
            raise SystemExit(f"error: {skipped_in_a_row} steps in a row had a non-finite gradient (up to step {step}); "
                             f"{where}: lower --lr and resume it")
        if step % log_interval == 0:
            if ddp:  # the mean over all ranks' micro-batches, as one process would report it
                dist.all_reduce(loss)
                loss = loss / world
            loss = loss.item()  # syncs the device, so the window time is real
            window = time.perf_counter() - window_start
            tokens_per_s = window_tokens / window
            budget_left = f"{100 * (1 - progress):.0f}% of the budget left"
            mfu = flops_per_token * tokens_per_s / world / peak if peak else None
            memory = f" | {rt.peak_memory() / 2 ** 30:.1f} GiB" if rt.device.type == "cuda" else ""
            log(f"step {step} | loss {loss:.4f} | lr {step_lr:.2e} | batch {step_batch} | {tokens_per_s:,.0f} tok/s"
                f"{f' | mfu {100 * mfu:.1f}%' if mfu else ''}{memory} | epoch {tokens_seen / (n_rows * seq_len):.2f} | "
                f"{elapsed / 60:.1f} min | {budget_left}{f' | {skipped} updates skipped (non-finite)' if skipped else ''}")
            record(kind="train", step=step, elapsed=round(elapsed, 2), tokens=tokens_seen, loss=loss, lr=step_lr,
                   batch=step_batch, tokens_per_s=round(tokens_per_s), mfu=mfu, skipped=skipped)
            window_start, window_tokens = time.perf_counter(), 0
            rt.reset_peak_memory()  # each log line reports the peak of its own window
            if not warned_repeat and elapsed >= min(120.0, 0.05 * budget):
                warned_repeat = True  # after the first minutes, when the speed is known
                expected = tokens_seen + tokens_per_s * max(0.0, budget - elapsed)
                warning = repeat_warning(expected, n_rows * seq_len, f"at {tokens_per_s:,.0f} tokens/s")
                if warning:
                    log(warning)
        due_eval = elapsed - last_eval >= eval_interval_minutes * 60
        due_ckpt = elapsed - last_ckpt >= ckpt_interval_minutes * 60
        if due_eval or due_ckpt:
            paused = time.perf_counter()
            if due_eval and master:
                run_eval()
                last_eval = elapsed
            if due_ckpt:
                save()
                last_ckpt = elapsed
            clock += time.perf_counter() - paused  # evaluation and saving are not charged to the budget
            window_start += time.perf_counter() - paused

    if stop:
        save()
        name = signal.Signals(signals[0]).name if signals else "a signal to another rank"
        log(f"stopped by {name} at step {step} ({tokens_seen / 1e6:.1f}M tokens, {elapsed / 60:.1f} min): saved "
            f"{ckpt_path}; continue with the same command and --resume=True")
    else:
        val_loss, val_acc = run_eval() if master else (None, None)
        save(final=True)
        if rt.compile:
            log(f"torch.compile built {runtime.compiled_graphs()} graph(s) for the training step")
        if master and fill_in_examples:
            enc = make_encoding(parse_ranks(tokenizer_text), meta["special_ids"])
            for line in fill_in(eval_model, val_tokens, meta, enc, rt, fill_in_examples, seed):
                log(line)
        log(f"final: step {step} | val loss {val_loss:.4f} (at init {init_loss:.4f}) | masked-token accuracy "
            f"{val_acc:.3f} | {tokens_seen / 1e6:.1f}M tokens in {elapsed / 60:.1f} min | saved {ckpt_path}"
            if master else "")
    if ddp:
        dist.barrier()  # rank 0 evaluates and saves alone; tearing down before it is done aborts the others
        dist.destroy_process_group()
    if stop:  # the shell's status for the signal (130 for SIGINT, 143 for SIGTERM): the run is not finished
        sys.exit(128 + (signals[0] if signals else signal.SIGTERM))


if __name__ == "__main__":
    main(configure(globals(), sys.argv[1:]))
