"""Validation loss against wall-clock minutes and against tokens, for one run or several, as a
table and a PNG; and the recipes' comparison at equal time in one command.

    python compare.py --runs=out/quickstart                      # plot what a run logged
    python compare.py --runs=out/crammed,out/bert                # several runs on one picture
    python compare.py --recipes=crammed,bert_original            # train each recipe for the base
                                                                 # config's budget on its data, then both
    python compare.py --recipes=crammed,recipe_reference         # cram's recipe against the paper's

Reads each run's metrics.jsonl (written by train.py). A recipe is a config file in config/
(bert_original: config/bert_original.py; recipe_reference: the paper's crammed recipe, without
smear) applied on top of `base`, or `crammed` for the base itself (train.py's recipe); every
recipe trains on the same data for the same wall-clock budget, one after the other.
"""
import json
import os
import subprocess
import sys

from configurator import configure

# -----------------------------------------------------------------------------
runs = ""                 # comma-separated out_dirs to compare (each with a metrics.jsonl)
recipes = ""              # comma-separated recipes to train first: 'crammed' or names of config/<name>.py
base = "config/train_quickstart.py"  # the config every recipe starts from (data, shape, budget)
train_args = ""           # more --key=value settings for every training run, space-separated
out_dir = "out/compare"   # where the recipes' runs go, and the picture
png = ""                  # the picture; default: <out_dir>/compare.png
# -----------------------------------------------------------------------------
HERE = os.path.dirname(os.path.abspath(__file__))


def read_metrics(run):
    """The evaluations of one run, in order, one per step (for a step logged twice, the later line:
    a run resumed after a hard kill redoes the steps since its last checkpoint)."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found: is {run} the out_dir of a train.py run?")
    evals = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                raise SystemExit(f"error: {path}:{number} is not a JSON line")
            if record.get("kind") == "eval":
                evals[record["step"]] = record
    if not evals:
        raise SystemExit(f"error: {path} has no evaluation yet")
    return [evals[step] for step in sorted(evals)]


def train_recipes(names):
    """Train each recipe in turn (a train.py process each); returns their out_dirs."""
    dirs = []
    for name in names:
        recipe = [] if name == "crammed" else [os.path.join(HERE, "config", f"{name}.py")]
        if recipe and not os.path.isfile(recipe[0]):
            raise SystemExit(f"error: unknown recipe '{name}': no {recipe[0]} (and not 'crammed')")
        run = os.path.join(out_dir, name)
        print(f"training {name} -> {run}", flush=True)
        command = [sys.executable, os.path.join(HERE, "train.py"), base, *recipe, f"--out_dir={run}", *train_args.split()]
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"error: training {name} failed (command: {' '.join(command)})")
        dirs.append(run)
    return dirs


def table(curves):
    lines = ["| run | val loss | masked-token accuracy | minutes | tokens | steps |", "|---|---|---|---|---|---|"]
    for run, evals in curves.items():
        last = evals[-1]
        lines.append(f"| {run} | {last['val_loss']:.4f} | {last['accuracy']:.3f} | {last['elapsed'] / 60:.1f} | "
                     f"{last['tokens'] / 1e6:.2f}M | {last['step']} |")
    return "\n".join(lines)


def plot(curves, path):
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
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    dirs = [r for r in runs.split(",") if r]
    names = [r for r in recipes.split(",") if r]
    if not dirs and not names:
        raise SystemExit("error: give --runs=out_dir[,out_dir...] to compare, or --recipes=crammed,bert_original to train")
    curves = {run: read_metrics(run) for run in dirs}  # fail on a bad run before training anything
    curves.update({run: read_metrics(run) for run in train_recipes(names)})
    print(table(curves))
    path = png or os.path.join(out_dir, "compare.png")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    plot(curves, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
