"""The budget's rule against its evidence, two pictures: the best shape against compute (the sweeps'
measured points, the published configurations and budget.shape_for_budget), and the final batch against
the tokens trained (the measured and published batch comparisons and budget.batch_for_budget).

    python tools/shape_plot.py --sweep_dir=out/shape_sweep    # add the sweeps' points, then draw
    python tools/shape_plot.py                                 # draw the points kept in docs/shape_points.json

A sweep folder holds tools/compare.py's runs at several budgets (tools/shape_sweep.sh: <minutes>/
results.json and <minutes>/<variant>/seed0/ckpt.pt). Each budget becomes a column of points at the
compute the rule estimated for it (its `crammed` run's, the rule's pick): every shape tried, by the
matmul weights in its blocks, the best by validation loss filled. They are merged into
docs/shape_points.json (a budget measured again replaces its column), so the picture can be drawn
again without the runs.
"""
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]  # the core, and measure.py beside this tool
from configurator import configure  # noqa: E402  (first: it checks for the temporary folder torch's import needs)
from cram.budget import (BATCH_EXPONENT, MAX_BATCH, MIN_BATCH, PAPER_BATCH, PAPER_COMPUTE, PAPER_SEQUENCES,  # noqa: E402
                         PAPER_WEIGHTS, SIZE_EXPONENT, batch_for_budget)  # (the core sits one folder up)
from cram.files import check_writable, load_checkpoint, read_json, write_json  # noqa: E402
from cram.process import guarded  # noqa: E402
from measure import save_figure  # noqa: E402

# -----------------------------------------------------------------------------
sweep_dir = ""             # a folder of sweeps to add (tools/shape_sweep.sh's OUT); empty: draw the kept points
points = "docs/shape_points.json"  # the measured columns, kept between drawings
machine = "2-core CPU"     # the label of the sweeps' machine
png = "docs/shape_compute.png"
batch_png = "docs/batch_tokens.png"  # the batch's picture ("": not drawn)
# -----------------------------------------------------------------------------
# Published configurations beside the rule (blocks' matmul weights at 10 x width^2 a layer; FLOPs as trained):
PUBLISHED = [
    ("ELECTRA-Small, 12 x 256, 6.25% of its training (GLUE 74.1)", 8.9e16, 12 * 10 * 256 ** 2),
    ("BERT-Small, 4 x 512, fully trained (GLUE 75.1)", 1.4e18, 4 * 10 * 512 ** 2),
    ("crammed BERT, 16 x 768: the paper's 24 h on an A6000", 4.3e18, 16 * 10 * 768 ** 2),
]

# Batch comparisons at one budget each: (label, tokens trained, [(final batch in tokens, its result)], the best's index).
# Tokens as trained; a batch in tokens (sequences x their length) so that 128- and 512-token sequences compare.
BATCH_POINTS = [
    ("measured: 15 CPU min, 3 x 192 (val loss)", 29e3 * 128,
     [(32 * 128, "best"), (64 * 128, "+0.04"), (128 * 128, "+0.17")], 0),
    ("measured: 45 CPU min, 4 x 256", 50e3 * 128, [(32 * 128, "best"), (64 * 128, "+0.01")], 0),
    ("Cramming 2022: ~4k best for GLUE, 1,536 for MLM loss", 54e6 * 128,
     [(1536 * 128, "MLM"), (4096 * 128, "GLUE")], 1),
    ("Izsak et al. 2021, 24 x 1024: 4k over 8k and 16k", 2.2e10,
     [(4096 * 128, "best"), (8192 * 128, ""), (16384 * 128, "")], 0),
    ("RoBERTa 2019 (512 tokens a sequence): 2K beat 256 and 8K", 1.31e11,
     [(256 * 512, ""), (2048 * 512, "best"), (8192 * 512, "")], 1),
]


def draw_batch(path):
    """The final batch (in tokens) against the tokens trained: the law for 128-token sequences and each
    comparison's batches, the best filled."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    lo, hi = 1e6, 3e11
    xs = [lo * (hi / lo) ** (i / 300) for i in range(301)]
    ax.plot(xs, [batch_for_budget(x, 128) * 128 for x in xs], color="gray",
            label=f"the rule: {PAPER_BATCH} x (sequences / {PAPER_SEQUENCES / 1e6:.0f}M)^{BATCH_EXPONENT},\n"
                  f"a power of two from {MIN_BATCH} to {MAX_BATCH} (sequences of 128)")
    for i, (label, tokens, batches, best) in enumerate(BATCH_POINTS):
        for k, (batch, note) in enumerate(batches):
            ax.scatter(tokens, batch, marker="o" if label.startswith("measured") else "s", s=40, zorder=3,
                       facecolors=f"C{i}" if k == best else "none", edgecolors=f"C{i}")
            if note:
                ax.annotate(note, (tokens, batch), fontsize=7, color=f"C{i}", textcoords="offset points",
                            xytext=(-6, -3) if i == 0 else (6, -3), ha="right" if i == 0 else "left")
        ax.scatter([], [], marker="o" if label.startswith("measured") else "s", color=f"C{i}", label=label)
    ax.set(xscale="log", yscale="log", xlabel="tokens trained", ylabel="final batch (tokens)",
           title="The final batch against the budget: the best filled, the others hollow")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)


def sweep_columns(folder):
    """{label: column} for each budget's results.json under `folder`: the compute the rule saw and each
    shape's weights and mean validation loss."""
    from model import ModelConfig, saved_model_args
    columns = {}
    for minutes in sorted(os.listdir(folder), key=lambda m: float(m) if m.replace(".", "").isdigit() else math.inf):
        results = os.path.join(folder, minutes, "results.json")
        if not os.path.isfile(results):
            continue
        shapes = []
        for name, found in read_json(results, "run the sweep again")["variants"].items():
            ckpt = load_checkpoint(os.path.join(folder, minutes, name, "seed0", "ckpt.pt"), "settings")
            config = ModelConfig(**saved_model_args(ckpt["model_args"]))
            shapes.append(dict(variant=name, shape=[config.n_layers, config.d_model], batch=ckpt["config"]["batch_size"],
                               weights=config.n_layers * config.layer_weights(), val_loss=sum(found["val_loss"]) / len(found["val_loss"]),
                               compute=(ckpt.get("budget") or {}).get("compute")))
        compute = next((s["compute"] for s in shapes if s["variant"] == "crammed" and s["compute"]), None)
        if compute:
            columns[f"{minutes} min, {machine}"] = dict(compute=compute, shapes=shapes)
    return columns


COLUMN_COLORS = ("C0", "C9", "C8", "C6")


def draw(columns, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    weights, compute, exponent = PAPER_WEIGHTS, PAPER_COMPUTE, SIZE_EXPONENT
    fig, ax = plt.subplots(figsize=(8, 5))
    lo, hi = 1e13, 1e20
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [weights * (x / compute) ** exponent for x in xs], color="gray",
            label=f"the rule's best size: {weights / 1e6:.1f}M x (FLOPs / {compute:.1e})^{exponent}")
    for k, (label, column) in enumerate(columns.items()):  # columns near one compute: a colour each; the best labelled
        best, color = min(column["shapes"], key=lambda s: s["val_loss"]), COLUMN_COLORS[k % len(COLUMN_COLORS)]
        for s in column["shapes"]:
            ax.scatter(column["compute"], s["weights"], marker="o", s=40, zorder=3,
                       facecolors=color if s is best else "none", edgecolors=color)
        ax.annotate(f"{best['shape'][0]}x{best['shape'][1]}/{best['batch']} {best['val_loss']:.2f}",
                    (column["compute"], best["weights"]), fontsize=7, color=color, textcoords="offset points",
                    xytext=(-6, 0) if k == 0 else (6, -9 * k), ha="right" if k == 0 else "left", va="center")
        ax.scatter([], [], facecolors=color, edgecolors=color,
                   label=f"measured, {label}: the best filled (layers x width/batch, val loss), the others hollow")
    for i, (label, flops, weights) in enumerate(PUBLISHED):
        ax.scatter(flops, weights, marker="s", color=f"C{i + 1}", zorder=3, label=label)
    ax.set(xscale="log", yscale="log", xlabel="pretraining compute (FLOPs; a time budget's: hours x matmul speed x a step's share)",
           ylabel="matmul weights in the blocks", title="The best shape against compute")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)


def main():
    kept = read_json(points, f"delete {points} and add the sweeps again") if os.path.isfile(points) else {}
    if sweep_dir:
        if not os.path.isdir(sweep_dir):
            raise SystemExit(f"error: --sweep_dir={sweep_dir} is not a folder")
        added = sweep_columns(sweep_dir)
        if not added:
            raise SystemExit(f"error: {sweep_dir} holds no finished sweep (<minutes>/results.json)")
        kept.update(added)
        write_json(points, kept)
        print(f"wrote {points}: {', '.join(added)}")
    if not kept:
        raise SystemExit("error: no points: give --sweep_dir= (tools/shape_sweep.sh's folder)")
    check_writable(png, "--png")
    draw(kept, png)
    print(f"wrote {png}")
    if batch_png:
        check_writable(batch_png, "--batch_png")
        draw_batch(batch_png)
        print(f"wrote {batch_png}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "nothing was changed but what the lines above say")
