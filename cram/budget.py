"""The budget's rule in one place. From the compute a budget buys it picks the shape (one of LADDER's) and the final
batch; train.py then takes the peak rate from the width (model.lr_for_width). The rule's functions are pure and sit
beside their constants and sources. `decide` applies them for train.py: a setting given wins, and a resume keeps its
checkpoint's. start_lines say what the rule picked, and docs/training.md has the published points it follows."""
import dataclasses
import functools
import math

import torch

from . import runtime
from .data import repeat_warning
from model import SHAPE_FIELDS, ModelConfig

# The shapes the rule picks from, smallest first, as (layers, width): each has heads of 64 and a feed-forward 4x the width;
# ELECTRA-Small is about 6 x 384's size, BERT-Base 12 x 768, the paper's crammed BERT 16 x 768, BERT-Large 24 x 1024
LADDER = ((2, 128), (3, 192), (4, 256), (5, 320), (6, 384), (8, 512), (10, 640), (12, 768), (16, 768), (24, 1024))
# A step's share of the matmul's speed. A compiled step at width 768 runs at STEP_EFFICIENCY of a 2048^3 matmul's
# FLOP/s (measured on the H100 at 16 x 768). A CPU's steps reach 0.6-0.9 at every width, so 0.5 errs there toward a
# smaller shape. On a GPU the share grows as width ** GPU_WIDTH_EXPONENT; the law was fitted to one H200's whole
# 3.5-minute runs (0.41 at 8 x 512, 0.45 at 10 x 640), whose steps alone reached 0.44 and 0.50, so it errs low. An
# eager step reaches EAGER_SHARE of a compiled one's speed, and an off-load step OFFLOAD_SHARE of an eager one's
# (BENCHMARKS.md).
STEP_EFFICIENCY = 0.5
GPU_WIDTH_EXPONENT = 0.6
EAGER_SHARE, OFFLOAD_SHARE = dict(cpu=0.88, gpu=0.68), dict(cpu=0.85, gpu=0.6)
# The paper's point: in its 24 hours on an RTX A6000 (a matmul speed of about 100 TFLOP/s), 16 x 768 was its best
# shape, and 94.4M is the matmul weights of its blocks. Its compute is measured as a run's is: hours x matmul speed x
# STEP_EFFICIENCY, 4.3e18 FLOPs.
PAPER_COMPUTE = 24 * 3600 * 100e12 * STEP_EFFICIENCY
PAPER_WEIGHTS = 94.4e6
SIZE_EXPONENT = 0.40     # the best size grows as compute ** 0.40 from the paper's point; at the CPU's 1.5e14 its nearest rung is 3 x 192
MAX_EPOCHS = 16          # repeated tokens keep little value past about 16 epochs (Muennighoff et al. 2023)
# The final batch grows as a power of the sequences the budget trains: a line through the CPU's measured point (a
# batch of 32 at 29k sequences) and the published batch of about 4k at the paper's day, whose budget trains 54M
# sequences of 128 tokens (4k is the Cramming paper's best batch for GLUE, and Izsak et al. 2021 picked it over 8k and
# 16k at about an H100-day). It levels off at MAX_BATCH, past which no published recipe gained (Izsak; RoBERTa's 2k at
# 125k steps beat 8k at 31k). The batch grows as sequences ** 0.64; since the sequences grow about as compute ** 0.58,
# that is about compute ** 0.37, near the critical batch's 0.28-0.34 (McCandlish et al. 2018; DeepSeek LLM 2024;
# Bergsma et al. 2025).
PAPER_BATCH, PAPER_SEQUENCES, BATCH_EXPONENT = 4096, 54e6, 0.64
MIN_BATCH, MAX_BATCH = 32, 8192  # 32: the smallest measured, and a CPU's micro-batch
# A CPU's bfloat16 step (cpu_bf16_gain): its matmuls (this share of a float32 step) at the measured speed-up, the rest
# at 1.08x float32's time (BENCHMARKS.md, "The CPU's precision")
CPU_MATMUL_SHARE, CPU_BF16_REST = 0.75, 1.08


def shape_of(pair, given):
    """One of LADDER's (layers, width) pairs as ModelConfig's four shape fields, with any `given` (not 0) in their place.
    Heads are 64 wide (or, where 64 does not divide the width, the most heads up to width / 64 that do), and the
    feed-forward is 4x the width. Where only the heads are given, the width is the multiple of them nearest the pair's."""
    heads = given.get("n_heads")
    width = given.get("d_model") or (heads * max(1, round(pair[1] / heads)) if heads else pair[1])
    heads = heads or max(h for h in range(1, max(1, width // 64) + 1) if width % h == 0)
    return dict(n_layers=given.get("n_layers") or pair[0], d_model=width, n_heads=heads, d_ffn=given.get("d_ffn") or 4 * width)


def step_efficiency(d_model, gpu=False, compiled=True, offload=False):
    """A step's speed as a share of a 2048^3 matmul's, at width d_model. On a GPU a narrower model reaches less, because
    the memory traffic of its norms, activations and attention weighs more beside its matmuls. A CPU reaches the same
    share at any width. An eager step and an off-load step reach less."""
    kind, width = ("gpu", (d_model / 768) ** GPU_WIDTH_EXPONENT) if gpu else ("cpu", 1.0)
    eager = EAGER_SHARE[kind] if offload or not compiled else 1.0
    return STEP_EFFICIENCY * width * eager * (OFFLOAD_SHARE[kind] if offload else 1.0)


def shape_for_budget(matmul_compute, tokens, data_tokens, model_args, mask_rate, efficiency_of):
    """Picks one of LADDER's shapes for a budget of `matmul_compute` FLOPs at the matmul's speed (or of `tokens`).
    For each shape, the FLOPs it can spend are matmul_compute times its width's share (efficiency_of), and the best
    size for them is PAPER_WEIGHTS * (FLOPs / PAPER_COMPUTE) ** SIZE_EXPONENT. The nearest shape is the one whose
    blocks' weights are nearest that size, by ratio. Where the nearest would read `data_tokens` more than MAX_EPOCHS
    times, a larger shape is taken, up to 4x the best size. Returns (the shape taken, the nearest, its tokens)."""
    rungs = []  # each shape's blocks' weights, the best size for the FLOPs it can spend, and the tokens it trains
    for pair in LADDER:
        config = ModelConfig(**{**model_args, **shape_of(pair, {})})
        per_token = config.flops_per_token(mask_rate)
        trained = tokens or matmul_compute * efficiency_of(config.d_model) / per_token
        best = PAPER_WEIGHTS * (trained * per_token / PAPER_COMPUTE) ** SIZE_EXPONENT
        rungs.append(dict(weights=config.n_layers * config.layer_weights(), best=best, tokens=trained))
    i = nearest = min(range(len(rungs)), key=lambda j: abs(math.log(rungs[j]["weights"] / rungs[j]["best"])))
    while (not tokens and rungs[i]["tokens"] > MAX_EPOCHS * data_tokens and i + 1 < len(rungs)
           and rungs[i + 1]["weights"] <= 4 * rungs[nearest]["best"]):
        i += 1  # the nearest shape would repeat the data too often: a larger one, up to 4x the best size
    return LADDER[i], LADDER[nearest], rungs[i]["tokens"]


def batch_for_budget(tokens, seq_len):
    """The final batch for a budget that trains `tokens`, by the power law above, from MIN_BATCH to MAX_BATCH. More
    tokens never give a smaller batch."""
    batch = 2 ** round(math.log2(PAPER_BATCH * (tokens / seq_len / PAPER_SEQUENCES) ** BATCH_EXPONENT))
    return min(MAX_BATCH, max(MIN_BATCH, batch))


def expected_steps(sequences, start, final, ramp):
    """About how many optimizer steps a run of `sequences` takes with train.batch_size_at's batches. While the batch
    grows, each of its sizes (i times `start`) lasts ramp * start / (final - start) of the budget, the last one up to
    `ramp`, and the final batch takes the rest. It counts a fraction of the budget as the same fraction of the sequences.
    That is close under a budget of tokens (each share ends on a whole step) and an estimate under one of hours (small
    batches may run slower)."""
    if ramp <= 0 or (levels := -(-final // start) - 1) < 1:  # the ramp's batches below the final one
        return sequences / final
    share = ramp * start / (final - start)
    growing = sum(min(share, ramp - (i - 1) * share) * sequences / (i * start) for i in range(1, levels + 1))
    return growing + (1 - ramp) * sequences / final


def cpu_bf16_gain(speedup):
    """How much faster a CPU's bfloat16 step is than its float32 step, when its matmuls are `speedup` times faster and
    the rest of the step is a little slower (Amdahl's law)."""
    return 1 / ((1 - CPU_MATMUL_SHARE) * CPU_BF16_REST + CPU_MATMUL_SHARE / speedup)


def decide(config, checkpoint, *, model_args, data_tokens, rt, world, master):
    """Decides the shape and the final batch (train.py adds the peak rate). Each one given (not 0) is used as given. A
    resume keeps its checkpoint's. A new run has the budget's rule pick the rest (pick_for). `model_args` are the
    model's other settings and its data's vocabulary and sequence length, with any shape (the rule replaces it). Returns
    the decided settings, the rule's pick (or None), which the checkpoint keeps, and a new run's start-up lines that say
    what the rule picked."""
    # A resume's are all here already: setup.resume_settings wrote its run's shape, batch and rate into config.
    given = {k: config[k] for k in (*SHAPE_FIELDS, "batch_size") if config[k]}  # those given (not 0)
    pick, decided = (checkpoint or {}).get("budget"), {}
    if not checkpoint and len(given) < len(SHAPE_FIELDS) + 1:
        compute, timing = budget_compute(config, rt, world, master)
        efficiency_of = functools.partial(step_efficiency, gpu=rt.device.type != "cpu", compiled=rt.compile, offload=config["offload"])
        decided, picked = pick_for(compute, config, given, model_args, data_tokens, world, efficiency_of)
        pick = dict(timing, **picked)
    decided.update(given)
    lines = [] if checkpoint else start_lines(pick, {**config, **decided}, model_args["seq_len"])
    return decided, pick, lines


def budget_compute(config, rt, world, master):
    """The FLOPs a budget of hours buys, and how they were measured: the hours times a timed matmul's speed (rank 0's)
    times the processes. A budget of tokens buys 0 here, since the rule counts its tokens instead. A CPU's step keeps up
    with its float32 matmuls rather than its bfloat16 ones, so a CPU times float32 and, running bfloat16, multiplies by
    cpu_bf16_gain."""
    matmul_rt = dataclasses.replace(rt, dtype=torch.float32) if rt.device.type == "cpu" else rt
    speed, gain = 0.0, 1.0
    if master and not config["budget_tokens"]:
        speed = runtime.matmul_speed(matmul_rt)
        if rt.device.type == "cpu" and rt.dtype == torch.bfloat16:
            gain = cpu_bf16_gain(rt.bf16_speedup or runtime.bf16_speedup())
    if world > 1:  # rank 0's measurement, on every process
        speed, gain = runtime.from_rank0(speed, rt.device), runtime.from_rank0(gain, rt.device)
    compute = config["budget_hours"] * 3600 * speed * gain * world
    return compute, dict(matmul_flops=speed, matmul_dtype=matmul_rt.dtype_name(), bf16_gain=gain)


def pick_for(matmul_compute, config, given, model_args, data_tokens, world, efficiency_of):
    """A new run's shape and final batch by the rule, those in `given` as given, and the pick's record, which the
    checkpoint keeps. The budget is budget_compute's FLOPs, or config's budget_tokens. `efficiency_of` is
    step_efficiency for this device, and `model_args` are the model's other settings (the rule replaces the shape)."""
    tokens, mask_rate = config["budget_tokens"], config["mask_rate"]
    taken, nearest, _ = shape_for_budget(matmul_compute, tokens, data_tokens, model_args, mask_rate, efficiency_of)
    shape = shape_of(taken, given)
    per_token = ModelConfig(**{**model_args, **shape}).flops_per_token(mask_rate)
    efficiency = efficiency_of(shape["d_model"])
    tokens = tokens or matmul_compute * efficiency / per_token
    law, micro = batch_for_budget(tokens, model_args["seq_len"]), config["micro_batch"]
    # A multiple of the processes, so that each takes an equal share, and of a given micro-batch where one fits the law.
    unit = world * (micro if micro and micro * world <= law else 1)
    batch = given.get("batch_size") or max(1, round(law / unit)) * unit
    return dict(shape, batch_size=batch), dict(compute=tokens * per_token, efficiency=efficiency, tokens=tokens,
                                               epochs=tokens / data_tokens, taken=list(taken), nearest=list(nearest), given=sorted(given))


def start_lines(pick, config, seq_len):
    """A new run's start-up line "budget:", which says what the rule picked: the shape and the batch (from `pick`), or
    nothing where the rule picked nothing. The peak rate is decided after it, in train.py, and the line "settled:"
    says it."""
    if not pick:
        return []
    hours, tokens = config["budget_hours"], config["budget_tokens"]  # the budget as given: '5 min', '24 h'
    budget = f"{tokens:,} tokens" if tokens else f"{hours:g} h" if hours >= 1 else f"{60 * hours:.3g} min"
    if pick["matmul_flops"]:
        gain = f" x {pick['bf16_gain']:.2g} (bfloat16's step over float32's here)" if pick.get("bf16_gain", 1.0) != 1.0 else ""
        budget = (f"{budget} x {pick['matmul_flops'] / 1e12:.3g} TFLOP/s (a {pick['matmul_dtype']} 2048^3 matmul here)"
                  f"{gain} x {pick.get('efficiency', STEP_EFFICIENCY):.2g} (a step's share of it) = {pick['compute']:.2g} FLOPs")
    else:
        budget = f"{budget}, {pick['compute']:.2g} FLOPs"
    steps = expected_steps(pick["tokens"] / seq_len, config["batch_ramp_start"], config["batch_size"], config["batch_ramp"])
    taken, nearest = "{} x {}".format(*pick["taken"]), "{} x {}".format(*pick["nearest"])
    why = (f"the ladder's {taken}, nearest that compute" if taken == nearest else
           f"the ladder's {taken}: {nearest} is nearest that compute, a larger one repeats the data at most {MAX_EPOCHS} times")
    given = f"; given: {', '.join(pick['given'])}" if pick["given"] else ""
    return [f"budget: {budget} -> {config['n_layers']} x {config['d_model']} ({why}{given}), about "
            f"{pick['tokens'] / 1e6:,.1f}M tokens ({pick['epochs']:.3g} epochs), a final batch of {config['batch_size']} "
            f"sequences, about {steps:,.0f} optimizer steps"]


def warn_repeats(total, seconds, tokens_per_s, data_tokens, budget_hours):
    """Prints data.repeat_warning's warning once the speed is known (2 minutes in, or 5% of the budget), if the run will
    read its data too many times: `total` tokens, which it will have trained at `tokens_per_s`. Returns whether the
    speed was known, so that the loop warns only once."""
    if seconds < min(120.0, 0.05 * 3600 * budget_hours):
        return False
    warning = repeat_warning(total, data_tokens, f"at {tokens_per_s:,.0f} tokens/s")
    if warning:
        print(warning)
    return True
