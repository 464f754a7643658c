"""Wall-clock-budgeted MLM pretraining of crammed BERT.

    python train.py                                     # the real run: 24 hours on data/fineweb-edu, one GPU
    python train.py config/train_quickstart.py          # a few minutes on a CPU
    python train.py config/recipe_reference.py config/shape_paper.py  # the paper's recipe and shape exactly
    torchrun --standalone --nproc_per_node=8 train.py --budget_hours=3
    python train.py --resume=True                       # continue out_dir/ckpt.pt

The budget (hours, compilation included; or tokens) picks the shape, final batch and peak lr unless given
(cram/budget.py); the schedules follow its share spent, so a run ends on time on any hardware. Ctrl-C, SIGTERM and
process.STOP_SIGNALS' others finish the step, save and exit 128 + the signal; --resume=True continues there."""
import dataclasses
import os
import signal
import sys
import time
from collections import namedtuple

from configurator import config_keys, configure, disallowed, named  # first: it checks for the temporary folder that torch's import needs
import torch

from cram import budget, data, memory, process, runtime
from cram.budget import LADDER, SHAPE_FIELDS, shape_of
from cram.data import Batches, evaluate, fill_in, load_run_data, make_encoding, repeat_warning
from cram.files import MetricsLog, check_own_files, check_resume, claim_folder, load_checkpoint, parse_ranks, save_peak_bytes
from cram.guard import BadSteps, Saves, SpikeWatch
from cram.offload import OffloadTrainer, check_settings as check_offload
from model import DATA_FIELDS, MASK_RATE, CrammedBert, Masking, ModelConfig, Trainer, param_groups

# -----------------------------------------------------------------------------
data_dir = "data/fineweb-edu"  # written by prepare.py: this one by `python prepare.py config/prepare_fineweb.py`
out_dir = "out"           # ckpt.pt and metrics.jsonl go here
budget_hours = 24.0       # > 0: training time, compilation included; the schedules follow the share spent
budget_tokens = 0         # >= 0: if above 0, the schedules follow tokens trained instead of the clock (reproducible runs)
max_steps = 0             # >= 0: also stop after this many optimizer steps (0: budget only); this command's, not kept
resume = False            # continue from out_dir/ckpt.pt, with its run's settings unless given (cram/budget.py)
resume_from = ""          # with --resume=True: an earlier checkpoint to continue instead (out_dir's ckpt_<step>.pt, or a path)
# a 0 below asks the budget's rule (cram/budget.py), a resume its checkpoint's: settle() writes the values that run here
n_layers = 0              # >= 0: 0: by the budget
d_model = 0               # >= 0: 0: by the budget; when given, n_heads and d_ffn follow it (heads of 64, 4x) unless given
n_heads = 0               # >= 0: 0: by the budget
d_ffn = 0                 # >= 0: 0: by the budget
# every other field of model.py's ModelConfig (smear, glu, ...) is a setting too (--help); vocabulary, sequence length: the data
# objective
mask_rate = MASK_RATE     # (0, 1): share of each row's tokens to predict (80% [MASK], 10% random, 10% kept)
mask_rate_start = 0.0     # [0, 1): if above 0, the share falls from this to mask_rate over the budget (see mask_rate_at)
mask_levels = 4           # [1, 8]: ... in this many steps (1: start throughout; torch.compile keeps 8 graphs)
eval_mask_rate = MASK_RATE  # (0, 1): validation masks this share whatever mask_rate is, so recipes compare
# optimizer and schedules
optim = "adamw"           # {runtime.OPTIMIZERS}: adamw (reference); muon: Muon on the blocks' matrices, AdamW on the rest
lr = 0.0                  # [0, inf): peak learning rate; 0: by the width, 1e-3 x (768 / d_model) ** 0.5 (budget.lr_for_width; AdamW's)
beta1 = 0.9               # [0, 1)
beta2 = 0.98              # [0, 1)
eps = 1e-12               # >= 0
weight_decay = 0.01       # >= 0: not on biases, norms and scalars
grad_clip = 0.5           # >= 0: gradient norm clipping (0: off)
lr_schedule = "triangle"  # {triangle, warmup_linear}: the reference's (see lr_at), or original BERT's
warmup = 0.01             # [0, 1): warm-up share of the budget for 'warmup_linear'
micro_batch = 0           # >= 0: most sequences per device per forward pass; 0: on a GPU the largest that fits, else 32
batch_size = 0            # >= 0: sequences per optimizer step at the end of the ramp; 0: 4096 x (sequences / 54M) ** 0.64, a power of 2 in 32-8192
batch_ramp = 0.6          # [0, 1]: share of the budget over which the batch grows from batch_ramp_start to batch_size
batch_ramp_start = 0      # >= 0: sequences per step at the ramp's start, growing by as many at a time, on any device; 0: 128
# system
device = "auto"           # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = "auto"            # {auto, float32, bfloat16, float16}: autocast; auto: runtime.auto_dtype (a resume keeps its own)
compile = True            # torch.compile the training step (inductor; on a CPU too)
compile_mode = "default"  # torch.compile's mode (max-autotune and reduce-overhead record CUDA graphs: a GPU only)
join_minutes = 10.0       # > 0: under torchrun, how long a process waits for the others to start and set up (one that refused ends the rest)
offload = False           # the blocks' weights and AdamW state in host memory, streamed through the GPU (cram/offload.py)
peak_tflops = 0.0         # >= 0: for MFU; 0 looks the GPU up by name
seed = 0                  # [0, 4294967295]: model initialisation, data order and masks (2^32 seeds)
data_order = "shuffled"   # {shuffled, file}: file: the first epoch reads train.bin in its order (tools/curriculum.py's)
log_interval = 10         # >= 1: steps
max_skipped_steps = 5     # >= 1: stop after this many steps in a row that diverged or spiked (see train.py's loop)
spike_threshold = 6.0     # >= 0: a loss this many s.d.s of its step-to-step noise and 10% over its ~50 steps' mean is a spike: not applied; 0: off
keep_checkpoints = 3      # >= 1: the saves kept: ckpt.pt (the newest sound one) and those before it, as ckpt_<step>.pt
eval_interval_minutes = 30.0  # >= 0
eval_sequences = 4096     # >= 1: validation sequences per evaluation (fixed masks)
ckpt_interval_minutes = 60.0  # >= 0: 0 saves after every step (outside the budget's clock); only sound weights
fill_in_examples = 3      # >= 0: at the end, fill-in-the-blank examples from the validation text
wandb_log = False         # also log to Weights & Biases (pip install wandb; imported only when on)
wandb_project = "cram"
wandb_run_name = ""       # default: the name of out_dir
# -----------------------------------------------------------------------------


def lr_at(progress, peak, schedule="triangle", warmup=0.01):
    """Learning rate at a fraction `progress` of the budget. triangle (the reference's): 25% of peak at the start, peak at
    75%, linear to 0 at the end; warmup_linear (BERT's): linear warm-up over `warmup`, then linear decay to 0."""
    if schedule == "triangle":
        return peak * max(0.0, min(0.25 + progress, 4.0 - 4.0 * progress))
    if schedule == "warmup_linear":
        return peak * progress / warmup if progress < warmup else peak * max(0.0, (1.0 - progress) / (1.0 - warmup))
    raise ValueError(f"unknown lr_schedule '{schedule}' (triangle, warmup_linear)")


def mask_rate_at(progress, end, start=0.0, levels=4):
    """The masking rate at a fraction `progress` of the budget: `end`, or from `start` (if not 0) a linear fall to `end`
    (Ankner et al. 2023) in `levels` equal steps, each a static shape for a while (one level: `start` throughout)."""
    if not start:
        return end
    level = min(levels - 1, int(progress * levels))
    return start + (end - start) * level / max(1, levels - 1)


def batch_size_at(progress, start, final, ramp):
    """Sequences per optimizer step: a linear ramp from `start` to `final`, reached at `ramp` of the budget, rounded
    down to a multiple of `start` (`final` throughout where start >= final). The same on any device and process count."""
    if progress >= ramp or start >= final:
        return final
    return min(final, int(start + (final - start) * progress / ramp) // start * start)


def budget_progress(tokens, seconds, budget_tokens, budget_hours):
    """The share of the budget spent: of budget_tokens when set, else of budget_hours' seconds."""
    return tokens / budget_tokens if budget_tokens else seconds / (3600 * budget_hours)


def budget_spent(progress, step, max_steps):
    """Whether a run at this share of its budget and this step has no step left to take."""
    return progress >= 1.0 or bool(max_steps and step >= max_steps)


def check_settings(world, config, rt, given=None):
    """One-line errors for settings that cannot run together (each one's range: the configurator's): before any work,
    with `given` (where each came from), and once budget.settle has the shape and batch (till then, unset: a rung's)."""
    model, optim = ModelConfig.from_settings({**config, **shape_of(LADDER[0], config)}), config["optim"]
    if config["wandb_log"] and not process.installed("wandb"):
        raise SystemExit("error: --wandb_log=True needs wandb: pip install wandb (or leave --wandb_log off)")
    data.split_micro_batches(world, 1, config["batch_size"] or world, config["batch_ramp_start"], config["batch_ramp"])  # 0: unsettled
    if config["resume_from"] and not config["resume"]:
        raise SystemExit(f"error: {named('resume_from', given)}={config['resume_from']} continues a run: add --resume=True")
    # the rate in effect, where given (not: the resumed run's), is this optimizer's if typed, or set by a file that also
    # set this optimizer (a file that keeps AdamW set AdamW's): whoever set what, in any order of the arguments
    lr_from = [s for s, v in (given or {}).get("lr", {}).items() if v == config["lr"]]
    chose = [s for s in lr_from if s == "--" or given.get("optim", {}).get(s) == optim]
    if not runtime.OPTIMIZERS[optim].width_lr and (not config["lr"] or lr_from and not chose):
        why = f"{lr_from[-1]}'s lr={config['lr']:g}" if config["lr"] else "the width's rule (budget.lr_for_width)"
        raise SystemExit(f"error: {named('optim', given)}={optim} needs --lr: {why} is AdamW's, and its row in "
                         f"runtime.OPTIMIZERS does not take it (width_lr)")
    if config["offload"]:
        check_offload(world, model, optim, rt.dtype)


Evaluation = namedtuple("Evaluation", "model val_tokens meta micro rt metrics")  # what evaluation and saving read


def run_eval(evaluation, step, tokens, seconds):
    """The validation loss and masked-token accuracy, printed and recorded."""
    e = evaluation
    val_loss, accuracy = evaluate(e.model, e.val_tokens, e.meta, e.micro, e.rt, eval_sequences, eval_mask_rate)
    print(f"eval  step {step} | val loss {val_loss:.4f} | masked-token accuracy {accuracy:.3f} | {seconds / 60:.1f} min, "
          f"{tokens / 1e6:.1f}M tokens{f' | on all {len(e.val_tokens)} sequences' * (len(e.val_tokens) < eval_sequences)}")
    e.metrics.write(dict(kind="eval", step=step, elapsed=round(seconds, 2), tokens=tokens, val_loss=val_loss,
                          accuracy=accuracy))
    return val_loss, accuracy


def checkpoint_state(trainer, about, step, seconds, tokens, init_loss, final, watch):
    """A checkpoint: the training state, the run's place in its schedules and data, `watch`'s history, `about` it."""
    return dict(trainer.state_dict(), **about, step=step, elapsed=seconds, tokens=tokens, init_val_loss=init_loss,
                final=final, spike_watch=watch.state_dict())


def main(config, given):
    ddp, world = runtime.launcher()  # under torchrun, or one process
    rt, rank, resumed = setup_device(config, world, ddp, given)  # resumed: (its checkpoint, file, lines) or Nones
    master, log = rank == 0, (print if rank == 0 else (lambda *a, **k: None))
    run_data = load_run_data(config["data_dir"])  # the data a resume trained on, unless given
    model_args, remainder_micro, pick, opening = settle(config, resumed, run_data, rt, world, ddp, master, log)
    # from here on every global is the value that runs: the opening lines show what the budget picked or a resume changed
    (checkpoint, source, _), (meta, train_tokens, val_tokens, tokenizer_text) = resumed, run_data
    seq_len, n_rows = meta["seq_len"], len(train_tokens)
    saves = Saves(os.path.join(out_dir, "ckpt.pt"), keep_checkpoints, checkpoint, source)  # ckpt.pt: the newest checkpoint
    metrics = open_out_dir(model_args, saves, config, rt, n_rows * seq_len, checkpoint, opening) if master else None

    # -------------------------------------------------------------------- the model and its optimizer
    torch.manual_seed(seed)
    model = CrammedBert(**model_args)  # on the host: the same initialisation in both modes
    log(f"model: {model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M in matmuls), "
        f"{model.config.flops_per_token(mask_rate) / 1e9:.3f} GFLOP/token | data: {n_rows:,} train sequences of {seq_len} "
        f"from {meta['source']} | device: {rt.describe()}{f' x{world}' if ddp else ''}\n"
        f"{budget.ramp_line(batch_ramp_start, batch_size, batch_ramp, micro_batch, remainder_micro)}")
    trainer = make_trainer(model, rt, ddp, log, lr, checkpoint)
    evaluation = Evaluation(trainer.model, val_tokens, meta, micro_batch, rt, metrics)  # the model on the device
    step, tokens, seconds = (checkpoint["step"], checkpoint["tokens"], checkpoint["elapsed"]) if checkpoint else (0, 0, 0.)
    watch = SpikeWatch(spike_threshold, runtime.mean_over_ranks if ddp else None, **(checkpoint or {}).get("spike_watch", {}))
    bad_steps = BadSteps(max_skipped_steps, saves, meta["vocab_size"], spike_threshold)
    about = dict(model_args=model_args, config=config, data_dir=os.path.realpath(data_dir), meta=meta, tokenizer=tokenizer_text,
                 budget=pick, run=metrics and metrics.run)  # run: the id on its metrics.jsonl lines
    init_loss = (checkpoint or {}).get("init_val_loss") or (run_eval(evaluation, step, tokens, seconds)[0] if master else None)
    batches = Batches(train_tokens, meta, rank, world, rt.device, seed, data_order, split=(micro_batch, remainder_micro))
    masking, stop_request, peak_flops = Masking.from_settings(config), process.StopRequest(), runtime.peak_flops(rt.device, peak_tflops * 1e12)

    # -------------------------------------------------------------------- the loop
    # the clock (`seconds`): from an iteration's top to its step's end; set-up, logging, evaluation and saving are off it
    last_eval = last_ckpt = seconds
    window, warned = (seconds, tokens), budget_tokens > 0
    while True:
        started = time.perf_counter()
        # DDP: every rank follows rank 0's clock, so all take the same batch size, and all stop together
        seconds, stop = runtime.rank0_clock(seconds, stop_request.signum is not None, master, rt.device)
        progress = budget_progress(tokens, seconds, budget_tokens, budget_hours)
        if budget_spent(progress, step, max_steps) or stop:
            break
        step_batch = batch_size_at(progress, batch_ramp_start, batch_size, batch_ramp)  # schedules: pure functions
        step_lr = lr_at(progress, lr, lr_schedule, warmup)  # lr: the peak
        step_mask = dataclasses.replace(masking, mask_rate=mask_rate_at(progress, mask_rate, mask_rate_start, mask_levels))
        # this rank's masked micro-batches of its share of the batch after `tokens // seq_len` sequences (384, 2 ranks, 128: 128+64)
        micro_batches = batches.step(tokens // seq_len, step_batch, step_mask)
        # forward and backward per micro-batch, clipped, one update (model.Trainer.step) unless the loss (over ranks) spikes
        _, applied = trainer.step(micro_batches, step_lr, grad_clip, accept=watch.judge)
        step, tokens = step + 1, tokens + step_batch * seq_len  # an update skipped or not: its data and time are spent
        seconds += stop_request.step_seconds(started)  # stopped meanwhile (Ctrl-Z): the pause is not training
        bad_steps.count(step, applied, watch, trainer.scaler)  # max_skipped_steps in a row diverged or spiked: SystemExit
        if master and step % log_interval == 0:  # logging, evaluation and saving: rank 0 alone
            tokens_per_s = (tokens - window[1]) / (seconds - window[0])
            mfu = model.config.flops_per_token(step_mask.mask_rate) * tokens_per_s / world / peak_flops if peak_flops else None
            log_step(metrics, rt, dict(kind="train", step=step, elapsed=round(seconds, 2), tokens=tokens, loss=watch.loss,
                                       lr=step_lr, batch=step_batch, tokens_per_s=round(tokens_per_s), mfu=mfu,
                                       skipped=bad_steps.skipped), tokens / (n_rows * seq_len), progress)
            warned = warned or budget.warn_repeats(tokens, seconds, tokens_per_s, n_rows * seq_len, budget_hours)
            window = (seconds, tokens)
        if master and seconds - last_eval >= eval_interval_minutes * 60:
            last_eval = seconds
            run_eval(evaluation, step, tokens, seconds)
        if master and seconds - last_ckpt >= ckpt_interval_minutes * 60 and not bad_steps.in_a_row:  # never while it spikes
            last_ckpt = seconds
            saves.save_if_sound(evaluation, checkpoint_state(trainer, about, step, seconds, tokens, init_loss, False, watch),
                                eval_mask_rate)

    # -------------------------------------------------------------------- the end; the clock has stopped
    if master:
        finish(evaluation, checkpoint_state(trainer, about, step, seconds, tokens, init_loss, not stop, watch),
               stop_request.signum, saves)
    if ddp:  # DDP's reducer freed before its process group, which waits for rank 0 (runtime.leave_process_group)
        del trainer
        runtime.leave_process_group()
    if stop:  # the shell's status for the signal (130 for SIGINT, 143 for SIGTERM, ...): the run is not finished
        process.exit_stopped(stop_request.signum or signal.SIGTERM)


def setup_device(config, world, ddp, given):
    """(the Runtime, this process's rank, (the checkpoint resumed or None, its file, lines on what it changed)): its
    run's settings kept unless `given` (budget.resume_settings) and checked, into `config`, before torchrun's processes
    join (a refusal ends the others after join_minutes); rank 0's precision on every rank."""
    resume_from = config["resume_from"]
    source = resume_from if os.path.dirname(resume_from) else os.path.join(config["out_dir"], resume_from or "ckpt.pt")
    checkpoint = load_checkpoint(source, "resume") if config["resume"] else None
    carried, said = budget.resume_settings(checkpoint, config, given) if checkpoint else ({}, [])
    problem = disallowed(globals(), carried)  # checked as a command line's: a fork's optimizer, a newer cram's schedule
    if problem:
        raise SystemExit(f"error: {source} was trained with a setting this cram does not have ({problem}): resume "
                         f"it with the cram that wrote it")
    config.update(carried)
    saved = checkpoint.get("config", {}) if checkpoint else {}
    rt = runtime.setup(config["device"], config["dtype"], config["compile"] and not config["offload"],  # off-load: eager
                       config["compile_mode"], (saved.get("device"), saved.get("dtype")))
    check_settings(world, config, rt, given)
    rank = runtime.join_process_group(rt.device, config["join_minutes"]) if ddp else 0
    rt = runtime.rank0_precision(rt) if ddp else rt
    rt.optim = config["optim"]  # the optimizer rt.optimizer builds and the memory check counts (runtime.OPTIMIZERS)
    config.update(device=rt.device.type, dtype=rt.dtype_name())
    if rank == 0 and os.path.isdir(config["out_dir"]):  # before any work, a folder another run holds (open_out_dir makes a new one)
        claim_folder(config["out_dir"], files=("ckpt.pt", "metrics.jsonl"))
    check_own_files(config["out_dir"], checkpoint, source)  # ... or another run's files, which this one would replace or prune
    return rt, rank, (checkpoint, source, said)


def settle(config, resumed, run_data, rt, world, ddp, master, log):
    """Every setting the run runs with, settled before any work and written into the globals once: a resume's own, the
    budget's shape, final batch, peak rate and ramp's start (budget.settle), the micro-batch that fits (memory) and
    every batch's split (data.split_micro_batches). Returns (model_args, remainder_micro, the pick, opening lines)."""
    (checkpoint, source, said), (meta, train_tokens, _, tokenizer_text) = resumed, run_data
    data_args, lr_given = dict(vocab_size=meta["vocab_size"], seq_len=meta["seq_len"]), config["lr"]
    settled, pick = budget.settle(config, checkpoint, data_args=data_args, data_tokens=train_tokens.size, rt=rt,
                                  world=world, master=master, ddp=ddp)
    config.update(settled)  # the shape, final batch, peak rate and ramp's start
    check_settings(world, config, rt)  # with the shape and batch settled
    model_args = dataclasses.asdict(ModelConfig.from_settings(config, **data_args))
    check_resumable(checkpoint, source, model_args, tokenizer_text, meta, config, log, ddp)  # before any probe
    cap = memory.choose_micro_batch(config["micro_batch"], config["batch_size"], model_args, rt, world=world,
                                    mask_rate=max(config["mask_rate"], config["mask_rate_start"]),
                                    offload=config["offload"], log=log)
    # what runs: the fewest micro-batches of at most `cap`, the rest of a ramp's batch in micro-batches of remainder_micro
    config["micro_batch"], remainder_micro = data.split_micro_batches(world, cap, config["batch_size"],
                                                                      config["batch_ramp_start"], config["batch_ramp"])
    globals().update({k: config[k] for k in config_keys(globals()) if k in config})
    return model_args, remainder_micro, pick, said if checkpoint else budget.start_lines(pick, config, meta["seq_len"], lr_given)


def make_trainer(model, rt, ddp, log, peak_lr, checkpoint):
    """A model.Trainer (the model on the device, its compiled, DDP-wrapped copy, the optimizer, float16's scaler) or
    off-load mode's, with `checkpoint`'s training state if one is resumed (either mode's: they share the format)."""
    if offload:
        log("off-load mode: blocks' masters and AdamW in host memory, streamed through 2 device templates; eager")
        trainer = OffloadTrainer(model, rt, lr=peak_lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    else:
        model = model.to(rt.device)
        optimizer = rt.optimizer(param_groups(model, weight_decay, optim), lr=peak_lr, betas=(beta1, beta2), eps=eps)
        step_model = rt.compile_model(model)
        if ddp:
            device_ids = [rt.device.index] if rt.device.type == "cuda" else None
            step_model = torch.nn.parallel.DistributedDataParallel(step_model, device_ids=device_ids)
            runtime.set_waits(30)  # set up (DDP's broadcast the last wait of join_minutes): the work's waits
        trainer = Trainer(model, optimizer, rt.grad_scaler(), step_model, rt.autocast)
    if checkpoint:
        trainer.load_state_dict(checkpoint)
    return trainer


def check_resumable(checkpoint, ckpt_path, model_args, tokenizer_text, meta, config, log, ddp):
    """A resume (`checkpoint`, or None) of the same run on the same data (files.check_resume) with budget left; one
    whose budget is spent ends here, nothing rewritten."""
    if not checkpoint:
        return
    check_resume(ckpt_path, checkpoint, model_args, tokenizer_text, config["optim"], config["data_dir"], meta)
    progress = budget_progress(checkpoint["tokens"], checkpoint["elapsed"], config["budget_tokens"], config["budget_hours"])
    if not budget_spent(progress, checkpoint["step"], config["max_steps"]):
        return
    kind = "max_steps" if progress < 1.0 else "budget_tokens" if config["budget_tokens"] else "budget_hours"
    log(f"{ckpt_path} has spent this budget (step {checkpoint['step']}, {checkpoint['tokens'] / 1e6:.1f}M tokens in "
        f"{checkpoint['elapsed'] / 60:.1f} min): nothing to do; to train it further, resume it with a larger "
        f"--{kind} (now {config[kind]})")
    if ddp:
        runtime.leave_process_group()
    raise SystemExit(0)


def open_out_dir(model_args, saves, config, rt, train_tokens, checkpoint, opening):
    """Rank 0's: out_dir locked, writable, with room for its saves at their peak; warnings of a run too large for a CPU
    or its data; the opening lines (`opening`, or where a resume starts, Saves.branch). Returns the MetricsLog."""
    with torch.device("meta"):  # the exact counts, without the memory
        model = CrammedBert(**model_args)
    each = max(12 * model.num_params() + 32 * model_args["vocab_size"] + 2 ** 20,  # weights, AdamW, tokenizer, records
               os.path.getsize(saves.last_path) if checkpoint else 0)  # or the resumed one's size
    claim_folder(out_dir, need_bytes=save_peak_bytes(saves.path, keep_checkpoints, each, saves.last, saves.branched),
                 files=("ckpt.pt", "metrics.jsonl"))
    step_flops = model.config.flops_per_token(mask_rate) * config["batch_size"] * model_args["seq_len"]
    for warning in (rt.device.type == "cpu" and runtime.cpu_warning(step_flops), budget_tokens and
                    repeat_warning(budget_tokens, train_tokens, f"with --budget_tokens={budget_tokens:,}")):
        if warning:
            print(warning)
    later = saves.branch()
    if checkpoint:
        set_aside = f"; the later ones set aside, kept: {', '.join(later)}" if later else ""
        print(f"resuming {saves.last_path} at step {checkpoint['step']}, {checkpoint['elapsed'] / 60:.1f} minutes and "
              f"{checkpoint['tokens'] / 1e6:.1f}M tokens in{set_aside}")
    for line in opening:
        print(line)
    wandb_run = (wandb_project, wandb_run_name or os.path.basename(os.path.abspath(out_dir))) if wandb_log else None
    return MetricsLog(os.path.join(out_dir, "metrics.jsonl"), not resume, wandb_run, config, (checkpoint or {}).get("run"))


def log_step(metrics, rt, record, epoch, progress):
    """`record` (metrics.jsonl's) printed, with the epoch, the budget left and a GPU's peak memory, and recorded."""
    peak_memory = f" | {rt.peak_memory() / 2 ** 30:.1f} GiB" if rt.device.type == "cuda" else ""
    rt.reset_peak_memory()
    mfu, skipped = record["mfu"], record["skipped"]
    print(f"step {record['step']} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | batch {record['batch']} | "
          f"{record['tokens_per_s']:,} tok/s{f' | mfu {100 * mfu:.1f}%' if mfu else ''}{peak_memory} | epoch {epoch:.2f} | "
          f"{record['elapsed'] / 60:.1f} min | {100 * (1 - progress):.0f}% of the budget left"
          f"{f' | {skipped} updates skipped (non-finite or spikes)' if skipped else ''}")
    metrics.write(record)


def finish(evaluation, state, signum, saves):
    """The last checkpoint (`state`) and lines: a run stopped early, its signal (signum; None: another rank's); a
    finished one (`final`), the graphs compiled, fill-in examples and the final figures."""
    step, tokens, seconds, meta = state["step"], state["tokens"], state["elapsed"], state["meta"]
    final = run_eval(evaluation, step, tokens, seconds) if state["final"] else None
    saves.save_if_sound(evaluation, state, eval_mask_rate, at_end=True)
    if not state["final"]:
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        print(f"stopped by {name} at step {step} ({tokens / 1e6:.1f}M tokens, {seconds / 60:.1f} min): saved {saves.path}; "
              f"continue with the same command and --resume=True")
        return
    if evaluation.rt.compile:
        print(f"torch.compile built {runtime.compiled_graphs()} graph(s) for the training step")
    if fill_in_examples:
        enc = make_encoding(parse_ranks(state["tokenizer"]), meta["special_ids"])
        for line in fill_in(evaluation.model, evaluation.val_tokens, meta, enc, evaluation.rt, fill_in_examples, seed):
            print(line)
    print(f"final: step {step} | val loss {final[0]:.4f} (at init {state['init_val_loss']:.4f}) | masked-token "
          f"accuracy {final[1]:.3f} | {tokens / 1e6:.1f}M tokens in {seconds / 60:.1f} min | saved {saves.path}")


if __name__ == "__main__":
    # signals before the loop (StopRequest takes them from there on), a machine's fault anywhere
    settings = configure(globals(), sys.argv[1:], ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS, given=(given := {}))
    process.guarded(main, f"{os.path.join(out_dir, 'ckpt.pt')} keeps the last checkpoint saved: continue with "
                    f"--resume=True (or, if none was saved yet, run the same command again)", settings, given)
