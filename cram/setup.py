"""Set-up: what train.py's main does before its first step, and never during one. It picks the device and precision,
loads a resume's checkpoint and settings, refuses settings that cannot run together (each in one line, before any
work), claims an existing output folder and refuses another run's files in it, works out the two micro-batch sizes,
and writes the start-up lines that say what was decided (train.open_out_dir opens the folder). What a resume keeps and
what it may change is here too (resume_settings)."""
import collections
import math
import os

from configurator import disallowed, named
from model import LR_AT_768, LR_WIDTH_EXPONENT, OFF, OPTIMIZERS, REPLACED_FIELDS, ModelConfig, masked_count, saved_model_args
from . import process, runtime
from .budget import LADDER, SHAPE_FIELDS, shape_of
from .files import check_own_files, claim_folder, load_checkpoint
from .offload import check_settings as check_offload


# A resume's checkpoint (None in a new run), its path, and the start-up lines that say what the resume changed
Resumed = collections.namedtuple("Resumed", "checkpoint source changes")
# What a resume keeps and what it may change (train.checkpoint_state says it in words):
# - DECIDED_AT_START settings have a 0 that means "decide at start-up": in a resume a 0 keeps the checkpoint's value.
# - THIS_COMMAND settings say how this command runs, not what the run is, so a resume takes them from the command.
# - CHANGEABLE settings are the run's own, but a resume may change them when given: they are what a diverged run
#   asks to lower. A budget of the run's kind may be given too (a larger one trains further, a smaller one ends
#   sooner). Every other setting of the run is kept, and a different value given for one is refused in one line.
DECIDED_AT_START = (*SHAPE_FIELDS, "batch_size", "lr")
THIS_COMMAND = ("out_dir", "resume", "resume_from", "device", "dtype", "compile", "compile_mode", "micro_batch",
                "offload", "peak_tflops", "max_steps", "log_interval", "eval_interval_minutes", "ckpt_interval_minutes",
                "eval_sequences", "fill_in_examples", "wandb_log", "wandb_project", "wandb_run_name", "join_minutes",
                "dry_run", "data_dir")  # files.check_resume judges whether the data given is the data the run trained on
CHANGEABLE = ("lr", "grad_clip", "weight_decay", "beta1", "beta2", "eps", "spike_threshold", "max_skipped_steps",
              "keep_checkpoints")


def device_and_resume(config, world, ddp, given, script):
    """Picks the device and precision. In a resume, loads the checkpoint and writes the run's own settings into
    `config` (resume_settings). Checks every setting, against the others and against what `script` (train.py's
    globals) declares it may be, before torchrun's processes join, so that any refusal comes first. Returns the
    Runtime, this process's rank, the Resumed and the model's settings, in the ladder's smallest shape until the budget
    picks one (train.decide_settings)."""
    resume_from = config["resume_from"]
    source = resume_from if os.path.dirname(resume_from) else os.path.join(config["out_dir"], resume_from or "ckpt.pt")
    checkpoint = load_checkpoint(source, "resume") if config["resume"] else None
    kept, changes = resume_settings(checkpoint, config, given) if checkpoint else ({}, [])
    # A fork's or a newer cram's run: a value this cram does not allow (an optimizer it lacks), or a setting it lacks
    problem = disallowed(script, kept) or (checkpoint and unknown_setting(checkpoint["config"], config))
    if problem:
        raise SystemExit(f"error: {source} was trained with a setting this cram does not have ({problem}): resume "
                         f"it with the cram that wrote it")
    config.update(kept)
    smallest = shape_of(LADDER[0], config)  # the ladder's smallest shape, where the budget has not picked one yet
    saved = checkpoint.get("config", {}) if checkpoint else {}
    rt = runtime.setup(config["device"], config["dtype"], config["compile"] and not config["offload"],  # off-load: eager
                       config["compile_mode"], (saved.get("device"), saved.get("dtype")))
    model_config = ModelConfig.from_settings({**config, **smallest})  # a bad model setting fails here, before any work
    check_settings(world, config, rt, given, model_config)
    rank = runtime.join_process_group(rt.device, config["join_minutes"]) if ddp else 0
    rt = runtime.rank0_precision(rt) if ddp else rt
    rt.optim = config["optim"]  # the optimizer whose state the memory check counts (model.OPTIMIZERS)
    rt.peak_flops = runtime.peak_flops(rt.device, config["peak_tflops"] * 1e12)  # looked up by the GPU's name
    config.update(device=rt.device.type, dtype=rt.dtype_name())
    # Before any work, claim out_dir if it exists, which fails if another run holds it (train.open_out_dir creates a
    # missing one later). Then refuse another run's files, which this run would replace or prune.
    if rank == 0 and os.path.isdir(config["out_dir"]):
        claim_folder(config["out_dir"], files=("ckpt.pt", "metrics.jsonl"))
    check_own_files(config["out_dir"], checkpoint, source)
    return rt, rank, Resumed(checkpoint, source, changes), model_config


def unknown_setting(saved, config):
    """Names, as 'key=value', the first setting in a checkpoint's config `saved` that this cram does not have and that
    is on (not in model.OFF); None if there is none. A fork's new setting, or a newer cram's, is off by default, so a
    run that had it off runs here as it did; one that had it on would silently run without it."""
    return next((f"{k}={v!r}" for k, v in saved.items() if k not in config and k not in REPLACED_FIELDS and
                 k != "recipe_ramp" and v not in OFF), None)


def resume_settings(checkpoint, config, given):
    """The settings a resume runs with, and the start-up lines that say what it changed. They are the checkpoint's own,
    except those `given` that may change (see DECIDED_AT_START, THIS_COMMAND and CHANGEABLE above). A larger budget of
    the run's kind (hours or tokens) makes the schedules follow the progress through the new budget, and the batch ramp
    still ends where it did. The data is where the run trained unless --data_dir is given. A checkpoint's config also
    keeps `recipe_ramp`, the batch_ramp the run was first given, before a larger budget rescaled it."""
    saved = checkpoint["config"]  # files.load_checkpoint's: holding RUN_SETTINGS at least
    if "batch_ramp_start" not in saved and "micro_batch" in saved:  # from before the setting: it ramped from its micro-batch
        saved = dict(saved, batch_ramp_start=saved["micro_batch"])
    data_dir = config["data_dir"] if "data_dir" in given else checkpoint.get("data_dir", config["data_dir"])
    if "data_dir" not in given and not os.path.isdir(data_dir):  # moved since (a given one missing: load_run_data's)
        raise SystemExit(f"error: {data_dir}, the data the run trained on, is not there: give its place with --data_dir")
    model = saved_model_args(checkpoint["model_args"])  # its model's settings as this version names them
    run = {k: v for k, v in {**saved, **model}.items() if k in config and k not in THIS_COMMAND}
    given_now = {k for k in run.keys() & given if config[k] or k not in DECIDED_AT_START}  # a 0 for a picked one: "as before"
    # the run's settings as first given: its recipe_ramp is the ramp before an extension of the budget scaled it
    before = dict(run, batch_ramp=saved.get("recipe_ramp", run.get("batch_ramp")))
    changed = sorted(k for k in given_now if config[k] != before[k])
    kind, shown = "budget_tokens" if run.get("budget_tokens") else "budget_hours", lambda v: f"{v:g}" if type(v) is float else v
    for k in (k for k in changed if k not in CHANGEABLE and (k != kind or not config[k])):
        extend = f"; to train further, give a larger --{kind}" if k.startswith("budget_") else ""
        raise SystemExit(f"error: {named(k, given)}={shown(config[k])} differs from its checkpoint's {shown(before[k])}, and "
                         f"a resume continues its run: leave it out, or start a new run in another --out_dir{extend}")
    kept = {**run, **{k: config[k] for k in changed}, "recipe_ramp": before["batch_ramp"], "data_dir": data_dir}
    spent = checkpoint["tokens"] if kind == "budget_tokens" else checkpoint["elapsed"] / 3600
    if kind in changed:
        kept["batch_ramp"] = min(1.0, run.get("batch_ramp", 0.0) * run[kind] / config[kind])
    extended = (f": the schedules follow it from the progress so far, {spent / config[kind]:.0%} (the learning rate is its "
                f"schedule's there), and the batch ramp ends where it did (batch_ramp {kept['batch_ramp']:.3g}): the "
                f"batch never shrinks") if kind in changed else ""
    return kept, [f"resuming with --{k}={shown(config[k])} (its checkpoint's: {shown(before[k])})"
                     f"{extended if k == kind else ''}" for k in changed]


def check_settings(world, config, rt, given=None, model_config=None):
    """Refuses, with a one-line error each, settings that cannot run together. The configurator has already checked
    each setting's own range. This runs twice. The first call comes before any work and gets `given`, which says
    where each setting came from. The second comes once budget.decide has picked the shape and batch. `model_config`
    is the ModelConfig that the settings make. In the first call, shape fields still at 0 take the ladder's first
    shape, so that a bad model setting is refused before any work."""
    optim = config["optim"]
    if config["wandb_log"] and not process.installed("wandb"):
        raise SystemExit("error: --wandb_log=True needs wandb: pip install wandb (or leave --wandb_log off)")
    # A batch_size of 0 is not decided yet, so the first call checks with `world` in its place.
    check_shares(world, config["batch_size"] or world, config["batch_ramp_start"], config["batch_ramp"])
    if config["resume_from"] and not config["resume"]:
        raise SystemExit(f"error: {named('resume_from', given)}={config['resume_from']} continues a run: add --resume=True")
    # An optimizer without the width's rate rule needs a rate of its own. A rate typed on the command line is taken
    # as meant for it. A rate from a config file is taken only if that file also chose this optimizer; otherwise it
    # was tuned for AdamW. The answer does not depend on the order of the arguments.
    lr_from = [s for s, v in (given or {}).get("lr", {}).items() if v == config["lr"]]
    chose = [s for s in lr_from if s == "--" or given.get("optim", {}).get(s) == optim]
    if not OPTIMIZERS[optim].width_lr and (not config["lr"] or lr_from and not chose):
        why = f"{lr_from[-1]}'s lr={config['lr']:g}" if config["lr"] else "the width's rule (model.lr_for_width)"
        raise SystemExit(f"error: {named('optim', given)}={optim} needs --lr: {why} is AdamW's, and its row in "
                         f"model.OPTIMIZERS does not take it (width_lr)")
    if config["offload"]:
        check_offload(world, model_config, optim, rt.dtype)


def check_shares(world, final, start, ramp):
    """Refuses, in one line, a schedule whose batches `world` processes cannot share evenly. Its batches are `final`
    and, while the batch ramps up (where ramp is above 0 and start below final), the multiples of `start`. Returns
    what the ramp adds at a time: `start`, or 0 where the batch does not ramp."""
    start = start if ramp and start < final else 0  # 0: no ramp, so only the final batch is shared
    for name, batch in (("batch_size", final), ("batch_ramp_start", start)):
        if batch % world:
            raise SystemExit(f"error: --{name}={batch} sequences cannot be split evenly over {world} processes: run in a "
                             f"number of processes that divides {math.gcd(final, start)}, or a new run with a multiple of {world}")
    return start


def split_micro_batches(world, micro, final, start, ramp):
    """Returns (micro, remainder), the two micro-batch sizes that every batch of the schedule is cut into. A process's
    share of a batch is as many micro-batches of `micro` as fit, then the rest in micro-batches of `remainder`. The
    schedule's batches are `final` and, while the batch ramps up, multiples of `start`. Each micro-batch size is a
    graph to compile, so two sizes must serve them all. `micro` is the cap, or a process's share of the final batch
    if that is smaller. `remainder` is the largest size that divides what every share has left over. A batch that
    `world` processes cannot share evenly is refused in one line."""
    start = check_shares(world, final, start, ramp)  # 0: no ramp, so only the final batch is cut
    per_rank, ramp_unit = final // world, start // world  # a process's final batch, and what the ramp adds at a time
    micro = min(micro, per_rank)
    # What a share leaves over after its full micro-batches: a ramp batch of k units leaves (k * left) mod micro, with
    # left = ramp_unit mod micro. If k * left stays below micro for every ramp batch, each leftover is a multiple of
    # left; otherwise they can be any multiple of gcd(left, micro). The final batch leaves per_rank mod micro. The
    # remainder is the largest size that divides them all. (Units of 16 with micro 24: leftovers 16, 8, 0, ...: 8.)
    left = ramp_unit % micro
    ramp_rest = 0 if not left else left if (per_rank - 1) // ramp_unit * left < micro else math.gcd(left, micro)
    return micro, math.gcd(ramp_rest, per_rank % micro) or micro


def settled_line(given, config, resumed):
    """The start-up line "settled:". It prints the value of each setting whose 0 means "decide at start-up", and says
    why it has that value: it was given (on the command line or in a config file, as `given` records), it is the
    checkpoint's in a resume, or the rule named here set it."""
    rules = dict(n_layers="the budget's pick", d_model="the budget's pick", batch_size="the budget's pick",
                 n_heads="the most heads at least 64 wide, or one", d_ffn="4 x d_model",
                 lr=f"the width's rule, {LR_AT_768:g} x ({config['d_model']} / 768) ** {LR_WIDTH_EXPONENT}, tuned for AdamW",
                 micro_batch="the most that fits" if config["device"] == "cuda" and not config["offload"] else
                 "32, or a process's share if smaller")
    groups = {}  # why -> the settings it explains, as name=value
    for k, rule in rules.items():
        asked = [*given[k].values()][-1] if k in given else 0  # the value given last, or 0
        why = "given" if asked else "its checkpoint's" if resumed and k != "micro_batch" else rule
        shown = (lambda v: f"{v:.3g}") if k == "lr" else str
        cut = f" of {shown(asked)} given" if asked and asked != config[k] else ""  # a micro-batch cut to the batch
        groups.setdefault(why, []).append(f"{k}={shown(config[k])}{cut}")
    return "settled: " + "; ".join(f"{', '.join(values)} ({why})" for why, values in groups.items())


def schedule_line(config, schedules_at, sizes_at, seq_len):
    """The start-up line "schedule:". It gives the learning rate at 0, 25, 50, 75 and 100% of the budget, the masking
    rate and where it changes, how often the run evaluates and saves, where, and what a stop signal does.
    `schedules_at` is train.py's (the batch, the rate and the masking rate at a progress, with the run's settings), so
    a fork's new schedule shows here as it will run (a masking rate that takes more than 8 values is given by its first
    and last values). `sizes_at(batch)` is a process's micro-batch sizes for a batch (train.micro_batch_sizes).
    Each count of masked tokens per row that the schedules reach, with each micro-batch size it meets, is a graph
    torch.compile builds. A schedule that needs more than runtime.MAX_GRAPHS of them at the grid's points is refused
    here, in one line, where it would otherwise fail mid-run (a smooth masking schedule, say). A schedule that changes
    between the points may still pass."""
    # The schedules at every 840th of the budget: the steps of a staircase of up to 8 levels fall on that grid
    steps = [schedules_at(i / 840, config) for i in range(840)]  # (batch, lr, masking rate) at each
    shapes = {(masked_count(rate, seq_len), size) for batch, _, rate in steps for size in sizes_at(batch)}
    if config["compile"] and not config["offload"] and len(shapes) > runtime.MAX_GRAPHS:
        raise SystemExit(f"error: the schedules need {len(shapes)} compiled shapes (masked tokens per row x micro-batch "
                         f"sizes), more than torch.compile's {runtime.MAX_GRAPHS}: give the masking rate fewer values")
    changes = [(i / 840, s[2]) for i, s in enumerate(steps) if i == 0 or s[2] != steps[i - 1][2]]
    first, last = steps[0][2], steps[-1][2]
    masking = (f"{first:.3g} throughout" if len(changes) == 1 else f"{first:.3g} at the start to {last:.3g} at the end"
               if len(changes) > 8 else ", ".join(f"{rate:.3g} from {share:.0%}" for share, rate in changes))
    every = [f"every {m:g} min" if m else "every step" for m in (config["eval_interval_minutes"], config["ckpt_interval_minutes"])]
    return (f"schedule: lr {', '.join(f'{schedules_at(p, config)[1]:.3g}' for p in (0, 0.25, 0.5, 0.75, 1))} at 0, 25, 50, 75 "
            f"and 100% of the budget ({config['lr_schedule']}); masking rate {masking}; an evaluation {every[0]} and a "
            f"checkpoint {every[1]} of training time, to {os.path.join(config['out_dir'], 'ckpt.pt')} (the last "
            f"{config['keep_checkpoints']} kept); Ctrl-C or SIGTERM ends the step, saves and exits (--resume=True continues)")


def ramp_line(start, final, ramp, micro, remainder):
    """The start-up line that says the batch's schedule (train.batch_size_at) and the sizes of a process's
    micro-batches."""
    micros = f"micro-batches of {micro} per process{f' (and of {remainder} for the rest)' * (remainder < micro)}"
    if ramp <= 0 or start >= final:
        return f"batch: {final:,} sequences a step throughout; {micros}"
    return (f"batch: {start:,} sequences a step at the start, then {start:,} more at a time up to {final:,} at {ramp:.0%} of the "
            f"budget (batch_ramp_start, batch_size, batch_ramp); {micros}")
