"""Masked-language-model (MLM) pretraining of crammed BERT, under a budget of training time or of tokens.

    python train.py                                     # the real run: 24 hours on data/fineweb-edu, one GPU
    python train.py config/train_quickstart.py          # a few minutes on a CPU
    python train.py config/recipe_reference.py config/shape_paper.py  # the paper's recipe and shape
    torchrun --standalone --nproc_per_node=8 train.py --budget_hours=3
    python train.py --resume=True                       # continue out_dir/ckpt.pt

One training step (the loop in main) does five things. The table below works one step through in two runs. A row is
one sequence of seq_len tokens cut from train.bin (the code says rows and sequences alike).
- The A6000's day in tokens, `python train.py --budget_tokens=6900000000`: about the tokens that the paper's 24 hours on
  an RTX A6000 buy. At the defaults it trains 16 x 768 with a final batch of 4096 and a peak rate of 1e-3, on any
  machine. The step shown starts 30% into the budget, after 27,304 steps (counted step by step with batch_size_at). (The
  default budget of 24 hours picks the same on an A6000, but what it picks depends on the machine's speed.) With the
  paper's recipe and batch (config/recipe_reference.py and config/shape_paper.py) this step reads 4,096 rows (its final
  batch is 8192; the reference code, which rounds its ramp up, reads 4,224), at the same rate, without smear (0.623
  GFLOP a token).
- The README's quickstart: config/train_quickstart.py on data/pydocs, with 4 x 256, a vocabulary of 8,192, a batch
  that starts at 32 rows (its batch_ramp_start) and ends at 64, and a peak rate of 2e-3. The step shown starts 1:15
  into its 5 minutes of training time, a quarter of the budget.
    what the step does                      decided by                  the A6000's day, 30%      quickstart, 25%
    1. reads the next rows of train.bin     batch_size_at, rows_at      2,048 rows of 128 tokens  32 rows of 128
    2. masks k tokens in each row           masked_count, mask_tokens   k = 32: 26/3/3            k = 32: 26/3/3
    3. the loss: the mean cross-entropy     CrammedBert.mlm_loss        over 65,536 masked        over 1,024 masked
    4. the backward pass                    Trainer.backward            the mean's gradients      the mean's gradients
    5. clips the gradients' norm to 0.5,    Trainer.update, lr_at       rate 5.5e-4               rate 1e-3
       then AdamW updates the weights                                   = 1e-3 x (0.25 + 0.30)    = 2e-3 x (0.25 + 0.25)
    then the count of tokens read grows     the loop                    + 262,144                 + 4,096
    what the step costs                     flops_per_token             1.65e14 FLOPs,            8.7e10 FLOPs,
                                                                        3.3 s planned             0.45-0.96 s measured
Where the A6000's values come from (the quickstart's follow the same way):
    rows    2,048: the batch's line at 30%, 128 + (4096 - 128) x 0.30 / 0.60 = 2,112, rounded down to a multiple of
            128 (batch_size_at)
    k       round(0.25 x 128) = 32 masked tokens a row: round(0.8 x 32) = 26 shown as [MASK], round(0.9 x 32) - 26 = 3
            as a random token, and the other 3 as themselves
    rate    peak x (0.25 + progress) before 75% of the budget, then peak x 4 x (1 - progress) (lr_at)
    FLOPs   0.630e9 a token (flops_per_token) x 262,144 tokens = 1.65e14
    3.3 s   1.65e14 / 5e13 FLOP/s: the budget expects a step at width 768 to run at half an A6000's 100 TFLOP/s
            matmul (budget.step_efficiency), about 79,000 tokens/s. The training line's MFU divides by the datasheet's
            peak instead, 154.8 TFLOP/s for an A6000: about 32% at that speed
The loop in main says why each stage is so and names the function that does it. Then the step count grows by 1 and
training time by the step's time, even when the update was skipped. The quickstart takes 250 to 530 steps on the 2-core
CPUs measured so far: 0.45 to 0.96 s for a step of 32 rows, twice that for 64 (at 1:15 of the README's run of 465 steps,
about step 145). Among the settings below lr and batch_size are 0: start-up decides them unless a config file or the
command line gives them (the quickstart's does), and the start-up line "settled:" prints the values used.

The budget is a number of hours of training time, or a number of tokens. Training time counts the training steps only
(their compilation included): set-up, evaluation and saving are not counted, and neither is most of a pause. The run's
progress is the fraction of the budget used so far. A step's batch size, learning rate and masking rate are functions of
the progress at the step's start (schedules_at), not of the step count. So on any hardware the schedules are at the same
point when the same share of the budget is used (the same point of the budget, not the same step: under a budget of
hours, the step a point falls on depends on the machine's speed). (A resume given a larger budget is the exception: its
schedules go on from its progress so far under the new budget, and its batch ramp still ends where it did.) The run
stops when the budget is used, or earlier at max_steps. Unless you give them, the budget also picks the model's shape
and the final batch size, and the shape's width gives the peak learning rate: the comment above n_layers, below, says
how in short. So in a new run, a larger or smaller budget stretches or shrinks every schedule, and picks again whichever
of the shape, the final batch and the peak rate you left at 0. The masking rates stay as they are. Evaluation and saving
are off the clock: a run takes longer on the wall clock than its budget of hours.

Ctrl-C, SIGTERM or another stop signal (process.STOP_SIGNALS: SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU too) during training
finishes the current step, saves a checkpoint (unless the weights have diverged) and exits, and --resume=True continues
from there. Before training starts, it exits at once and saves nothing. The comment above main says where the rest is,
and docs/training.md says all of this in full."""
import dataclasses
import functools
import math
import os
import signal
import sys
import time

from configurator import config_keys, configure  # first: it checks for the temporary folder that torch's import needs
import numpy as np
import torch

from cram import budget, memory, process, runtime, setup
from cram.data import fill_in, get_batch, load_run_data, make_encoding, repeat_warning, to_device
from cram.files import MetricsLog, Saves, all_finite, check_resume, claim_folder, parse_ranks
from cram.offload import OffloadTrainer
from model import (DATA_FIELDS, MASK_RATE, OPTIMIZERS, SHAPE_FIELDS, CrammedBert, Masking, ModelConfig, Trainer,
                   lr_for_width, mask_tokens, masked_count, param_groups)

# -----------------------------------------------------------------------------
# The settings. Each comment opens with the values the setting allows, which the configurator checks.
data_dir = "data/fineweb-edu"  # written by prepare.py (this one by `python prepare.py config/prepare_fineweb.py`)
out_dir = "out"           # the checkpoints (ckpt.pt is the newest), metrics.jsonl and the run's lock file go here
# The budget (see the top of this file). To repeat a run exactly, or to compare two variants fairly: the table in
# main's loop, and docs/training.md's "Comparing runs".
budget_hours = 24.0       # > 0: hours of training time; the schedules follow the run's progress
budget_tokens = 0         # >= 0: if above 0, the budget is this many tokens instead of hours
max_steps = 0             # >= 0: also stop after this many steps in all, counting a resume's earlier steps (0: no limit). The schedules do not shorten to fit it, and a resume does not keep it
resume = False            # continue the run in out_dir/ckpt.pt with its own settings (see checkpoint_state)
resume_from = ""          # with --resume=True: an earlier checkpoint to continue instead (ckpt_<step>.pt, or a path)
dry_run = False           # decide every setting, print the start-up lines and exit without training. It reads the data and refuses what the run would refuse
# A setting left at 0 below is decided at start-up: by the budget in a new run, or from the checkpoint in a resume. main
# writes the decided value here before training starts. The start-up line "settled:" prints each value and why,
# "budget:" what the budget picked (its FLOPs, shape and tokens, and about how many steps), and "batch:" and "schedule:"
# the batch, the learning rate and the masking rate over the budget, with when the run evaluates and saves.
# --dry_run=True prints these lines and stops, on your own machine. In short (docs/training.md, "The budget's pick in
# short", has the rules in full and the picks by budget and GPU; cram/budget.py applies them):
#     shape        of a ladder from 2 x 128 to 24 x 1024, the one whose blocks' weights are nearest
#                  94.4M x (the budget's FLOPs / 4.32e18) ** 0.4: 16 x 768 for the A6000's day
#     final batch  4096 x (the sequences the budget trains / 54M) ** 0.64, as a power of two from 32 to 8192: 4096 there
#     peak lr      1e-3 x (d_model / 768) ** -0.5 (model.lr_for_width): 1e-3 there
n_layers = 0              # >= 0: 0 lets the budget pick the shape (main writes the value here)
d_model = 0               # >= 0: 0 lets the budget pick the shape (main writes the value here)
n_heads = 0               # >= 0: 0 means heads of 64 (or the most heads up to d_model / 64 that divide d_model)
d_ffn = 0                 # >= 0: 0 means 4 x d_model
# Every other field of model.py's ModelConfig is a setting too (--help lists them last). The defaults are the crammed
# recipe (Geiping & Goldstein 2022); "The settings' reasons", below main, says where it differs from BERT's and why.
mask_rate = MASK_RATE     # (0, 1): share of each row's tokens to predict, rounded to whole tokens (MASK_RATE is 0.25, the crammed recipe's)
mask_rate_start = 0.0     # [0, 1): if above 0, the rate starts here and, with mask_levels above 1, moves to mask_rate as a staircase (mask_rate_at)
mask_levels = 4           # [1, 8]: how many rates the staircase has. Each that changes a row's count of masked tokens is one more graph to compile per micro-batch size (1: mask_rate_start throughout)
eval_mask_rate = MASK_RATE  # (0, 1): the masking rate of validation, whatever mask_rate is, so that recipes compare
# The optimizer and the schedules. The width's rule for the peak rate was tuned for AdamW, so an optimizer whose row in
# model.OPTIMIZERS does not take it (width_lr) needs --lr.
optim = "adamw"           # {OPTIMIZERS}: adamw (reference); muon: Muon on the blocks' matrices, AdamW on the rest
lr = 0.0                  # [0, inf): the peak learning rate. 0: 1e-3 x (d_model / 768) ** -0.5 (model.lr_for_width), or a resume's own (main writes the value here)
beta1 = 0.9               # [0, 1)
beta2 = 0.98              # [0, 1): the cramming reference's and RoBERTa's, which found it steadier than BERT's 0.999 with large batches
eps = 1e-12               # >= 0: the cramming reference's (BERT and RoBERTa used 1e-6, which damps the updates of weights whose gradients are small)
weight_decay = 0.01       # >= 0: not on biases, norms and scalars. It is multiplied by the step's rate (decoupled decay, as in AdamW and Muon), so it follows the schedule
grad_clip = 0.5           # >= 0: gradient norm clipping (0: off)
lr_schedule = "triangle"  # {triangle, warmup_linear}: the reference's (see lr_at), or original BERT's
warmup = 0.01             # [0, 1): warm-up fraction of the budget for 'warmup_linear' (see lr_at)
# The batch (stage 1 of the loop in main). What the ramp costs on a GPU: docs/training.md, "The batch ramp".
micro_batch = 0           # >= 0: the most sequences in one forward pass. 0: on a GPU, the largest power of two that fits in 90% of the free memory; otherwise 32, or a process's share of the batch if smaller (main writes the value here)
batch_size = 0            # >= 0: sequences per optimizer step, all processes together, once the ramp is over; 0 lets the budget pick it (main writes the value here)
batch_ramp = 0.6          # [0, 1]: fraction of the budget over which the batch grows from batch_ramp_start to batch_size (at 1 its last jump never comes)
batch_ramp_start = 128    # >= 1: sequences per step at the start, and what the batch grows by at a time (the reference's micro-batch)
# system
device = "auto"           # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = "auto"            # {auto, float32, bfloat16, float16}: autocast's precision; auto: bfloat16 where it is faster
compile = True            # torch.compile the model's forward and loss as one graph (a graph break is an error); clipping and the update run uncompiled
compile_mode = "default"  # torch.compile's mode (max-autotune and reduce-overhead record CUDA graphs: a GPU only)
join_minutes = 10.0       # > 0: under torchrun, how long a process waits for the others to start
offload = False           # the blocks' weights and AdamW state in host memory, streamed through the GPU (cram/offload.py)
peak_tflops = 0.0         # >= 0: the GPU's peak, for MFU; 0 looks the GPU up by name
# What is random, and what two runs with the same settings share: the table in main's loop.
seed = 0                  # [0, 4294967295]: seeds the initial weights, dropout, the data order, the training masks and the fill-in picks
data_order = "shuffled"   # {shuffled, file}: file reads the first epoch in train.bin's order (tools/curriculum.py)
log_interval = 10         # >= 1: print and record a training line every this many steps
max_skipped_steps = 5     # >= 1: stop after this many bad steps in a row (see Bad steps)
spike_threshold = 6.0     # >= 0: a loss this many standard deviations (and 10%) above its recent mean is a spike; its update is skipped (0: off)
keep_checkpoints = 3      # >= 1: how many checkpoints to keep: ckpt.pt, the newest, and older ones as ckpt_<step>.pt
eval_interval_minutes = 30.0  # >= 0: evaluate about every this many minutes of training time (0: every step), and also before a new run's first step and at the end of a finished run
eval_sequences = 4096     # >= 1: validation sequences per evaluation, each with its own fixed mask (Validation)
ckpt_interval_minutes = 60.0  # >= 0: save a checkpoint about every this many minutes of training time (0: every step), but not during a streak of bad steps
fill_in_examples = 3      # >= 0: at the end of a finished run, print this many fill-in-the-blank examples from the validation text
wandb_log = False         # also log to Weights & Biases (pip install wandb; imported only when on)
wandb_project = "cram"
wandb_run_name = ""       # default: the name of out_dir
# -----------------------------------------------------------------------------
# The rest of this file. main comes first: the whole run, with its loop. After it come the step's pieces in the loop's
# order (the clock, the schedules, the micro-batches, the data, bad steps, the training line, validation and saving).
# Then a section of prose, "The settings' reasons" (the recipe against the paper's code and BERT's). Then set-up, which
# decides the settings' values in `config`, and the end. Whole runs in numbers and the budget's pick in full are in
# docs/training.md.



def main(config, given):
    """The whole run. `config` holds every setting, as the top of this file, a config file and the command line set it
    (a 0 still to decide). `given` names the settings a config file or the command line set, and where."""
    # -------------------------------------------------------------------- the settings
    ddp, world = runtime.launcher()  # several processes under torchrun (DDP), or one
    rt, rank, resumed, model_config = setup.device_and_resume(config, world, ddp, given, globals())
    master = rank == 0
    log = print if master else (lambda *args, **kwargs: None)  # rank 0 alone prints, so that a line is printed once
    run_data = load_run_data(config["data_dir"])  # the data a resume trained on, unless given
    model_args, remainder_micro, budget_pick, start_lines = decide_settings(config, model_config, resumed, run_data, rt,
                                                                            world, master, log)
    # From here on, every setting at the top of this file holds the value the run uses: each 0 decided, and in a resume
    # the run's own settings from its checkpoint.
    globals().update({k: config[k] for k in config_keys(globals()) if k in config})
    sizes_at = functools.partial(micro_batch_sizes, world=world, micro=micro_batch, remainder=remainder_micro)
    start_lines += [setup.settled_line(given, config, resumed.checkpoint is not None),
                    setup.ramp_line(batch_ramp_start, batch_size, batch_ramp, micro_batch, remainder_micro),
                    setup.schedule_line(config, schedules_at, sizes_at, model_args["seq_len"])]
    if dry_run:  # the values this command would train with, and why, and the schedules
        log("\n".join(start_lines))
        runtime.leave_process_group()  # under torchrun
        return
    (checkpoint, source, _), (meta, train_tokens, val_tokens, tokenizer_text) = resumed, run_data
    seq_len, n_rows = meta["seq_len"], len(train_tokens)

    # -------------------------------------------------------------------- the model, the output folder, the optimizer
    # torch's generator, seeded here, draws dropout, and one number that keys each initial weight's own draw by the
    # weight's name (model.keyed_generator). A resume does not restore it. The table in the loop says what else the seed
    # fixes.

    torch.manual_seed(seed)
    model = CrammedBert(**model_args)  # built on the CPU, so normal and off-load mode start from the same weights
    saves = Saves(os.path.join(out_dir, "ckpt.pt"), keep_checkpoints, checkpoint, source)  # ckpt.pt: the newest checkpoint
    metrics = open_out_dir(model, saves, config, rt, n_rows * seq_len, checkpoint, start_lines) if master else None
    log(f"model: {model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M in matmuls), "
        f"{model.config.flops_per_token(mask_rate) / 1e9:.3f} GFLOP/token | data: {n_rows:,} train sequences of {seq_len} "
        f"from {meta['source']} | device: {rt.describe()}{f' x{world}' if ddp else ''}")
    trainer = make_trainer(model, rt, ddp, log, config["lr"], checkpoint)
    masking = Masking.from_settings(config)  # the objective's settings; the loop sets each step's masking rate
    watch = SpikeWatch(spike_threshold, **(checkpoint or {}).get("spike_watch", {}))  # the loss's recent history
    bad_steps = BadSteps(max_skipped_steps, saves, meta["vocab_size"], spike_threshold)

    # -------------------------------------------------------------------- the data, and the score before training
    batches = Batches(train_tokens, meta, rank, world, rt.device, seed, data_order)
    # evaluation runs the plain model: the compiled (and DDP-wrapped) copy would compile again for evaluation's shapes
    validation = Validation(trainer.model, val_tokens, meta, micro_batch, rt)
    # How far the run has got: steps taken (a step whose update was skipped counts), `tokens_read`, the input tokens
    # read (every token of a row, masked or not; the loss counts only the masked ones), and `seconds` of training time.
    step, tokens_read, seconds = (checkpoint["step"], checkpoint["tokens"], checkpoint["elapsed"]) if checkpoint else (0, 0, 0.)
    run_info = dict(model_args=model_args, config=config, data_dir=os.path.realpath(data_dir), meta=meta,
                    tokenizer=tokenizer_text, budget=budget_pick, run=saves.run)  # run: the id on its metrics.jsonl lines
    # The score at init: a new run's, before its first step, or its checkpoint's (None where it has none)
    scores = {}  # step -> (val loss, masked-token accuracy) of each evaluation this command runs
    if master and not checkpoint:
        scores[step] = run_eval(validation, metrics, step, tokens_read, seconds)
    init_loss = checkpoint.get("init_val_loss") if checkpoint else scores.get(0, (None,))[0]
    clock = TrainingClock(seconds)  # training time, and a stop signal from here on (TrainingClock has the rules)

    # -------------------------------------------------------------------- the loop
    # The budget is checked at the top of each step, so the last step may end past it by up to one step's time, or one
    # batch's tokens.
    # What step n uses, what each follows, and when two runs at one seed use the same at step n:
    #   what step n uses          follows                                  the same in two runs at step n
    #   its rows, in order        the seed and the rows' sequence numbers  when the tokens read before it match
    #                             in the run (epoch_order, rows_at)
    #   each row's mask           the seed, the row's sequence number and  when the sequence number and the count
    #                             its count of masked tokens (mask_keys,   match (two rates of one count mask
    #                             masked_count)                            the same tokens)
    #   batch, lr, masking rate   the progress: the tokens read, or the    under a budget of tokens; under hours,
    #                             hours on the clock                       only if both went at the same speed,
    #                                                                      compiling included
    #   shape, final batch, peak  the budget, where left at 0 (under       when given: n_layers, d_model,
    #   lr                        hours, with the matmul timed by          batch_size, lr (else a recipe that
    #                             runtime.matmul_speed; budget.decide)     changes the FLOPs per token may move it,
    #                                                                      under a budget of tokens too;
    #                                                                      "settled:" rounds lr to 3 figures, the
    #                                                                      checkpoint's config keeps it whole)
    #   initial weights           the seed and each weight's name          for weights of one name and shape
    #   micro-batch, precision    the machine, where left at 0 and auto    when given (--micro_batch, --dtype)
    #                             (memory.choose_micro_batch and
    #                             runtime.auto_dtype)
    #   dropout (0 by default)    torch's generator, the micro-batch       on one machine with the same
    #                             split and the device                     micro-batch split
    #   the sums' last bits       the kernels (TF32 on a GPU, set in       not promised, even on one machine
    #                             runtime.setup; no deterministic
    #                             algorithms forced)
    # So under a budget of tokens, with the shape, batch_size, lr, micro_batch and dtype given, step n reads the same
    # rows and masks with the same batch and rates in both runs on any machine. Its sums may differ in the last bits
    # (each machine's kernels round differently), so the weights drift apart a little as the steps go on.
    # Under a budget of hours the same rows come in the same order, but they may fall into other steps.
    last_eval = last_ckpt = seconds
    at_last_line = (seconds, tokens_read)  # the clock and the tokens at the last training line, for its tokens/s
    repeats_warned = budget_tokens > 0  # a budget of tokens warned of repeated data at start-up
    while True:
        seconds, stop = clock.start_step()  # under DDP, every process takes rank 0's seconds, and stops if any was asked to
        progress = budget_progress(tokens_read, seconds, budget_tokens, budget_hours)
        if no_step_left(progress, step, max_steps) or stop:
            break
        # The step's batch size, learning rate and masking rate at the run's progress, the share of the budget used,
        # with the settings start-up decided in `config`. The table at the top of this file gives their values in two
        # runs; the table above the loop says when step n of two runs is the same.
        step_batch, step_lr, step_mask_rate = schedules_at(progress, config)
        step_masking = dataclasses.replace(masking, mask_rate=step_mask_rate)
        # 1. Read the next step_batch rows of the run's order (Batches.for_step). The batch grows over the first
        #    batch_ramp (60%) of the budget, because early on a small batch learns about as much per token as a large
        #    one, and so gives more updates for the same data.
        # 2. Mask k tokens in every row (model.mask_tokens says which and what each becomes, with an example). Masking
        #    25% rather than BERT's 15% gives more predictions from the same rows. Some masked tokens are shown as a
        #    random token or as themselves because fine-tuning never shows the model [MASK].
        sizes = sizes_at(step_batch)  # this process's micro-batch sizes (micro_batch_sizes)
        micro_batches = batches.for_step(tokens_read // seq_len, sizes, step_masking)  # the first sequence number
        # 3-4. The loss, the mean cross-entropy over the step's masked tokens (model.CrammedBert.mlm_loss), and its
        #    gradients, summed over the micro-batches (model.Trainer.backward says how they are weighted).
        loss = trainer.backward(micro_batches)
        # 5. Clip the gradients and update (model.Trainer.update), unless the loss spiked ("Bad steps"). The learning
        #    rate follows lr_at, which says its shape and why; it is the same whatever the batch (the schedules' comment
        #    says why).
        spike = watch.is_spike(loss, masked_count(step_mask_rate, seq_len))  # a new count starts its history again
        applied = trainer.update(step_lr, grad_clip, skip=spike)
        # Then the counts, a skipped update's too: the step, and the input tokens read, masked or not.
        step, tokens_read = step + 1, tokens_read + step_batch * seq_len
        seconds = clock.end_step()  # the step's time added, less a pause
        bad_steps.count(step, loss, spike, applied, trainer.scaler)  # max_skipped_steps bad steps in a row end the run
        if master and step % log_interval == 0:  # rank 0 alone logs, evaluates and saves
            tokens_per_s = (tokens_read - at_last_line[1]) / (seconds - at_last_line[0])
            mfu = model.config.flops_per_token(step_masking.mask_rate) * tokens_per_s / world / rt.peak_flops if rt.peak_flops else None
            progress_after = budget_progress(tokens_read, seconds, budget_tokens, budget_hours)  # `progress` is before the step
            # The tokens the run will have trained at its end: at the speed since the last line, under a budget of hours
            total = budget_tokens or tokens_read + tokens_per_s * max(0.0, 1 - progress_after) * 3600 * budget_hours
            log_step(metrics, rt, dict(kind="train", step=step, elapsed=round(seconds, 2), tokens=tokens_read, loss=loss,
                                       lr=step_lr, batch=step_batch, mask_rate=step_mask_rate, tokens_per_s=round(tokens_per_s),
                                       mfu=mfu, skipped=bad_steps.skipped), n_rows, seq_len, progress_after, total, config)
            repeats_warned = repeats_warned or budget.warn_repeats(total, seconds, tokens_per_s, n_rows * seq_len, budget_hours)
            at_last_line = (seconds, tokens_read)
        # After a stop signal, an evaluation or a save that is due is skipped, and the end saves at once. So a
        # scheduler's grace period must cover what was under way when the signal came (the step, an evaluation or a
        # save) and one save.
        if master and seconds - last_eval >= eval_interval_minutes * 60 and clock.signum is None:
            last_eval, scores[step] = seconds, run_eval(validation, metrics, step, tokens_read, seconds)
        # No checkpoint is saved during a streak of bad steps. save_if_sound refuses weights that have diverged, and the
        # next try comes an interval later.
        if (master and seconds - last_ckpt >= ckpt_interval_minutes * 60 and not bad_steps.in_a_row
                and clock.signum is None):  # asked again here: a stop may come during the evaluation
            last_ckpt = seconds
            save_if_sound(saves, validation, checkpoint_state(trainer, run_info, step, seconds, tokens_read, init_loss, False, watch))

    # -------------------------------------------------------------------- the end; the clock has stopped
    # A run ends in one of three ways.
    # - Its budget or max_steps is spent: it saves its checkpoint, evaluates, and prints the fill-in examples and the
    #   final line.
    # - A stop signal: it saves after the step it was on, with no final evaluation, and --resume=True continues it.
    # - max_skipped_steps bad steps in a row: BadSteps has already exited with an error, saving nothing. The last
    #   checkpoint saved is the one to resume from.
    # For a finished run, a stop signal from here on ends the process at once, as one before the loop does. It saves
    # first, so a signal after the save loses nothing, and a signal during it leaves the last checkpoint as it was. A
    # stopped run keeps its handler: a repeated signal does not interrupt its final save, but a second Ctrl-C kills at
    # once.
    if not stop:
        process.take_signals(process.interrupt)
    if master:
        state = checkpoint_state(trainer, run_info, step, seconds, tokens_read, init_loss, not stop, watch)  # final: not stopped
        finish(validation, metrics, state, clock.signum, saves, scores)
    del trainer  # under torchrun, DDP's model is freed before its process group ends
    runtime.leave_process_group()  # under torchrun, the processes wait for rank 0 to save, then the group ends
    if stop:  # exit with the shell's status for the signal (130 for SIGINT, 143 for SIGTERM): the run is not finished
        process.exit_stopped(clock.signum or signal.SIGTERM)


# -----------------------------------------------------------------------------
# The step's pieces, in the loop's order. First the clock: the run's progress through its budget, when the run is
# over, and training time with the stop signal the loop checks.
# The budget's kind (hours or tokens) matters in these places, so a new kind of budget (joules, say) touches each:
# - budget_progress, below: the run's progress, which every schedule and the end of the run read;
# - the loop's training line: its estimate of the run's tokens (`total`) and the warning of repeated data;
# - check_resumable and open_out_dir: a spent budget in a resume, and the warning of repeated data at start-up;
# - cram/budget.py: budget_compute turns hours into FLOPs, pick_for takes a budget of tokens as it is, start_lines
#   prints the budget, and warn_repeats says when the speed is known;
# - cram/setup.py's resume_settings: a resume given a larger budget of the same kind.
def budget_progress(tokens, seconds, budget_tokens, budget_hours):
    """The run's progress, the fraction of its budget used: of budget_tokens when set, else of budget_hours' seconds."""
    return tokens / budget_tokens if budget_tokens else seconds / (3600 * budget_hours)


def no_step_left(progress, step, max_steps):
    """Whether a run at this share of its budget and this step has no step left to take."""
    return progress >= 1.0 or bool(max_steps and step >= max_steps)


class TrainingClock:
    """Training time, `seconds`, and the stop signal the loop checks. The loop calls start_step at the top of each step
    and end_step after the update, and the time between is the step's.
    - It counts drawing and masking the batch, the forward and backward passes and the update. It also counts
      torch.compile's compilation: in the first steps, and again when a new shape appears (a masking level that changes
      a row's count of masked tokens, or the ramp's first use of a new micro-batch size).
    - Set-up, logging, evaluation and saving are not counted, so a run takes longer on the wall clock.
    - A pause (Ctrl-Z then fg, or a batch system's suspend) is mostly left out where the system sends SIGCONT (not on
      Windows): a step that a pause fell in counts as no longer than the step before it. The first step of a run or of
      a resume has no step before it, so a pause in it counts in full.
    - On a GPU the update may still be running when the clock stops: the host waits for the gradients' norm, then queues
      the optimizer's step without waiting for it. Its time then falls into the next step, or off the clock if an
      evaluation or a save comes first.
    - A resume starts from its checkpoint's clock. Steps after the last save that a kill lost are not on it.
    A stop signal (Ctrl-C, SIGTERM and the others in process.STOP_SIGNALS) is recorded in `signum`, so that the loop
    can finish its step, save and exit. A repeated signal does not interrupt the save, but a person's second Ctrl-C kills
    at once (process.held)."""

    def __init__(self, seconds):
        # continued_at: when the process last continued after a pause
        self.seconds, self.last_took, self.signum, self.continued_at, process.INTERRUPTS[0] = seconds, math.inf, None, -math.inf, 0
        process.take_signals(self.handle)
        if hasattr(signal, "SIGCONT"):
            signal.signal(signal.SIGCONT, lambda signum, frame: setattr(self, "continued_at", time.perf_counter()))

    def handle(self, signum, frame):
        self.signum = self.signum or signum  # the first request names the stop
        process.held(signum)

    def start_step(self):
        """Starts a step's time. Returns the seconds so far and whether to stop. Under DDP every process takes rank 0's
        seconds, and all stop if any was asked to, so that they step alike."""
        self.started = time.perf_counter()
        self.seconds, stop = runtime.agree_on_clock(self.seconds, self.signum is not None)
        return self.seconds, stop

    def end_step(self):
        """Adds the step's time, less a pause that fell in it (see above), and returns the seconds so far."""
        took = time.perf_counter() - self.started
        took = min(took, self.last_took) if self.continued_at >= self.started else took
        self.seconds, self.last_took = self.seconds + took, took
        return self.seconds


# -----------------------------------------------------------------------------
# The schedules: each is a pure function of the run's progress, the fraction of the budget used (lr_at, mask_rate_at
# and batch_size_at, read together by schedules_at). A masking rate that changes a row's count of masked tokens also
# starts the spike check's history of losses again (SpikeWatch).
# The peak rate is not scaled with the batch, neither along the ramp nor by the final batch: the cramming recipe keeps
# one peak over its ramp, and at equal tokens the CPU sweeps found the loss flat from the width's rate to twice it
# (BENCHMARKS.md, "The budget's learning rate"), so no batch rule was fitted.
# Since the batch grows, a share of the budget is not the same share of the steps: with a final batch of 4096, two
# thirds of the steps come in the first quarter of the budget (docs/training.md, "A run in numbers"). A budget of S
# sequences takes about S x (ramp / L) / start x (1 + 1/2 + ... + 1/L) steps while the batch ramps through its
# L = final / start - 1 smaller sizes (rounded up), then S x (1 - ramp) / final (budget.expected_steps).
# A step takes all three values at the point of the budget where it starts. That has three consequences.
# - A step that uses more of the budget than a stretch of a schedule lasts skips that stretch. For example, the first
#   step of a 5-minute run includes compilation, so it can use up the whole 1% warm-up of warmup_linear (3 seconds).
#   Under a budget of tokens, a batch that is a large share of the budget skips stretches the same way.
# - The last step runs at the rate of the point where it starts, not at 0.
# - max_steps stops a run without shortening the schedules, so such a run ends at the rate of the point it reached.
def schedules_at(progress, run):
    """A step's batch size, learning rate and masking rate at the run's progress: the three schedules below with the
    run's settings. `run` holds the values decided at start-up (main's `config`), so run["lr"] is the decided peak rate
    and run["batch_size"] the final batch, not the 0s at the top of the file. The loop, the training line's estimate of
    the steps and the start-up line "schedule:" all read them here, so a new schedule, or a new setting of one, is
    written in this one place."""
    return (batch_size_at(progress, run["batch_ramp_start"], run["batch_size"], run["batch_ramp"]),
            lr_at(progress, peak=run["lr"], schedule=run["lr_schedule"], warmup=run["warmup"]),
            mask_rate_at(progress, run["mask_rate"], run["mask_rate_start"], run["mask_levels"]))


def lr_at(progress, peak, schedule="triangle", warmup=0.01):
    """The learning rate at a fraction `progress` of the budget, for a peak rate `peak` (the run's lr).
    "triangle" is the cramming reference's schedule (its "budget-triangle2"): from 25% of the peak at the start up to
    the peak at 75% of the budget, then down to 0 at the end. It can start that high because pre-LayerNorm blocks train
    stably at a high rate from the first step (Xiong et al. 2020), and it falls to 0 because that trains best when the
    length of training is fixed in advance (Li et al. 2020, budgeted training).
    "warmup_linear" is original BERT's: from 0 up to the peak over a fraction `warmup` of the budget, then down to 0
    at the end. With a warmup above 0, its first step, at progress 0, has a rate of 0: it leaves the weights as they
    are, though the optimizer's state takes its gradient. Both are shares of the budget, not counts of steps (see the
    consequences above)."""
    if schedule == "triangle":
        return peak * (0.25 + progress) if progress < 0.75 else peak * max(0.0, 4 * (1.0 - progress))
    if schedule == "warmup_linear":
        return peak * progress / warmup if progress < warmup else peak * max(0.0, (1.0 - progress) / (1.0 - warmup))
    raise ValueError(f"unknown lr_schedule '{schedule}'")


def mask_rate_at(progress, end, start=0.0, levels=4):
    """The masking rate at a fraction `progress` of the budget. With no `start` it is `end` throughout. With a `start`
    it moves from `start` to `end` as a staircase of `levels` rates, each held for 1 / levels of the budget, so that
    torch.compile compiles each rate's shapes once (two rates that give a row the same count share one; Ankner et al.
    2023 lower the rate in stages). With one level the rate is `start` throughout. In the same row, a lower rate masks a
    subset of the positions a higher one does (what each becomes may differ). For example, mask_rate_start=0.4 with
    the defaults gives 0.40, 0.35, 0.30 and 0.25, each for a quarter of the budget. In a row of 128 that masks 51, 45,
    38 and 32 tokens (41/5/5, 36/4/5, 30/4/4 and 26/3/3 as [MASK], random and unchanged), and at 16 x 768 a token costs
    0.652, 0.645, 0.637 and 0.630 GFLOP. The quarters are shares of the budget, not of the steps: with the A6000's day
    in tokens, 68% of the steps come at 0.40, while the batch is small.
    What a new masking schedule must keep, since these read the rate outside this function:
    - Each count of masked tokens per row is a graph to compile, once per micro-batch size in use (two at most with the
      built-in batch schedule), and compiling is on the clock. A compiled function may build at most runtime.MAX_GRAPHS
      (32) graphs in all, counts x sizes, and a compiled run's start-up refuses a schedule that needs more at the 840
      points of the budget it samples (setup.schedule_line; a schedule that changes between them may still pass). So a
      smooth schedule may take at most 32 / (the micro-batch sizes in use) distinct counts, 16 with two sizes: 0.40 to
      0.15 in a straight line passes 33 counts in rows of 128; 8 levels take 8.
    - SpikeWatch starts its history of losses again at each new count, and judges no loss for SPIKE_HISTORY steps.
    - The micro-batch is sized for the highest rate the schedule reaches, and the budget plans its FLOPs at
      mask_rate, even where the schedule never reaches it (one level: mask_rate_start throughout)."""
    if not start:
        return end
    level = min(levels - 1, int(progress * levels))
    return start + (end - start) * level / max(1, levels - 1)


def batch_size_at(progress, start, final, ramp):
    """Sequences per optimizer step at a fraction `progress` of the budget: the straight line from `start` (at 0) to
    `final` (at `ramp`), rounded down to a multiple of `start`. So the batch grows in jumps of `start` (from 32 to 64:
    one jump, at `ramp`), the last one smaller where `final` is not a multiple of `start`. Where start >= final, the
    batch is `final` throughout."""
    if progress >= ramp or start >= final:
        return final
    grown = start + (final - start) * progress / ramp  # the straight line from start (at 0) to final (at ramp)
    return min(final, int(grown) // start * start)  # rounded down to a multiple of start


# How a step is cut into micro-batches. A process runs its share of a batch as several forward and backward passes
# whose gradients add up (model.Trainer.backward), so a batch larger than the memory holds still trains as one. Two
# sizes serve the whole run, each a graph to compile: `micro_batch`, the most that fits, and `remainder_micro` for what
# is left over, which set-up works out from the batch's schedule (cram/setup.py's split_micro_batches).
def micro_batch_sizes(batch, world, micro, remainder):
    """The sizes of a process's micro-batches of a global `batch`: as many of `micro` as fit, then the rest in ones of
    `remainder` (set-up's two sizes). They always add up to the process's whole share. A batch that the
    two sizes do not cover (from a fork's schedule, say) takes one more micro-batch of what is left, a shape that
    torch.compile compiles once more. A batch that `world` processes cannot share evenly is refused in one line."""
    if batch % world:
        raise SystemExit(f"error: a batch of {batch} sequences cannot be split evenly over {world} processes")
    share = batch // world
    sizes = [micro] * (share // micro) + [remainder] * (share % micro // remainder)
    return sizes + [share - sum(sizes)] * (sum(sizes) < share)


# -----------------------------------------------------------------------------
# The data a step reads. prepare.py writes train.bin as one stream of documents, each followed by [SEP]. The stream is
# cut into rows of seq_len tokens, so a document may run on into the next row. There is no [CLS] and no padding. The
# special tokens' ids come after the regular ones. The run reads the rows epoch after epoch, each epoch in its own
# shuffled order, and the run's sequence number i is always the same row. So the number of sequences consumed says
# which rows come next, and a resumed run reads on exactly where it stopped. Each row's mask comes from its sequence
# number (mask_keys), so a row read again in a later epoch gets a new mask, as in RoBERTa's dynamic masking.
@functools.lru_cache(maxsize=2)
def epoch_order(n_rows, seed, epoch, order="shuffled"):
    """The rows that epoch `epoch` visits, in an order shuffled by (seed, epoch). With order="file" the first epoch
    keeps the file's order (tools/curriculum.py writes files meant to be read that way). An order holds n_rows int64
    indices in host memory, and two are cached: at FineWeb-Edu's 78M rows of 128, 625 MB each."""
    return np.arange(n_rows) if order == "file" and epoch == 0 else np.random.default_rng((seed, epoch)).permutation(n_rows)


def rows_at(start, count, n_rows, seed, order="shuffled"):
    """The rows of the run's sequences number `start` to start + count - 1. The run's sequence i is row
    epoch_order(i // n_rows)[i % n_rows], so every epoch reads every row once. The answer depends on the position
    alone, which is why a resumed run reads on from the checkpoint's tokens / seq_len."""
    parts = []
    while count > 0:
        epoch, offset = divmod(start, n_rows)
        take = min(count, n_rows - offset)
        parts.append(epoch_order(n_rows, seed, epoch, order)[offset:offset + take])
        start, count = start + take, count - take
    return np.concatenate(parts)


def mask_keys(seed, numbers):
    """One key for each row's mask, as an int64 tensor: model.mask_tokens draws a row's mask from its key alone. The key
    is the row's number mixed with the seed (xor with numpy's default_rng(seed).integers(2 ** 62), PCG64), so every
    number has its own key and another seed gives other keys. A training row's number is its sequence number in the run
    (0, 1, 2, ...). A validation row's is negative (-1 - its index), so no validation row shares a training row's key.
    (row_noise hashes a key to 32 bits first, so two rows' masks may still coincide, as two random draws may.)"""
    return torch.from_numpy(np.asarray(numbers, dtype=np.int64) ^ int(np.random.default_rng(seed).integers(2 ** 62)))


class Batches:
    """The training batches of one process (`rank` of `world`). A micro-batch's rows and masks depend only on the
    seed, the sequence numbers it covers and the masking rate. So a resumed run, or one on more processes or another
    device, reads and masks exactly the same rows at the same sequence numbers."""

    def __init__(self, tokens, meta, rank, world, device, seed, order="shuffled"):
        self.tokens, self.rank, self.world, self.device, self.seed, self.order = tokens, rank, world, device, seed, order
        self.mask_id, self.n_regular = meta["special_ids"]["[MASK]"], meta["n_regular"]

    def for_step(self, first, sizes, masking):
        """This process's masked micro-batches for one step, as a list of (inputs, positions, labels). `first` is the
        number of the step's first sequence in the run, which is how many the run read before it. `sizes` are the sizes
        of this process's micro-batches (micro_batch_sizes), and every process cuts the step the same way. The step
        reads the next sequences of the data order. Each micro-batch is split over the processes, and rank r reads the
        r-th slice of it."""
        starts = first + self.world * np.cumsum([0, *sizes[:-1]])  # each micro-batch's first sequence on rank 0
        return [self.micro_batch(int(start) + self.rank * size, size, masking) for start, size in zip(starts, sizes)]

    def micro_batch(self, start, size, masking):
        """The `size` sequences from sequence number `start` on, read from the token file, copied to the device and
        masked there. Nothing is read ahead, so this is part of the step's time. From disk to the model: `size` rows of
        seq_len uint16 ids (uint32 past 65,536 ids) read from the memory-mapped train.bin, size x seq_len x 2 bytes (4
        past 65,536 ids); an int64 (size, seq_len) tensor, pinned and copied to a GPU without waiting; then mask_tokens'
        (inputs (size, seq_len), positions (size, k), labels (size, k)), all int64 on the device."""
        rows = rows_at(start, size, len(self.tokens), self.seed, self.order)
        keys = to_device(mask_keys(self.seed, start + np.arange(size)), self.device)  # the rows' sequence numbers
        return mask_tokens(get_batch(self.tokens, rows, self.device), masking, self.mask_id, self.n_regular, keys=keys)


# -----------------------------------------------------------------------------
# Bad steps. A step is bad when its loss spikes, or when it shows that the run diverged. A spike's update is skipped
# (SpikeWatch), and so is an update whose gradient is not finite (model.Trainer.update). After max_skipped_steps bad
# steps in a row the run stops (BadSteps), and during a streak no periodic checkpoint is saved.
# SPIKE_WINDOW is about how many recent losses the running mean covers, SPIKE_HISTORY how many losses come in before
# any is judged, and SPIKE_MARGIN the least rise, as a share of the mean, that counts as a spike.
SPIKE_WINDOW, SPIKE_HISTORY, SPIKE_MARGIN = 50, 20, 0.1


def diverged(loss, vocab_size, applied=True, scaler=None):
    """Whether a step shows that the run diverged: its loss is not finite, or is more than one nat above a uniform guess
    over the vocabulary (log(vocab_size), a little above an untrained model's), or its update was skipped for a
    non-finite gradient. Under float16 the loss scaler skips updates while it searches for its scale, so there a skip
    counts only once the scale is below 1."""
    skipped = not applied and (scaler is None or not scaler.is_enabled() or scaler.get_scale() < 1)
    return skipped or not loss <= math.log(vocab_size) + 1.0


class SpikeWatch:
    """Tracks the recent training loss: a running mean over about the last SPIKE_WINDOW steps, and a running variance
    taken as half the mean square of the step-to-step changes. A checkpoint saves this state (state_dict)."""

    def __init__(self, threshold, mean=0.0, var=0.0, count=0, last=0.0, masked=0, **older):  # older: a checkpoint's rate
        self.threshold, self.mean, self.var, self.count, self.last, self.masked = threshold, mean, var, count, last, masked

    def is_spike(self, loss, masked=0):
        """Whether `loss` is a spike: more than `threshold` standard deviations (the square root of the variance)
        and more than SPIKE_MARGIN x the mean above the recent mean. Nothing counts as a spike until SPIKE_HISTORY
        losses are in, or with a threshold of 0. A finite loss that is not a spike joins the history.
        `masked` is the step's count of masked tokens per row (model.masked_count). Losses at two counts do not compare
        (more masked tokens leave less context, so the loss is higher), so at a new count the history starts again, and
        no loss is judged for the next SPIKE_HISTORY steps. Two masking rates that give a row the same count mask the
        same tokens, so their losses share one history. A count of 0 is unknown (a checkpoint from before it was
        kept)."""
        if masked != self.masked and self.masked:
            self.mean, self.var, self.count, self.last = 0.0, 0.0, 0, 0.0
        self.masked = masked
        rise = loss - self.mean
        spike = bool(self.threshold and self.count >= SPIKE_HISTORY and
                     rise > max(self.threshold * self.var ** 0.5, SPIKE_MARGIN * self.mean))
        if not spike and math.isfinite(loss):
            self.count += 1
            weight = max(1 / self.count, 1 / SPIKE_WINDOW)
            jump = loss - self.last if self.count > 1 else 0.0
            self.mean, self.var, self.last = self.mean + weight * rise, self.var + weight * (jump ** 2 / 2 - self.var), loss
        return spike

    def state_dict(self):
        return dict(mean=self.mean, var=self.var, count=self.count, last=self.last, masked=self.masked)


class BadSteps:
    """A run's count of skipped updates (`skipped`, which the log shows) and its streak of bad steps (`in_a_row`)."""

    def __init__(self, limit, saves, vocab_size, threshold):
        self.limit, self.saves, self.vocab_size, self.threshold, self.skipped, self.in_a_row = limit, saves, vocab_size, threshold, 0, 0

    def count(self, step, loss, spike, applied, scaler=None):
        """Counts one step. After `limit` bad steps in a row it ends the run (SystemExit), naming the checkpoint to
        resume from."""
        self.skipped += not applied
        bad = spike or diverged(loss, self.vocab_size, applied, scaler)
        self.in_a_row = self.in_a_row + 1 if bad else 0
        if self.in_a_row < self.limit:
            return
        spike = f", or a spike: {self.threshold:g} standard deviations and {SPIKE_MARGIN:.0%} above the recent mean" if self.threshold else ""
        raise SystemExit(f"error: {self.in_a_row} steps in a row diverged (a non-finite gradient, a loss above "
                         f"{math.log(self.vocab_size) + 1:.2f}{spike}) up to step {step}; {self.saves.advice()}")


# -----------------------------------------------------------------------------
# The training line that the loop prints and records every log_interval steps. Its loss is that one step's loss (not a
# mean over the log_interval steps), measured before the update. Its level rises with the masking rate (less context
# to predict from), so a staircase moves it at each new rate: compare runs at different rates by the eval lines, which
# score at eval_mask_rate. Its scatter shrinks as the batch grows, since each step averages over more rows.
def log_step(metrics, rt, record, n_rows, seq_len, progress, total, run):
    """Prints a training line and records it. Beside the record's figures, the line gives a GPU's peak memory, the epoch
    (how many times the run has read its n_rows training rows), the share of the budget left (`progress` is the run's
    after this step), and about how many steps the whole run takes. That estimate is the steps taken, plus the
    sequences left until the run has trained `total` tokens, spread evenly over the rest of the budget at each point's
    batch size (schedules_at with the run's settings `run`), and at most max_steps. Under a budget of hours, `total`
    assumes the speed since the line before. On the first line that speed includes compilation, so its estimate is
    low."""
    peak_memory = f" | {rt.peak_memory() / 2 ** 30:.1f} GiB" if rt.device.type == "cuda" else ""
    rt.reset_peak_memory()
    mfu, skipped, tokens = record["mfu"], record["skipped"], record["tokens"]
    rest = max(0.0, total - tokens) / seq_len / 1000  # the sequences left, in a thousandth of the budget left each
    grid = [progress + (1 - progress) * (i + 0.5) / 1000 for i in range(1000)]  # the middles of those thousandths
    steps = min(record["step"] + sum(rest / schedules_at(p, run)[0] for p in grid), run["max_steps"] or math.inf)
    print(f"step {record['step']} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | batch {record['batch']} | "
          f"{record['tokens_per_s']:,} tok/s{f' | mfu {100 * mfu:.1f}%' if mfu else ''}{peak_memory} | epoch {tokens / (n_rows * seq_len):.2f} | "
          f"{record['elapsed'] / 60:.1f} min | {100 * max(0.0, 1 - progress):.0f}% of the budget left, about {steps:,.0f} "
          f"steps in all{f' | {skipped} updates skipped (non-finite or spikes)' if skipped else ''}")
    metrics.write(record)


# -----------------------------------------------------------------------------
# How validation is scored. It masks the first eval_sequences validation rows, each from a key made of VALIDATION_SEED
# and the row's index, so every evaluation of every run scores the same masked tokens, whatever the micro-batch, the
# device or the number of processes. That is what makes two runs' validation losses comparable.
VALIDATION_SEED = 1234


def validation_batch(tokens, rows, mask_rate, meta):
    """The validation rows `rows`, masked, as (inputs, positions, labels) on the CPU."""
    rows = np.asarray(rows, dtype=np.int64)
    idx = torch.from_numpy(np.asarray(tokens[rows], dtype=np.int64))  # (B, T)
    keys = mask_keys(VALIDATION_SEED, -1 - rows)  # negative numbers: never a training row's key
    return mask_tokens(idx, mask_rate, meta["special_ids"]["[MASK]"], meta["n_regular"], keys=keys)


class Validation:
    """The validation rows and what scoring them needs: the model, the data's meta.json, how many rows go through the
    model at a time (`batch`) and the runtime (device and precision)."""

    def __init__(self, model, tokens, meta, batch, rt):
        self.model, self.tokens, self.meta, self.batch, self.rt = model, tokens, meta, batch, rt

    @torch.no_grad()
    def score(self, n_sequences, mask_rate):
        """The validation loss and masked-token accuracy over the first n_sequences rows: the mean over all their
        masked tokens. The model is in eval mode meanwhile (no dropout, and forward counts its correct predictions)
        and back in training mode after."""
        n = min(n_sequences, len(self.tokens))
        loss_sum, correct, predicted = 0.0, 0, 0
        self.model.eval()
        try:
            for start in range(0, n, self.batch):
                masked = validation_batch(self.tokens, range(start, min(n, start + self.batch)), mask_rate, self.meta)
                inputs, positions, labels = (to_device(t, self.rt.device) for t in masked)
                with self.rt.autocast():
                    loss, hits = self.model(inputs, positions, labels)
                loss_sum += loss.item() * labels.numel()  # the batch's mean loss, weighted by its masked tokens
                correct, predicted = correct + hits.item(), predicted + labels.numel()
        finally:
            self.model.train()
        return loss_sum / predicted, correct / predicted


# -----------------------------------------------------------------------------
# Evaluation and saving: the periodic evaluation, what a checkpoint holds, and the save that refuses unsound weights.
def run_eval(validation, metrics, step, tokens, seconds):
    """Scores the model on eval_sequences validation rows, prints the line and records it in metrics.jsonl."""
    val_loss, accuracy = validation.score(eval_sequences, eval_mask_rate)
    n_rows = len(validation.tokens)
    print(f"eval  step {step} | val loss {val_loss:.4f} | masked-token accuracy {accuracy:.3f} | {seconds / 60:.1f} min, "
          f"{tokens / 1e6:.1f}M tokens{f' | on all {n_rows} sequences' * (n_rows < eval_sequences)}")
    metrics.write(dict(kind="eval", step=step, elapsed=round(seconds, 2), tokens=tokens, val_loss=val_loss,
                          accuracy=accuracy))
    return val_loss, accuracy


def checkpoint_state(trainer, run_info, step, seconds, tokens, init_loss, final, watch):
    """What a checkpoint holds, and so what --resume=True restores:
    - the weights, the optimizer's state and float16's loss scale (trainer.state_dict).
    - how far the run has got: its step, the tokens it trained on and the seconds it spent. The schedules follow the
      run's progress through the budget, and the rows and their masks follow the number of sequences read (Batches),
      so a resume continues all of them.
    - the loss history that the spike check compares against (watch).
    - `run_info`, what the run is: its settings, model shape, data folder and digest, tokenizer and the budget's pick.
    A resume runs with the run's own settings (cram/setup.py's resume_settings). Only these may change:
    - the budget: a larger one to train further, a smaller one to end sooner. The schedules then follow the progress
      through the new budget: the rate jumps to its schedule's value there, with no new warm-up, and the masking rate
      may step back a level. The batch ramp is rescaled to end where it did, so the batch never shrinks. Where the new
      budget ends before the old ramp did, the batch is still growing at the end.
    - the optimizer's rate, clipping and decay and the spike check, which a diverged run's error asks you to lower
      (setup.py's CHANGEABLE).
    - how this command runs: device, precision, micro-batch, logging and where the data is (setup.py's THIS_COMMAND).
    Any other change is refused in one line. A fork's new setting is kept like the others unless it joins one of those
    two lists."""
    return dict(trainer.state_dict(), **run_info, step=step, elapsed=seconds, tokens=tokens, init_val_loss=init_loss,
                final=final, spike_watch=watch.state_dict())


def save_if_sound(saves, validation, state, at_end=False):
    """Saves the checkpoint `state`, unless its weights are not finite or its loss on one validation batch has diverged
    (diverged, above). So every checkpoint kept is one that a run stopped for diverging can resume from. A save writes
    ckpt.pt whole or not at all (a temporary file, then a rename), and keeps the last keep_checkpoints (cram/files.py).
    When the weights are not saved, a line says why; at the end of a run (at_end) that is an error."""
    loss = validation.score(validation.batch, eval_mask_rate)[0] if all_finite(state["model"]) else None
    refused = ("non-finite weights" if loss is None else
               f"a diverged validation loss ({loss:.2f})" if diverged(loss, state["meta"]["vocab_size"]) else None)
    if refused is None:
        saves.save(state)
    elif at_end:
        raise SystemExit(f"error: the weights at step {state['step']} were not saved: {refused}; {saves.advice()}")
    else:
        print(f"checkpoint at step {state['step']} not saved: {refused}; {saves.kept()}")


# -----------------------------------------------------------------------------
# The settings' reasons. What the settings above do, and why they have their defaults, where a line beside each
# is too short.
# Where the default run departs from the paper's reference code, and what reverts each (config/recipe_reference.py and
# config/shape_paper.py together give the paper's recipe, shape and batch):
#     the default run                                  the reference                       to revert
#     smear on (cram's one change to the model)        no smear                            smear=False
#     the final batch the budget picks (4096 on an     8192                                config/shape_paper.py
#     A6000's day, which the paper found best)
#     FineWeb-Edu (data_dir)                           the paper's corpus                  prepare.py's settings
#     random replacement tokens: regular ones only     any id of the vocabulary            (none)
#     the clock counts the training steps only         all the time since the start        (none)
#     a loss spike skips its update                    no check                            spike_threshold=0
#     the batch ramp: cram's line rounded down to a    the same line rounded up, so one    (none)
#     multiple of 128                                  micro-batch of 128 more at most
#                                                      points (backend/torch_default.py)
# The model's settings default to the crammed recipe (Geiping & Goldstein 2022). Where it differs from the original
# BERT's (config/bert_original.py sets BERT's switches, schedule, rate and Adam settings, though not its batch of 256,
# its rows of 512 or next-sentence prediction), and why it suits a budget:
# - Pre-LayerNorm (norm_first) trains stably at a high rate without a long warm-up (Xiong et al. 2020): a peak of
#   1e-3, where post-norm BERT used 1e-4.
# - No biases in the linear layers (bias): fewer kernels per step, for almost the same weights.
# - A gated GELU feed-forward (glu): more learned per FLOP (Shazeer 2020, "GLU variants improve Transformer").
# - No dropout: a run that reads each token about once has little overfitting to prevent, and dropout costs time.
# - No next-sentence prediction: the loss is the masked tokens' alone, and rows are cut from one stream of text
#   (RoBERTa, Liu et al. 2019, found that dropping it did not hurt).
# - Only the masked positions go through the output layer (sparse_prediction), which at 16 x 768 and a vocabulary of
#   32768 saves 15% of the FLOPs per token at mask_rate 0.25 (model.flops_per_token; more for a smaller model or a
#   lower rate).
# - 25% of the tokens are masked, not 15% (mask_rate; the loop's stage 2 says why).
# - The learning rate decays to 0 as the budget ends, and the batch grows over the run (the schedules, below).
# At equal time on a CPU, the crammed recipe reaches a far lower loss than BERT's (BENCHMARKS.md). smear, cram's own
# addition, is on as well (config/recipe_reference.py turns it off). The vocabulary size and the sequence length come
# from the data (prepare.py's vocab_size and seq_len settings).
# The step beside BERT's and RoBERTa's (base models; Devlin et al. 2019, Liu et al. 2019's Table 9):
#     part of the step     cram (the A6000's day)              BERT                           RoBERTa
#     objective            MLM alone                           MLM and next-sentence          MLM alone
#     masking              25%, split 80/10/10 by count; a     15%, each position's fate      15%, each position's fate
#                          new mask each time a row is read    drawn; masks drawn once, when  drawn; a new mask each
#                                                              the data is prepared           time a row is read
#     a step's rows        128 -> 4096 rows of 128 tokens      256 rows of 128, then of 512   8K rows of 512 tokens
#     learning rate        peak 1e-3, the triangle over the    peak 1e-4 after 10K warm-up    peak 6e-4 after 24K
#                          budget (lr_at)                      steps, then down to 0          warm-up steps, then to 0
#     Adam beta2, eps      0.98, 1e-12                         0.999, 1e-6                    0.98, 1e-6
#     weight decay         0.01                                0.01                           0.01
#     dropout              none                                0.1                            0.1
#     gradient clipping    at norm 0.5                         at norm 1.0
# Comparing runs and ablating a switch fairly, and what the batch ramp costs on a GPU: docs/training.md, "Comparing
# runs" and "The batch ramp".
# What two runs at one seed share, step by step: the table in main's loop. The end's fill-in examples follow the
# seed.


# -----------------------------------------------------------------------------
# A run in numbers: docs/training.md, "A run in numbers", works through whole runs (the A6000's day at 0 to 100% of its
# budget, the quickstart, rows of 512) and says how to restart a run on a shared machine. "The budget's pick in short",
# there too, gives the pick's rules, the ladder of shapes and the picks by budget (decide_settings, below, applies
# them through budget.decide).


# -----------------------------------------------------------------------------
# Set-up and the end: what main calls before its loop (the settings' final values, the trainer and its optimizer, the
# output folder) and after it. The rest of set-up, which no step reads (the device, a resume's settings, the checks that
# refuse settings, the two micro-batch sizes, the start-up lines), is in cram/setup.py.
def decide_settings(config, model_config, resumed, run_data, rt, world, master, log):
    """Decides the value of every setting the run will use, before any work, and writes them into `config`.
    budget.decide fills in the shape and the final batch, and the width gives the peak rate (model.lr_for_width) unless
    it is given. A resume takes these from its checkpoint.
    memory.choose_micro_batch finds the largest micro-batch that fits, and setup.split_micro_batches the two micro-batch
    sizes. Returns model_args, remainder_micro, the budget's pick, and the start-up lines that say what a resume changed
    or what the budget picked."""
    (checkpoint, source, changes), (meta, train_tokens, _, tokenizer_text) = resumed, run_data
    # The micro-batch is sized for the highest masking rate the schedule reaches (the most memory). The masking
    # schedule does not depend on what the budget picks, so it can be read before the pick.
    highest_mask_rate = max(schedules_at(i / 840, config)[2] for i in range(840))
    model_config = dataclasses.replace(model_config, vocab_size=meta["vocab_size"], seq_len=meta["seq_len"])  # the data's
    # A resume's shape is its checkpoint's already, so another run's checkpoint is refused before any work
    check_resumable(checkpoint, source, dataclasses.asdict(model_config), tokenizer_text, meta, config, log)
    decided, budget_pick, picked_lines = budget.decide(config, checkpoint, model_args=dataclasses.asdict(model_config),
                                         data_tokens=train_tokens.size, rt=rt, world=world, master=master)
    config.update(decided)  # the shape and the final batch
    config["lr"] = config["lr"] or lr_for_width(config["d_model"])  # the peak rate: given, a resume's own, or by the width
    model_config = dataclasses.replace(model_config, **{k: config[k] for k in SHAPE_FIELDS})  # in the decided shape
    setup.check_settings(world, config, rt, model_config=model_config)  # with the shape and batch decided
    model_args = dataclasses.asdict(model_config)
    cap = memory.choose_micro_batch(config["micro_batch"], config["batch_size"], model_args, rt, world=world,
                                    mask_rate=highest_mask_rate, offload=config["offload"], log=log)
    config["micro_batch"], remainder_micro = setup.split_micro_batches(world, cap, config["batch_size"],
                                                                       config["batch_ramp_start"], config["batch_ramp"])
    return model_args, remainder_micro, budget_pick, changes + picked_lines


def make_trainer(model, rt, ddp, log, peak_lr, checkpoint):
    """Builds the model.Trainer: the model on the device, the compiled copy that the step runs (wrapped by DDP under
    torchrun), and the optimizer, OPTIMIZERS[optim] over param_groups. Off-load mode builds its own trainer with the
    same methods and checkpoint format. A resume loads the checkpoint's state."""
    if offload:
        log("off-load mode: blocks' masters and AdamW in host memory, streamed through 2 device templates; eager")
        trainer = OffloadTrainer(model, rt, lr=peak_lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    else:
        model = model.to(rt.device)
        optimizer = OPTIMIZERS[optim].build(param_groups(model, weight_decay, optim), peak_lr, (beta1, beta2), eps)
        step_model = rt.compile_model(model)
        if ddp:
            device_ids = [rt.device.index] if rt.device.type == "cuda" else None
            step_model = torch.nn.parallel.DistributedDataParallel(step_model, device_ids=device_ids)
            # Set-up's waits, up to DDP's weight broadcast, could take join_minutes. Later ones may take 30 minutes.
            runtime.set_waits(30)
        trainer = Trainer(model, optimizer, rt.grad_scaler(), step_model, rt.autocast)
    if checkpoint:
        trainer.load_state_dict(checkpoint)
    return trainer


def check_resumable(checkpoint, ckpt_path, model_args, tokenizer_text, meta, config, log):
    """In a resume, refuses another run's checkpoint (another model, tokenizer, optimizer or data) in one line, and ends
    a finished run whose budget is spent with status 0, writing nothing. A run stopped on the step that spent its
    budget is not finished: the loop ends at once, and finish() evaluates it and saves it as finished."""
    if not checkpoint:
        return
    check_resume(ckpt_path, checkpoint, model_args, tokenizer_text, config["optim"], config["data_dir"], meta)
    progress = budget_progress(checkpoint["tokens"], checkpoint["elapsed"], config["budget_tokens"], config["budget_hours"])
    # A checkpoint without "final" (one written by hand) counts as finished
    if not no_step_left(progress, checkpoint["step"], config["max_steps"]) or not checkpoint.get("final", True):
        return
    kind = "max_steps" if progress < 1.0 else "budget_tokens" if config["budget_tokens"] else "budget_hours"
    log(f"{ckpt_path} has spent this budget (step {checkpoint['step']}, {checkpoint['tokens'] / 1e6:.1f}M tokens in "
        f"{checkpoint['elapsed'] / 60:.1f} min): nothing to do; to train it further, resume it with a larger "
        f"--{kind} (now {config[kind]})")
    runtime.leave_process_group()  # under torchrun
    raise SystemExit(0)


def open_out_dir(model, saves, config, rt, n_data_tokens, checkpoint, start_lines):
    """Rank 0's start: claims out_dir (a lock, and room on disk for the checkpoints kept), warns of a run too large for
    a CPU or one that repeats its data (n_data_tokens: how many the data holds), prints the start-up lines and starts
    W&B's run if wandb_log is on. Returns the metrics.jsonl log."""
    claim_folder(out_dir, need_bytes=saves.room_needed(model.num_params(), model.config.vocab_size),
                 files=("ckpt.pt", "metrics.jsonl"))
    step_flops = model.config.flops_per_token(mask_rate) * batch_size * model.config.seq_len
    for warning in (rt.device.type == "cpu" and runtime.cpu_warning(step_flops), budget_tokens and
                    repeat_warning(budget_tokens, n_data_tokens, f"with --budget_tokens={budget_tokens:,}")):
        if warning:
            print(warning)
    later = saves.branch()
    if checkpoint:
        set_aside = f"; the later ones set aside, kept: {', '.join(later)}" if later else ""
        print(f"resuming {saves.last_path} at step {checkpoint['step']}, {checkpoint['elapsed'] / 60:.1f} minutes and "
              f"{checkpoint['tokens'] / 1e6:.1f}M tokens in{set_aside}")
    for line in start_lines:
        print(line)
    if wandb_log:  # W&B's run, with the settings as they were decided
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name or os.path.basename(os.path.abspath(out_dir)), config=config)
    return MetricsLog(os.path.join(out_dir, "metrics.jsonl"), not resume, wandb_log, saves.run)


def finish(validation, metrics, state, signum, saves, scores):
    """Saves the last checkpoint first, unless a stop came during the periodic save of this same step, which saved it
    already. A run stopped by a signal (signum, or None when another process got it) then says how to continue it. A
    finished run evaluates, unless `scores` (each evaluation's score by its step) holds this step's, and prints how
    many graphs torch.compile built, the fill-in examples and the final line."""
    step, tokens, seconds, meta = state["step"], state["tokens"], state["elapsed"], state["meta"]
    if state["final"] or saves.saved_step != step:  # a stop during the periodic save of this step: saved already
        save_if_sound(saves, validation, state, at_end=True)
    if not state["final"]:
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        print(f"stopped by {name} at step {step} ({tokens / 1e6:.1f}M tokens, {seconds / 60:.1f} min): saved {saves.path}; "
              f"continue with the same command and --resume=True")
        return
    score = scores.get(step) or run_eval(validation, metrics, step, tokens, seconds)  # (val loss, accuracy)
    if validation.rt.compile:
        print(f"torch.compile built {runtime.compiled_graphs()} graph(s) for the training step")
    if fill_in_examples:
        enc = make_encoding(parse_ranks(state["tokenizer"]), meta["special_ids"])
        for line in fill_in(validation.model, validation.tokens, meta, enc, validation.rt, fill_in_examples, seed):
            print(line)
    at_init = f" (at init {state['init_val_loss']:.4f})" if state["init_val_loss"] is not None else ""
    print(f"final: step {step} | val loss {score[0]:.4f}{at_init} | masked-token "
          f"accuracy {score[1]:.3f} | {tokens / 1e6:.1f}M tokens in {seconds / 60:.1f} min | saved {saves.path}")


if __name__ == "__main__":
    # process.guarded turns a stop signal before the loop (Ctrl-C, SIGTERM) or a machine's fault (a full disk, the
    # GPU's memory) into one line that says what was kept. In the loop, TrainingClock only records a stop signal.
    settings = configure(globals(), sys.argv[1:], ModelConfig, skip=DATA_FIELDS + SHAPE_FIELDS, given=(given := {}))
    process.guarded(main, f"{os.path.join(out_dir, 'ckpt.pt')} keeps the last checkpoint saved: continue with "
                    f"--resume=True (or, if none was saved yet, run the same command again)", settings, given)
