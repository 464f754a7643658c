"""Recipes and runs compared on validation loss: one tool for plotting runs, training recipes at
equal time, and ablations made robust to a noisy machine.

    python tools/compare.py --runs=out/a,out/b                          # plot what runs logged
    python tools/compare.py --variants=crammed,recipe_reference         # train.py's recipe against the paper's
    python tools/compare.py --variants=crammed,mask_rate=0.4,optim=muon+lr=2e-3 --protocol=tokens --seeds=3

A variant is `crammed` (the base config itself: train.py's recipe), the name of a config/<name>.py
applied on top of the base (recipe_reference, bert_original), or settings as key=value; '+'
combines them. The first variant is the reference the others are measured against. Every
variant trains on the base config's data, from the same settings plus its own, one after another:
  protocol=clock   each for the same wall-clock budget (budget_minutes, or the base's): simple,
                   and right on a machine of its own (a GPU)
  protocol=tokens  on a shared machine a run's speed varies from minute to minute, so each variant
                   is first timed (short full-batch runs of every variant, interleaved and
                   repeated), then trained for the tokens that speed reaches in the budget
                   (--budget_tokens: once the speed is timed, the schedules and result of a run
                   no longer depend on the load while it trains)
Each variant trains once per seed. The table gives each variant's final validation loss (mean and
spread over seeds, fixed 25% masks), its speed, and its time-to-quality: the share of the budget
it needs to reach the first variant's mean final loss, read off its evaluation curve (an upper
bound: a run given only that long would decay its learning rate sooner). Finished runs are kept
and reused: rerun to add seeds or variants. Writes <out_dir>/results.json and <out_dir>/compare.png.
"""
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]  # the core, and measure.py beside this tool
from configurator import configure, read_config_file  # noqa: E402  (the core sits one folder up)
from cram.files import (check_writable, claim_folder, load_checkpoint, read_jsonl, read_metrics,  # noqa: E402
                        write_atomically, write_json)
from measure import held_below, save_figure  # noqa: E402
from cram.process import child_env, guarded, installed  # noqa: E402
from cram.runtime import auto_dtype  # noqa: E402
import torch  # noqa: E402  (cram.files has imported it already)

# -----------------------------------------------------------------------------
runs = ""                 # comma-separated out_dirs of finished runs to plot (each with a metrics.jsonl)
variants = ""             # comma-separated variants to train (see above); the first is the reference
base = "config/train_quickstart.py"  # the config every variant starts from (data, shape, budget); "": train.py's defaults (the budget picks each variant's shape)
protocol = "clock"        # {clock, tokens}: equal wall-clock budgets, or timed, then equal-time token budgets
budget_minutes = 0.0      # >= 0: each variant's budget (0: the base config's budget_hours)
budget_tokens = 0         # >= 0: protocol=tokens: > 0 gives every variant these tokens, untimed (time-to-quality: their share)
seeds = 1                 # [1, 100000]: training runs per variant (seeds 0, 1, ...)
speed_steps = 12          # >= 6: protocol=tokens: full-batch steps per timing run (logged every 3; the first window is dropped)
speed_repeats = 2         # >= 1: protocol=tokens: timing runs per variant, interleaved across variants
dtype = "auto"            # {auto, float32, bfloat16, float16}: every run's precision; auto: train.py's rule, decided once here, so that no two variants train in other precisions (a CPU times it, and a near tie could go either way run to run)
train_args = ""           # more train.py settings for every run, before the variant's own, space-separated
out_dir = "out/compare"   # the runs (<out_dir>/<variant>/seed<k>), results.json and compare.png
png = ""                  # the picture; default: <out_dir>/compare.png
# -----------------------------------------------------------------------------
INITIAL_WEIGHTS = "initial weights: each drawn from a generator keyed by its name"  # the last line of a done file


def variant_args(name):
    """train.py arguments of a variant: config files and --key=value settings, in order."""
    args = []
    for part in name.split("+"):
        path = os.path.join(ROOT, "config", f"{part}.py")
        if "=" in part:
            args.append(f"--{part}")
        elif os.path.isfile(path):
            args.append(path)
        elif part != "crammed":
            raise SystemExit(f"error: unknown variant '{part}': no config/{part}.py, not 'crammed' and not key=value")
    return args


def decide_dtype():
    """dtype=auto decided once for out_dir, as train.py decides it on the runs' device (train_args' or the base's
    --device, else a GPU if there is one), and kept in <out_dir>/dtype: a rerun that adds seeds or variants gives its
    runs the same precision as the finished ones, even where a CPU's timing would now pick the other."""
    global dtype
    if dtype != "auto":
        return
    kept = os.path.join(out_dir, "dtype")
    if os.path.isfile(kept):
        dtype = Path(kept).read_text(encoding="utf-8").strip()
        return
    given = [a.split("=", 1)[1] for a in train_args.split() if a.startswith("--device=")]
    device = (given or [(read_config_file(base) if base else {}).get("device", "auto")])[-1]
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    dtype = auto_dtype(torch.device(device))[0]
    write_atomically(kept, lambda tmp: Path(tmp).write_text(dtype, encoding="utf-8"))


def train(name, run_dir, *args):
    """A train.py run of variant `name` into run_dir, kept when it finished earlier with the same settings
    (its `done` file holds them); one finished with other settings (another budget, base or train_args)
    is refused, not reused as if it were this command's, nor replaced."""
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--dtype={dtype}", *([base] if base else []), *train_args.split(),
               *variant_args(name), *args, f"--out_dir={run_dir}", "--fill_in_examples=0"]
    # The done file names how the initial weights were drawn too, so that a run from before they were keyed by name
    # (model.keyed_generator) is not paired with a later variant as if both started from the same weights
    settings, done = "\n".join([*command[2:], INITIAL_WEIGHTS]), os.path.join(run_dir, "done")
    if os.path.isfile(done):
        with open(done, encoding="utf-8") as f:
            earlier = f.read()
        if earlier and earlier != settings:  # (empty: an older compare.py's, which kept no settings)
            raise SystemExit(f"error: {run_dir} finished with other settings than this command gives it (they are "
                             f"in its done file): choose another --out_dir, or remove that run to train it again")
        return
    held = held_below(run_dir)
    if held:  # the train.py of a compare.py that was killed, say: never remove a live run's folder
        raise SystemExit(f"error: {held[0]} is in use by another process (pid {held[1]}): wait for it to end or stop "
                         f"it, then run the same command again")
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run starts again
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, "train.log")  # follow a long run with tail -f
    print(f"training {name} -> {log_path}", flush=True)
    with open(log_path, "w", encoding="utf-8") as log:  # the run stops (and saves) if this tool is killed: process.follow_parent
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=child_env()).returncode
    with open(log_path, encoding="utf-8") as log:
        output = log.read()
    if code != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{output[-2000:]}")
    print("\n".join(line for line in output.splitlines() if line.startswith(("final:", "torch.compile"))), flush=True)
    # whole or not at all: a cut one would hold other settings than the command's, and an empty one an older compare.py's
    write_atomically(done, lambda tmp: Path(tmp).write_text(settings, encoding="utf-8"))


def speed(run_dir):
    """Median tokens/s of a run's log windows after the first (start-up and compilation)."""
    rates = [r["tokens_per_s"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r.get("kind") == "train"]
    if len(rates) < 2:
        raise SystemExit(f"error: {run_dir} logged {len(rates)} window(s) of speed; a timing needs two or more: "
                         f"its budget ended it early, or give a larger --speed_steps")
    return statistics.median(rates[1:])


def timed_speeds(names, budget):
    """protocol=tokens, step 1: every variant's full-batch steps, interleaved, repeated, each under the
    variant's clock budget (which picks its shape and batch where it gives none: train.py's budget)."""
    speeds = {name: [] for name in names}
    for repeat in range(speed_repeats):
        for name in names:
            run_dir = os.path.join(out_dir, "speed", f"{name}-{repeat}")
            train(name, run_dir, "--batch_ramp=0", f"--max_steps={speed_steps}", "--log_interval=3",
                  "--eval_sequences=64", f"--budget_hours={budget / 3600!r}")
            speeds[name].append(speed(run_dir))
            print(f"speed {name} #{repeat}: {speeds[name][-1]:,.0f} tokens/s", flush=True)
    return speeds


def timed_shape(name):
    """The shape and final batch of a variant's first timing run, as settings: its token-budget runs
    train what was timed (a token budget alone could pick another shape)."""
    ckpt = load_checkpoint(os.path.join(out_dir, "speed", f"{name}-0", "ckpt.pt"), "settings")
    shape = [f"--{k}={ckpt['model_args'][k]}" for k in ("n_layers", "d_model", "n_heads", "d_ffn")]
    return shape + [f"--batch_size={ckpt['config']['batch_size']}"]


def train_variants(names, budget):
    """Each variant once per seed: {name: [evaluation curve per seed]}, the speeds measured and
    the token budgets given (protocol=tokens)."""
    speeds = timed_speeds(names, budget) if protocol == "tokens" and not budget_tokens else {}
    curves, budgets = {}, {}
    for name in names:
        if protocol == "tokens":
            budgets[name] = budget_tokens or int(statistics.median(speeds[name]) * budget)
            limit = [f"--budget_tokens={budgets[name]}", *(timed_shape(name) if speeds else [])]
        else:
            limit = [f"--budget_hours={budget / 3600!r}"]
        curves[name] = []
        for seed in range(seeds):
            run_dir = os.path.join(out_dir, name, f"seed{seed}")
            train(name, run_dir, *limit, f"--seed={seed}")
            curves[name].append(read_metrics(run_dir))
    return curves, speeds, budgets


def time_to_reach(evals, target):
    """Seconds at which an evaluation curve first reaches `target` (linear between evaluations),
    or None; under protocol=tokens the run's tokens at its timed speed stand in for its clock."""
    for before, after in zip(evals, evals[1:]):
        if after["val_loss"] <= target:
            share = (before["val_loss"] - target) / max(before["val_loss"] - after["val_loss"], 1e-12)
            return before["elapsed"] + min(max(share, 0.0), 1.0) * (after["elapsed"] - before["elapsed"])
    return None


def spread(values, fmt="{:.4f}"):
    return f"{fmt.format(statistics.mean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def variants_table(curves, speeds, budget):
    """Markdown: each variant's loss over seeds, speed, tokens and time to the first's mean loss."""
    first = next(iter(curves))
    target = statistics.mean(c[-1]["val_loss"] for c in curves[first])
    lines = [f"| variant | val loss, mean (min-max) over {seeds} seed(s) | accuracy | tokens/s | tokens | "
             f"time to {first}'s {target:.4f} |", "|---|---|---|---|---|---|"]
    results = {}
    for name, runs_of in curves.items():
        tokens_per_s = statistics.median(speeds[name]) if speeds.get(name) else \
            statistics.median(c[-1]["tokens"] / max(c[-1]["elapsed"], 1e-9) for c in runs_of)
        if protocol == "tokens":  # the clock of a run trained by tokens is its tokens at the timed speed
            runs_of = [[dict(e, elapsed=e["tokens"] / tokens_per_s) for e in c] for c in runs_of]
        own_budget = budget_tokens / tokens_per_s if protocol == "tokens" and budget_tokens else budget
        reached = [time_to_reach(c, target) for c in runs_of]
        shares = [t / own_budget for t in reached if t is not None]
        when = spread([100 * s for s in shares], "{:.0f}%") if len(shares) == len(reached) else \
            f"not reached in {len(reached) - len(shares)} of {len(reached)}"
        losses = [c[-1]["val_loss"] for c in runs_of]
        lines.append(f"| {name} | {spread(losses)} | {statistics.mean(c[-1]['accuracy'] for c in runs_of):.3f} | "
                     f"{tokens_per_s:,.0f} | {runs_of[0][-1]['tokens'] / 1e6:.2f}M | {when} |")
        results[name] = dict(val_loss=losses, tokens_per_s=tokens_per_s, speeds=speeds.get(name, []),
                             time_to_quality=shares, curves=curves[name])
    return "\n".join(lines), dict(target=target, variants=results)


def runs_table(curves):
    lines = ["| run | val loss | masked-token accuracy | minutes | tokens | steps |", "|---|---|---|---|---|---|"]
    for run, evals in curves.items():
        last = evals[-1]
        lines.append(f"| {run} | {last['val_loss']:.4f} | {last['accuracy']:.3f} | {last['elapsed'] / 60:.1f} | "
                     f"{last['tokens'] / 1e6:.2f}M | {last['step']} |")
    return "\n".join(lines)


def plot(curves, path):
    """Validation loss against minutes and against tokens, one line per run."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for run, evals in curves.items():
        losses = [e["val_loss"] for e in evals]
        by_time.plot([e["elapsed"] / 60 for e in evals], losses, marker="o", markersize=3, label=run)
        by_tokens.plot([e["tokens"] / 1e6 for e in evals], losses, marker="o", markersize=3, label=run)
    by_time.set(xlabel="training minutes", ylabel="validation MLM loss")
    by_tokens.set(xlabel="tokens trained (millions)")
    for ax in (by_time, by_tokens):
        ax.grid(alpha=0.3)
    by_time.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=80)
    plt.close(fig)


def main():
    run_dirs, names = [r for r in runs.split(",") if r], [v for v in variants.split(",") if v]
    if bool(run_dirs) == bool(names):
        raise SystemExit("error: give --runs=out_dir[,out_dir...] to plot, or --variants=crammed,recipe_reference to train")
    path = png or os.path.join(out_dir, "compare.png")
    if not installed("matplotlib"):  # said now, not after hours of training
        print("note: matplotlib is not installed, so no picture (pip install matplotlib); the tables and "
              "results.json are written as usual")
        path = None
    if run_dirs:
        curves = {run: read_metrics(run) for run in run_dirs}
        print(runs_table(curves))
        if path:
            check_writable(path, "--png")
            plot(curves, path)
            print(f"wrote {path}")
        return
    for name in names:
        variant_args(name)  # fail on a bad name before training anything
    given = [a for a in train_args.split() if a.startswith(("--budget_hours=", "--budget_tokens="))]
    if given:
        raise SystemExit(f"error: --train_args={' '.join(given)} would be overridden: compare.py gives each run its "
                         f"budget; use --budget_minutes (or --budget_tokens with --protocol=tokens)")
    if budget_tokens and protocol != "tokens":
        raise SystemExit("error: --budget_tokens is a budget of --protocol=tokens; give --budget_minutes for clock")
    budget = 60 * budget_minutes or 3600 * (read_config_file(base) if base else {}).get("budget_hours", 0.0)
    if budget <= 0 and not budget_tokens:
        raise SystemExit(f"error: give --budget_minutes: {base or 'no base config'} sets no budget_hours")
    claim_folder(out_dir)
    if path:
        check_writable(path, "--png")
    decide_dtype()
    curves, speeds, budgets = train_variants(names, budget)
    table, results = variants_table(curves, speeds, budget)
    for name, tokens in budgets.items():
        results["variants"][name]["budget_tokens"] = tokens
    print(table)
    write_json(os.path.join(out_dir, "results.json"), dict(base=base, protocol=protocol, budget_minutes=budget / 60,
                                                           train_args=train_args, **results))
    print(f"wrote {os.path.join(out_dir, 'results.json')}")
    if path:  # last: the results are safe whatever happens to the picture
        plot({name: runs_of[0] for name, runs_of in curves.items()}, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "the runs are only read; run the same command again" if runs else
            f"finished runs are kept in {out_dir} and reused; run the same command to continue")
