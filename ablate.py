"""Recipe ablations at equal wall-clock, made robust to a noisy machine: one command, rerunnable.

    python ablate.py                                            # the quickstart scale, 5 minutes
    python ablate.py --variants=reference,muon,mask40,muon+mask40,lr=2e-3+batch_size=32 --seeds=3
    python ablate.py --base=config/ablate_small.py --budget_minutes=15 --out_dir=out/ablate_small

The paper's rule is equal wall-clock; on a shared machine a run's speed varies from minute to
minute, so each variant is instead (1) timed: short full-batch runs of every variant, interleaved
and repeated, give its tokens/s; then (2) trained for the tokens that speed reaches in the budget
(`--budget_tokens`, so its schedules and result do not depend on the machine's load), once per
seed. (`--budget_tokens=` skips the timing and gives every variant those tokens: for variants
that run at one speed, such as learning rates.) The table gives each variant's final validation loss (mean and spread over seeds), its
speed, and its time-to-quality: the share of the budget it needs to reach the reference's mean
final loss (read off its evaluation curve, so an upper bound: a run given only that long would
decay its learning rate sooner and do better). Finished runs are kept and reused: rerun to add
seeds or variants. Writes <out_dir>/results.json and prints a markdown table.
"""
import json
import os
import statistics
import subprocess
import sys

from compare import read_metrics
from configurator import configure
from data import write_json

# -----------------------------------------------------------------------------
variants = "reference,muon,mask40"  # names in VARIANTS or key=value settings; '+' combines (muon+lr=2e-3); 'reference' first
base = "config/train_quickstart.py"  # the config every variant starts from (data, shape, budget)
budget_minutes = 5.0      # the wall-clock budget each variant is given
budget_tokens = 0         # > 0: every variant trains this many tokens, untimed (for variants of one speed)
seeds = 3                 # training runs per variant (seeds 0, 1, ...)
speed_steps = 12          # full-batch steps per timing run (the first log window, with start-up, is dropped)
speed_repeats = 2         # timing runs per variant, interleaved across variants
train_args = "--compile=False --eval_interval_minutes=0.5 --smear=False"  # every run, before the variant's own
# (smear off: ablations start from the paper's recipe, which train.py's default extends with smear)
out_dir = "out/ablate"
# -----------------------------------------------------------------------------
HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = {
    "reference": [],
    "muon": ["--optim=muon"],                   # Muon on the blocks' matrices (muon.py)
    "mask40": ["--mask_rate=0.4"],              # Wettig et al.: masking 40% beats 15% (and our 25%?)
    "mask30": ["--mask_rate=0.3"],
    "smear": ["--smear=True"],                  # neighbours' embeddings mixed into each position (model.py)
}


def variant_args(name):
    """train.py arguments of a variant: named ones from VARIANTS, key=value ones as --key=value."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in VARIANTS and "=" not in p]
    if unknown:
        raise SystemExit(f"error: unknown variant {', '.join(unknown)} (known: {', '.join(VARIANTS)}, or a setting "
                         f"as key=value; '+' combines)")
    return [arg for p in parts for arg in (VARIANTS[p] if p in VARIANTS else [f"--{p}"])]


def train(name, run_dir, *args):
    """A train.py run of variant `name` into run_dir (kept when it finished earlier)."""
    if os.path.isfile(os.path.join(run_dir, "done")):
        return
    if os.path.isdir(run_dir):
        for f in os.listdir(run_dir):  # an unfinished run starts again
            os.remove(os.path.join(run_dir, f))
    command = [sys.executable, os.path.join(HERE, "train.py"), base, *train_args.split(), *variant_args(name), *args,
               f"--out_dir={run_dir}", "--fill_in_examples=0"]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    open(os.path.join(run_dir, "done"), "w").close()


def speed(run_dir):
    """Median tokens/s of a timing run's log windows after the first."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rates = [r["tokens_per_s"] for r in map(json.loads, f) if r["kind"] == "train"]
    return statistics.median(rates[1:] or rates)


def tokens_to_reach(evals, target):
    """Tokens at which an evaluation curve first reaches `target` (linear between evaluations), or None."""
    for before, after in zip(evals, evals[1:]):
        if after["val_loss"] <= target:
            share = (before["val_loss"] - target) / max(before["val_loss"] - after["val_loss"], 1e-12)
            return before["tokens"] + min(max(share, 0.0), 1.0) * (after["tokens"] - before["tokens"])
    return None


def spread(values):
    return f"{statistics.mean(values):.4f} ({min(values):.4f}-{max(values):.4f})" if values else "-"


def main():
    names = [v for v in variants.split(",") if v]
    for name in names:
        variant_args(name)
    if not names or names[0] != "reference":
        raise SystemExit("error: --variants must start with 'reference', the recipe the others are measured against")
    budget = budget_minutes * 60
    # (1) speed: every variant's full-batch steps, interleaved, repeated
    speeds = {name: [] for name in names}
    for repeat in range(0 if budget_tokens else speed_repeats):
        for name in names:
            run_dir = os.path.join(out_dir, "speed", f"{name}-{repeat}")
            train(name, run_dir, "--batch_ramp=0", f"--max_steps={speed_steps}", "--log_interval=3",
                  "--eval_sequences=64", "--budget_hours=1")
            speeds[name].append(speed(run_dir))
            print(f"speed {name} #{repeat}: {speeds[name][-1]:,.0f} tokens/s", flush=True)
    # (2) each variant trained for the tokens its speed reaches in the budget, once per seed
    results = {}
    for name in names:
        tokens_per_s = statistics.median(speeds[name]) if speeds[name] else budget_tokens / budget
        tokens = budget_tokens or int(tokens_per_s * budget)
        curves = []
        for seed in range(seeds):
            run_dir = os.path.join(out_dir, name, f"seed{seed}")
            print(f"train {name} seed {seed}: {tokens:,} tokens", flush=True)
            train(name, run_dir, f"--budget_tokens={tokens}", f"--seed={seed}")
            curves.append(read_metrics(run_dir))
        results[name] = dict(tokens_per_s=tokens_per_s, speeds=speeds[name], budget_tokens=tokens,
                             val_loss=[c[-1]["val_loss"] for c in curves], accuracy=[c[-1]["accuracy"] for c in curves],
                             curves=curves)
    target = statistics.mean(results["reference"]["val_loss"])
    lines = [f"| variant | val loss, mean (min-max) over {seeds} seeds | accuracy | tokens/s | tokens | "
             f"time to the reference's {target:.4f} |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        reached = [tokens_to_reach(c, target) for c in r["curves"]]
        shares = [t / r["tokens_per_s"] / budget for t in reached if t is not None]
        r["time_to_quality"] = shares
        when = (f"{100 * statistics.mean(shares):.0f}% ({100 * min(shares):.0f}-{100 * max(shares):.0f}%)"
                if len(shares) == len(reached) else f"not reached in {len(reached) - len(shares)} of {len(reached)}")
        lines.append(f"| {name} | {spread(r['val_loss'])} | {statistics.mean(r['accuracy']):.3f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['budget_tokens'] / 1e6:.2f}M | {when} |")
    print("\n".join(lines))
    write_json(os.path.join(out_dir, "results.json"), dict(base=base, budget_minutes=budget_minutes, train_args=train_args,
                                                           target=target, variants=results))
    print(f"wrote {os.path.join(out_dir, 'results.json')}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
