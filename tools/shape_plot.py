"""The best shape against compute: the sweeps' measured points, the published configurations and
the budget's rule (budget.shape_for_budget) on one picture.

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
sys.path.insert(0, ROOT)
from budget import PAPER_COMPUTE, PAPER_WEIGHTS, SIZE_EXPONENT  # noqa: E402  (the core sits one folder up)
from configurator import configure  # noqa: E402
from files import check_writable, load_checkpoint, read_json, write_json  # noqa: E402
from runtime import guarded  # noqa: E402

# -----------------------------------------------------------------------------
sweep_dir = ""             # a folder of sweeps to add (tools/shape_sweep.sh's OUT); empty: draw the kept points
points = "docs/shape_points.json"  # the measured columns, kept between drawings
machine = "2-core CPU"     # the label of the sweeps' machine
png = "docs/shape_compute.png"
# -----------------------------------------------------------------------------
# Published configurations beside the rule (blocks' matmul weights at 10 x width^2 a layer; FLOPs as trained):
PUBLISHED = [
    ("ELECTRA-Small, 12 x 256, 6.25% of its training (GLUE 74.1)", 8.9e16, 12 * 10 * 256 ** 2),
    ("BERT-Small, 4 x 512, fully trained (GLUE 75.1)", 1.4e18, 4 * 10 * 512 ** 2),
    ("crammed BERT, 16 x 768: the paper's 24 h on an A6000", 4.3e18, 16 * 10 * 768 ** 2),
]


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
    ax.set(xscale="log", yscale="log", xlabel="pretraining compute (FLOPs; a time budget's: hours x matmul speed x 0.5)",
           ylabel="matmul weights in the blocks", title="The best shape against compute")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
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
        raise SystemExit(f"error: no points: give --sweep_dir= (tools/shape_sweep.sh's folder)")
    check_writable(png, "--png")
    draw(kept, png)
    print(f"wrote {png}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "nothing was changed but what the lines above say")
