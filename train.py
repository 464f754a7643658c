"""Wall-clock-budgeted MLM pretraining of crammed BERT.

    python train.py                                     # the real run: 24 hours on data/fineweb-edu, one GPU
    python train.py config/train_quickstart.py          # a few minutes on a CPU
    python train.py config/recipe_reference.py config/shape_paper.py  # the paper's recipe and shape exactly
    torchrun --standalone --nproc_per_node=8 train.py --budget_hours=3
    python train.py --resume=True                       # continue out_dir/ckpt.pt

The budget picks the model's shape, the final batch and the peak learning rate unless they are
given (budget.py: the rule in one place). The learning rate and the batch size follow the fraction of the budget spent,
not the step count (the reference's choice: the run ends on time, whatever the hardware). The budget counts
training time, compilation included; evaluation and checkpointing are not counted. Ctrl-C,
SIGTERM, a closed terminal (SIGHUP) and the other runtime.STOP_SIGNALS finish the step, save and
exit (128 + the signal's number: 130, 143, 129); after any stop, the same command with
--resume=True continues the schedules and the data order where they were.
"""
import dataclasses
import math
import os
import signal
import sys
import time

import torch

import budget
import runtime
from budget import LADDER, shape_of
from configurator import configure
from data import MASK_RATE, Batches, evaluate, fill_in, load_run_data, make_encoding, repeat_warning
from files import (MetricsLog, all_finite, check_resume, claim_folder, load_checkpoint, parse_ranks,
                   refuse_overwrite, save_checkpoint)
from model import DATA_FIELDS, CrammedBert, ModelConfig, Trainer, param_groups

# -----------------------------------------------------------------------------
data_dir = "data/fineweb-edu"  # written by prepare.py: this one by `python prepare.py config/prepare_fineweb.py`
out_dir = "out"           # ckpt.pt and metrics.jsonl go here
budget_hours = 24.0       # > 0: training time, compilation included; the schedules follow the share spent
budget_tokens = 0         # >= 0: if above 0, the schedules follow tokens trained instead of the clock (reproducible runs)
max_steps = 0             # >= 0: also stop after this many optimizer steps (0: budget only)
resume = False            # continue from out_dir/ckpt.pt
# model: the budget picks the shape and the final batch (budget.shape_for_budget, batch_for_budget) unless they
# are given here, in a config or on the command line; a resumed run keeps its checkpoint's
n_layers = 0              # >= 0: 0: by the budget
d_model = 0               # >= 0: 0: by the budget; when given, n_heads and d_ffn follow it (heads of 64, 4x) unless given
n_heads = 0               # >= 0: 0: by the budget
d_ffn = 0                 # >= 0: 0: by the budget
# every other field of model.py's ModelConfig (smear, glu, ...) is a setting here too, with its default
# there (--help lists them); vocabulary and sequence length come from the data
# objective
mask_rate = MASK_RATE     # (0, 1): share of each row's tokens to predict (80% [MASK], 10% random, 10% kept)
mask_rate_start = 0.0     # [0, 1): if above 0, the share falls from this to mask_rate over the budget (see mask_rate_at)
mask_levels = 4           # [1, 8]: ... in this many steps (1: start throughout; torch.compile keeps 8 graphs)
eval_mask_rate = MASK_RATE  # (0, 1): validation masks this share whatever mask_rate is, so recipes compare
# optimizer and schedules
optim = "adamw"           # {adamw, muon}: adamw (reference); muon: Muon on the blocks' matrices, AdamW on the rest (muon.py)
lr = 0.0                  # [0, inf): peak learning rate (both optimizers: Muon's updates are scaled to AdamW's size); 0: by
                          # the width (budget.lr_for_width; a resumed run keeps its checkpoint's)
beta1 = 0.9               # [0, 1)
beta2 = 0.98              # [0, 1)
eps = 1e-12               # >= 0
weight_decay = 0.01       # >= 0: not on biases, norms and scalars
grad_clip = 0.5           # >= 0: gradient norm clipping (0: off)
lr_schedule = "triangle"  # {triangle, warmup_linear}: the reference's (see lr_at), or original BERT's
warmup = 0.01             # [0, 1): warm-up share of the budget for 'warmup_linear'
micro_batch = 0           # >= 0: sequences per device per forward pass; 0: on a GPU the largest that fits, else 32
batch_size = 0            # >= 0: sequences per optimizer step at the end of the ramp; 0: by the budget
batch_ramp = 0.6          # [0, 1]: share of the budget over which the batch grows from one micro-batch
# system
device = "auto"           # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = "auto"            # {auto, float32, bfloat16, float16}: autocast; auto: runtime.auto_dtype (a resume keeps its own)
compile = True            # torch.compile the training step (inductor; on a CPU too)
compile_mode = "default"  # torch.compile's mode (max-autotune and reduce-overhead record CUDA graphs: a GPU only)
offload = False           # the blocks' weights and AdamW state in host memory, streamed through the GPU (offload.py)
peak_tflops = 0.0         # >= 0: for MFU; 0 looks the GPU up by name
seed = 0                  # [0, 4294967295]: model initialisation, data order and masks (2^32 seeds)
data_order = "shuffled"   # {shuffled, file}: file: the first epoch reads train.bin in its order (tools/curriculum.py's)
log_interval = 10         # >= 1: steps
max_skipped_steps = 5     # >= 1: stop after this many steps in a row that diverged (see train.py's loop)
eval_interval_minutes = 30.0  # >= 0
eval_sequences = 4096     # >= 1: validation sequences per evaluation (fixed masks)
ckpt_interval_minutes = 60.0  # >= 0: saved only with finite weights and a validation loss not diverged
fill_in_examples = 3      # >= 0: at the end, fill-in-the-blank examples from the validation text
wandb_log = False         # also log to Weights & Biases (pip install wandb; imported only when on)
wandb_project = "cram"
wandb_run_name = ""       # default: the name of out_dir
# -----------------------------------------------------------------------------
SHAPE_FIELDS = ("n_layers", "d_model", "n_heads", "d_ffn")  # ModelConfig's fields that train.py declares itself


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


def mask_rate_at(progress, end, start=0.0, levels=4):
    """The masking rate at a fraction `progress` of the budget: `end` throughout when start is 0,
    else a linear fall from `start` to `end` (Ankner et al. 2023, "Dynamic masking rate schedules")
    in `levels` equal steps, so each rate keeps a static shape for a while (one level: `start` throughout)."""
    if not start:
        return end
    level = min(levels - 1, int(progress * levels))
    return start + (end - start) * level / max(1, levels - 1)


def batch_size_at(progress, micro, final, ramp):
    """Sequences per optimizer step: a linear ramp from one micro-batch to `final`, reached
    at `ramp` of the budget, rounded down to a whole number of micro-batches."""
    target = final if ramp <= 0 else micro + (final - micro) * min(1.0, progress / ramp)
    return max(micro, int(target) // micro * micro)


def budget_text():
    """The budget as given: '5 min', '24 h' or '600,000 tokens'."""
    if budget_tokens:
        return f"{budget_tokens:,} tokens"
    return f"{budget_hours:g} h" if budget_hours >= 1 else f"{60 * budget_hours:.3g} min"


def budget_progress(tokens, seconds):
    """The share of the budget spent: of budget_tokens when set, else of budget_hours' seconds."""
    return tokens / budget_tokens if budget_tokens else seconds / (3600 * budget_hours)


def budget_spent(progress, step):
    """Whether a run at this share of its budget and this step has no step left to take."""
    return progress >= 1.0 or bool(max_steps and step >= max_steps)


def check_settings(world, config, rt):
    """One-line errors for settings that cannot run together, before any work (each setting's own
    range is declared beside it and checked by the configurator); again once the shape and batch
    are settled (settle_shape), with those. Until then a shape field not given is any rung's."""
    ModelConfig.from_settings({**config, **shape_of(LADDER[0], config)})
    if wandb_log and not runtime.installed("wandb"):
        raise SystemExit("error: --wandb_log=True needs wandb: pip install wandb (or leave --wandb_log off)")
    batch, unit = config["batch_size"], f"--micro_batch={micro_batch} times " if micro_batch else ""
    if batch and batch % ((micro_batch or 1) * world):
        raise SystemExit(f"error: --batch_size={batch} must be a multiple of {unit}the {world} process(es)")
    if offload:
        from offload import check_settings as check_offload
        check_offload(world, config, rt.dtype)


def diverged(loss, vocab_size, applied=True, scaler=None):
    """Whether a step (its loss, whether its update was applied) says the run diverged: a loss not
    finite or a nat above guessing uniformly over the vocabulary (about where an untrained model
    starts), or a skipped update. float16's loss scaler skips overflowing steps by design while it
    halves its scale: only skips at a scale below 1 say that the run itself diverged."""
    skipped = not applied and (scaler is None or not scaler.is_enabled() or scaler.get_scale() < 1)
    return skipped or not loss <= math.log(vocab_size) + 1.0


def run_eval(model, val_tokens, meta, rt, micro, metrics, step, tokens, seconds):
    """The validation loss and masked-token accuracy, printed and recorded."""
    val_loss, accuracy = evaluate(model, val_tokens, meta, micro, rt, eval_sequences, eval_mask_rate)
    print(f"eval  step {step} | val loss {val_loss:.4f} | masked-token accuracy {accuracy:.3f} | "
          f"{seconds / 60:.1f} min, {tokens / 1e6:.1f}M tokens")
    metrics.write(dict(kind="eval", step=step, elapsed=round(seconds, 2), tokens=tokens, val_loss=val_loss,
                       accuracy=accuracy))
    return val_loss, accuracy


def checkpoint_state(trainer, identity, step, seconds, tokens, init_loss, final):
    """What a checkpoint holds: the training state (either mode's, in one format), the run's place in
    its schedules and data, and its identity."""
    return dict(trainer.state_dict(), **identity, step=step, elapsed=seconds, tokens=tokens, init_val_loss=init_loss,
                final=final)


def save(path, model, state, val_tokens, rt, micro, last_saved, at_end=False):
    """A self-contained checkpoint: `state` holds the weights and training state, the run's place
    in its schedules and data and its identity (the model's settings, the run's, the data's meta and
    tokenizer). Saves only weights that are finite and whose loss on a validation micro-batch has
    not diverged, so the checkpoint a divergence stop names is one a lower learning rate recovers
    from. Returns the step the checkpoint file now holds: state's, or last_saved's when refused (said;
    at_end, the run's last save, an error)."""
    if all_finite(state["model"]):
        loss = evaluate(model, val_tokens, state["meta"], micro, rt, micro, eval_mask_rate)[0]
        refused = f"a diverged validation loss ({loss:.2f})" if diverged(loss, state["meta"]["vocab_size"]) else None
    else:
        refused = "non-finite weights"
    if not refused:
        save_checkpoint(path, state)
        return state["step"]
    if at_end:
        raise SystemExit(f"error: the weights at step {state['step']} were not saved: {refused}; {path} keeps step "
                         f"{last_saved}: lower --lr and resume it")
    print(f"checkpoint at step {state['step']} not saved: {refused}; {path} keeps step {last_saved}")
    return last_saved


def main(config):
    ddp, world = runtime.launcher()  # under torchrun, or one process
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = load_checkpoint(ckpt_path, "resume") if resume else None  # first: dtype=auto keeps its precision
    rt, rank = setup_device(config, checkpoint, world, ddp)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    # refused before any work (the budget's matmul timing, a GPU's micro-batch probe): a folder another run holds
    # (a new folder is made only once the run surely fits: start_run), a checkpoint a fresh run would replace
    if master and os.path.isdir(out_dir):
        claim_folder(out_dir, files=("ckpt.pt", "metrics.jsonl"))
    if not checkpoint:
        refuse_overwrite(ckpt_path)
    meta, train_tokens, val_tokens, tokenizer_text = load_run_data(data_dir)
    seq_len, n_rows = meta["seq_len"], len(train_tokens)
    data_args = dict(vocab_size=meta["vocab_size"], seq_len=seq_len)
    pick = settle_shape(config, checkpoint, data_args, n_rows * seq_len, rt, world, master, ddp)
    batch, model_args = config["batch_size"], dataclasses.asdict(ModelConfig.from_settings(config, **data_args))
    if checkpoint:  # the same run, and one with budget left, before a GPU's micro-batch probe
        check_resume(ckpt_path, checkpoint, model_args, tokenizer_text, optim, data_dir)
        exit_if_spent(checkpoint, ckpt_path, log, ddp)
    # the micro-batch, after a check that the step can fit the device's memory (runtime.check_memory)
    micro = config["micro_batch"] = runtime.choose_micro_batch(micro_batch, batch, model_args, rt,
                                                               world, max(mask_rate, mask_rate_start), offload, log)
    metrics = start_run(model_args, ckpt_path, config, master, rt, n_rows * seq_len, checkpoint)
    if not checkpoint:
        say_picks(log, pick, config, seq_len, micro * world)

    # -------------------------------------------------------------------- the model and its optimizer
    torch.manual_seed(seed)
    model = CrammedBert(**model_args)  # on the host: the same initialisation in both modes
    log(f"model: {model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M in matmuls), "
        f"{model.flops_per_token(mask_rate) / 1e9:.3f} GFLOP/token | data: {n_rows:,} train sequences of {seq_len} "
        f"from {meta['source']} | device: {rt.describe()}{f' x{world}' if ddp else ''} | micro-batch {micro}")
    trainer = make_trainer(model, rt, ddp, log, config["lr"])
    model = trainer.model  # on the device: what evaluation and fill-in call
    step, tokens, seconds, skipped, init_loss, last_saved = 0, 0, 0.0, 0, None, None
    if checkpoint:  # either mode resumes the other's checkpoints: they share the format
        trainer.load_state_dict(checkpoint)
        step, tokens, seconds = checkpoint["step"], checkpoint["tokens"], checkpoint["elapsed"]
        init_loss, last_saved = checkpoint.get("init_val_loss"), step
    identity = dict(model_args=model_args, config=config, data_dir=os.path.abspath(data_dir), meta=meta,
                    tokenizer=tokenizer_text, budget=pick)  # all a checkpoint needs besides the training state to resume or fine-tune
    if master and init_loss is None:  # the loss at initialisation, which the final line compares with
        init_loss = run_eval(model, val_tokens, meta, rt, micro, metrics, step, tokens, seconds)[0]
    batches = Batches(train_tokens, meta, micro, rank, world, rt.device, seed, data_order)
    stop_request = runtime.StopRequest()
    peak = runtime.peak_flops(rt.device, peak_tflops * 1e12)

    # -------------------------------------------------------------------- the loop
    # `seconds` counts training alone, compilation included: the clock runs from the top of an
    # iteration to the end of its step; logging, evaluation and saving are not charged
    last_eval = last_ckpt = seconds
    window, in_a_row, warned = (seconds, tokens), 0, budget_tokens > 0  # speed window, diverged in a row, repeat warned
    last_took = float("inf")  # the last step's seconds
    while True:
        started = time.perf_counter()
        stop = stop_request.signum is not None
        if ddp:  # every rank follows rank 0's clock, so all take the same batch size, and all stop together
            seconds, stop = runtime.rank0_clock(seconds, stop, master, rt.device)
        progress = budget_progress(tokens, seconds)
        if budget_spent(progress, step) or stop:
            break
        step_batch = batch_size_at(progress, micro * world, batch, batch_ramp)  # schedules: pure functions
        step_lr = lr_at(progress, config["lr"], lr_schedule, warmup)
        step_mask = mask_rate_at(progress, mask_rate, mask_rate_start, mask_levels)
        # this rank's masked micro-batches of the global batch that starts after `tokens // seq_len` sequences
        micro_batches = [batches.at(tokens // seq_len, i, step_mask) for i in range(step_batch // (micro * world))]
        # forward and backward per micro-batch, gradients accumulated, clipped, one update (model.Trainer.step)
        loss, applied = trainer.step(micro_batches, step_lr, grad_clip)
        loss = (runtime.mean_over_ranks(loss) if ddp else loss).item()  # DDP: all ranks' (the step synced already)
        step, tokens, skipped = step + 1, tokens + step_batch * seq_len, skipped + (not applied)
        took = time.perf_counter() - started
        if stop_request.resumed():  # stopped and continued meanwhile (Ctrl-Z, a suspend): charged as the step before
            took = min(took, last_took)
        seconds, last_took = seconds + took, took
        in_a_row = in_a_row + 1 if diverged(loss, meta["vocab_size"], applied, trainer.scaler) else 0
        if in_a_row >= max_skipped_steps:
            raise divergence_stop(in_a_row, step, last_saved, ckpt_path, meta["vocab_size"])
        if master and step % log_interval == 0:  # logging, evaluation and saving: rank 0 alone
            tokens_per_s = (tokens - window[1]) / (seconds - window[0])
            mfu = model.flops_per_token(step_mask) * tokens_per_s / world / peak if peak else None
            log_step(metrics, rt, step, loss, step_lr, step_batch, tokens_per_s, mfu, tokens / (n_rows * seq_len),
                     seconds, tokens, progress, skipped)
            if not warned and seconds >= min(120.0, 0.05 * budget_hours * 3600):  # once: the speed is known
                warned, expected = True, tokens + tokens_per_s * max(0.0, budget_hours * 3600 - seconds)
                warning = repeat_warning(expected, n_rows * seq_len, f"at {tokens_per_s:,.0f} tokens/s")
                if warning:
                    print(warning)
            window = (seconds, tokens)
        if master and seconds - last_eval >= eval_interval_minutes * 60:
            last_eval = seconds
            run_eval(model, val_tokens, meta, rt, micro, metrics, step, tokens, seconds)
        if master and seconds - last_ckpt >= ckpt_interval_minutes * 60:
            last_ckpt = seconds
            state = checkpoint_state(trainer, identity, step, seconds, tokens, init_loss, final=False)
            last_saved = save(ckpt_path, model, state, val_tokens, rt, micro, last_saved)

    # -------------------------------------------------------------------- the end; the clock has stopped
    if master:
        state = checkpoint_state(trainer, identity, step, seconds, tokens, init_loss, final=not stop)
        finish(model, state, metrics, val_tokens, rt, micro, stop_request.signum, last_saved, ckpt_path)
    if ddp:  # DDP's reducer freed before its process group, which waits for rank 0 (runtime.leave_process_group)
        del trainer
        runtime.leave_process_group()
    if stop:  # the shell's status for the signal (130 for SIGINT, 143 for SIGTERM, ...): the run is not finished
        sys.exit(128 + (stop_request.signum or signal.SIGTERM))


def setup_device(config, checkpoint, world, ddp):
    """(the Runtime, this process's rank): a resumed run's precision where dtype=auto (a run and its
    resume train alike), the settings checked before torchrun's processes join (a refusal leaves no
    rank waiting), then rank 0's precision on every rank; `config` keeps device and dtype as resolved."""
    saved = checkpoint.get("config", {}) if checkpoint else {}
    rt = runtime.setup(device, dtype, compile and not offload, compile_mode,  # off-load: eager blocks
                       (saved.get("device"), saved.get("dtype")))
    check_settings(world, config, rt)
    rank = runtime.join_process_group(rt.device) if ddp else 0
    rt = runtime.rank0_precision(rt) if ddp else rt
    config.update(device=rt.device.type, dtype=rt.dtype_name())
    return rt, rank


def say_picks(log, pick, config, seq_len, micro):
    """A fresh run's start-up lines for what the rule picked: the budget's shape and batch (`pick`,
    when it picked them), the rate (when --lr was not given)."""
    if pick:
        steps = budget.expected_steps(pick["tokens"] / seq_len, micro, config["batch_size"], batch_ramp)
        log(budget.budget_line(pick, config, budget_text(), steps))
    if not lr:
        log(budget.lr_line(config["lr"], config["d_model"]))


def settle_shape(config, checkpoint, data_args, data_tokens, rt, world, master, ddp):
    """The shape, the final batch and the peak learning rate, written into `config`: each given
    (non-zero) as given; a resumed run's others from its `checkpoint` (None for a fresh run); a fresh
    run's from its budget (pick_shape) and the rate from the width (budget.lr_for_width). Returns
    what the budget picked (or None), for the checkpoint to keep and budget_line to say."""
    given = {k: config[k] for k in (*SHAPE_FIELDS, "batch_size") if config[k]}
    pick = None
    if checkpoint:  # the batch of a checkpoint from before the budget picked: train.py's default then
        saved = dict({k: checkpoint["model_args"][k] for k in SHAPE_FIELDS},
                     batch_size=checkpoint.get("config", {}).get("batch_size", 8192))
        config.update(saved, **given)
        pick = checkpoint.get("budget")
    elif len(given) < len(SHAPE_FIELDS) + 1:
        pick = pick_shape(config, given, data_args, data_tokens, rt, world, master, ddp)
    saved_lr = checkpoint.get("config", {}).get("lr") if checkpoint else None
    config["lr"] = config["lr"] or saved_lr or budget.lr_for_width(config["d_model"])
    check_settings(world, config, rt)  # with the shape and batch settled
    return pick


def pick_shape(config, given, data_args, data_tokens, rt, world, master, ddp):
    """settle_shape's fresh run: the budget's shape and batch into `config` (those `given` win);
    returns what it picked and why. A budget of hours buys its FLOPs: this device's measured matmul
    speed (rank 0's under torchrun) x budget.STEP_EFFICIENCY x the processes."""
    # a CPU's step keeps up with its float32 matmuls, not with its bfloat16 ones (BENCHMARKS.md, "The CPU's
    # precision"): there a float32 matmul measures the step, and bfloat16's gain is the step's (budget.cpu_bf16_gain)
    cpu_bf16 = rt.device.type == "cpu" and rt.dtype == torch.bfloat16
    timed = dataclasses.replace(rt, dtype=torch.float32) if rt.device.type == "cpu" else rt
    speed, gain = 0.0, 1.0
    if master and not budget_tokens:
        speed = runtime.matmul_speed(timed)
        gain = budget.cpu_bf16_gain(rt.bf16_speedup or runtime.bf16_speedup()) if cpu_bf16 else 1.0
    if ddp:
        speed, gain = runtime.from_rank0(speed, rt.device), runtime.from_rank0(gain, rt.device)
    compute = budget_hours * 3600 * speed * gain * budget.STEP_EFFICIENCY * world
    model_args = dataclasses.asdict(ModelConfig.from_settings({**config, **shape_of(LADDER[0], {})}, **data_args))
    rung, nearest, _ = budget.shape_for_budget(compute, budget_tokens, data_tokens, model_args, mask_rate)
    config.update(shape_of(rung, given))
    per_token = ModelConfig.from_settings(config, **data_args).flops_per_token(mask_rate)
    tokens = budget_tokens or compute / per_token
    unit = (micro_batch or 1) * world  # the batch a whole number of micro-batches on every process
    final = budget.batch_for_budget(tokens, data_args["seq_len"])
    config["batch_size"] = given.get("batch_size") or max(1, round(final / unit)) * unit
    return dict(matmul_flops=speed, matmul_dtype=timed.dtype_name(), bf16_gain=gain, compute=tokens * per_token, tokens=tokens,
                epochs=tokens / data_tokens, rung=list(rung), nearest=list(nearest), given=sorted(given))


def make_trainer(model, rt, ddp, log, peak_lr):
    """The model on the device, its compiled (and under torchrun DDP-wrapped) copy that the step
    runs, the optimizer and float16's grad scaler, as a model.Trainer; or off-load mode's trainer,
    which keeps the blocks in host memory and streams them through the device (the same interface)."""
    if offload:
        from offload import OffloadTrainer
        log("off-load mode: blocks' masters and AdamW in host memory, streamed through 2 device templates; eager")
        return OffloadTrainer(model, rt, lr=peak_lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    model = model.to(rt.device)
    if optim == "muon":
        from muon import muon_groups  # imported only when asked for
    groups = muon_groups(model, weight_decay) if optim == "muon" else param_groups(model, weight_decay)
    optimizer = rt.optimizer(groups, optim, lr=peak_lr, betas=(beta1, beta2), eps=eps)
    step_model = rt.compile_model(model)
    if ddp:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        step_model = torch.nn.parallel.DistributedDataParallel(step_model, device_ids=device_ids)
    return Trainer(model, optimizer, rt.grad_scaler(), step_model, rt.autocast)


def exit_if_spent(checkpoint, ckpt_path, log, ddp):
    """A resume whose budget is spent ends here, having nothing to train (and so nothing rewritten)."""
    if not budget_spent(budget_progress(checkpoint["tokens"], checkpoint["elapsed"]), checkpoint["step"]):
        return
    log(f"{ckpt_path} has spent this budget (step {checkpoint['step']}, {checkpoint['tokens'] / 1e6:.1f}M tokens in "
        f"{checkpoint['elapsed'] / 60:.1f} min): nothing to do; to train it further, resume it with a larger "
        f"--budget_hours (or --budget_tokens, --max_steps)")
    if ddp:
        runtime.leave_process_group()
    raise SystemExit(0)


def start_run(model_args, ckpt_path, config, master, rt, train_tokens, checkpoint):
    """out_dir made this process's alone (a lock; main took it already where the folder was there), writable,
    with room for a checkpoint (weights and AdamW in float32), and warnings of a run too large for a CPU or its
    data. Returns rank 0's metrics log (files.MetricsLog; None on the other ranks)."""
    if master:
        with torch.device("meta"):  # the counts, without the memory
            model = CrammedBert(**model_args)
        claim_folder(out_dir, need_bytes=12 * model.num_params(), files=("ckpt.pt", "metrics.jsonl"))
        step_flops = model.flops_per_token(mask_rate) * config["batch_size"] * model_args["seq_len"]
        for warning in (rt.device.type == "cpu" and runtime.cpu_warning(step_flops), budget_tokens and
                        repeat_warning(budget_tokens, train_tokens, f"with --budget_tokens={budget_tokens:,}")):
            if warning:
                print(warning)
    if not master:
        return None
    if checkpoint:
        print(f"resuming {ckpt_path} at step {checkpoint['step']}, {checkpoint['elapsed'] / 60:.1f} minutes and "
              f"{checkpoint['tokens'] / 1e6:.1f}M tokens in")
    wandb_run = (wandb_project, wandb_run_name or os.path.basename(os.path.abspath(out_dir))) if wandb_log else None
    return MetricsLog(os.path.join(out_dir, "metrics.jsonl"), not resume, wandb_run, config)


def log_step(metrics, rt, step, loss, step_lr, step_batch, tokens_per_s, mfu, epoch, seconds, tokens, progress,
             skipped):
    """A training log line, printed and recorded; on a GPU with the peak memory since the last one."""
    memory = f" | {rt.peak_memory() / 2 ** 30:.1f} GiB" if rt.device.type == "cuda" else ""
    rt.reset_peak_memory()
    print(f"step {step} | loss {loss:.4f} | lr {step_lr:.2e} | batch {step_batch} | {tokens_per_s:,.0f} tok/s"
          f"{f' | mfu {100 * mfu:.1f}%' if mfu else ''}{memory} | epoch {epoch:.2f} | {seconds / 60:.1f} min | "
          f"{100 * (1 - progress):.0f}% of the budget left"
          f"{f' | {skipped} updates skipped (non-finite)' if skipped else ''}")
    metrics.write(dict(kind="train", step=step, elapsed=round(seconds, 2), tokens=tokens, loss=loss, lr=step_lr,
                       batch=step_batch, tokens_per_s=round(tokens_per_s), mfu=mfu, skipped=skipped))


def divergence_stop(in_a_row, step, last_saved, ckpt_path, vocab_size):
    """The one-line stop after max_skipped_steps diverged steps, naming the checkpoint to resume."""
    saved = last_saved is not None
    where = f"the last checkpoint is {ckpt_path} at step {last_saved}" if saved else "no checkpoint was saved"
    return SystemExit(f"error: {in_a_row} steps in a row diverged (a non-finite gradient, or a loss above "
                      f"{math.log(vocab_size) + 1:.2f}) up to step {step}; {where}: lower --lr and "
                      f"{'resume it' if saved else 'start again'}")


def finish(model, state, metrics, val_tokens, rt, micro, signum, last_saved, ckpt_path):
    """The last checkpoint (`state`) and the last lines: for a run stopped before its end (state's
    `final` is false), the signal that stopped it (signum: this process's, or None for another
    rank's); else the graphs compiled, fill-in examples and the final figures."""
    step, tokens, seconds, meta = state["step"], state["tokens"], state["elapsed"], state["meta"]
    final = run_eval(model, val_tokens, meta, rt, micro, metrics, step, tokens, seconds) if state["final"] else None
    save(ckpt_path, model, state, val_tokens, rt, micro, last_saved, at_end=True)
    if not state["final"]:
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        print(f"stopped by {name} at step {step} ({tokens / 1e6:.1f}M tokens, {seconds / 60:.1f} min): saved {ckpt_path}; "
              f"continue with the same command and --resume=True")
        return
    if rt.compile:
        print(f"torch.compile built {runtime.compiled_graphs()} graph(s) for the training step")
    if fill_in_examples:
        enc = make_encoding(parse_ranks(state["tokenizer"]), meta["special_ids"])
        for line in fill_in(model, val_tokens, meta, enc, rt, fill_in_examples, seed):
            print(line)
    print(f"final: step {step} | val loss {final[0]:.4f} (at init {state['init_val_loss']:.4f}) | masked-token "
          f"accuracy {final[1]:.3f} | {tokens / 1e6:.1f}M tokens in {seconds / 60:.1f} min | saved {ckpt_path}")


if __name__ == "__main__":
    # signals before the loop (StopRequest takes them from there on), a machine's fault anywhere
    settings = configure(globals(), sys.argv[1:], ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS)
    runtime.guarded(main, f"{os.path.join(out_dir, 'ckpt.pt')} keeps the last checkpoint saved: continue with "
                    f"--resume=True (or, if none was saved yet, run the same command again)", settings)
