"""GLUE against pretraining compute: where a budget lands, beside published models of its size.

    python tools/glue_plot.py --add=out/laptop/glue.json --label="CPU 2 h"  # add (or replace) a point
    python tools/glue_plot.py --add=ft/sst2.json+ft/rte.json --label="GPU"     # one point from one checkpoint's files
    python tools/glue_plot.py                                                      # redraw and print the table

A point is one checkpoint's glue.json, as finetune_glue.py writes it: the median main score of
each task, the majority class's, words alone's (a bag of words and a linear model: what a network should beat), the
same shape's scores without pretraining if it was measured
(finetune_glue.py --from_scratch=True), and the checkpoint's pretraining facts (shape, tokens,
hours, FLOPs = model.py's flops_per_token x tokens, validation loss). Points live in a small JSON
file (docs/glue_points.json, committed, so that the picture can be redrawn without the runs);
--add puts a glue.json in it, replacing the point of the same label. A call that fine-tuned each task into a file of
its own gives them joined by '+': one checkpoint's files make one point.

Each point also keeps the head each task was fine-tuned with (finetune_glue.py's --pooling). The pair head is the
default; a point or floor measured with another head, such as the first-token head of every figure before issue 91,
says so in the table and the legend, and its marker is hollow. A floor line is drawn for each shape and head.

The picture: the GLUE average over the tasks every point has, against FLOPs (log scale), with
lines for the floors (the majority class, words alone, the measured no-pretraining control of each shape and head, and
the Cramming paper's BERT-base fine-tuned without pretraining) and for the published BERT
miniatures, and the ELECTRA paper's small models placed by their own training FLOPs: where MLM
starts to transfer. Ours are dev-set scores; each published row says its split and source.
Prints a markdown table of every task for every point.
"""
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]  # the core, and measure.py beside this tool
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.files import read_json, write_json  # noqa: E402
from cram.process import guarded, installed  # noqa: E402
from measure import save_figure  # noqa: E402

# -----------------------------------------------------------------------------
points = os.path.join(ROOT, "docs", "glue_points.json")  # the points: read, and written by --add
add = ""                  # comma-separated glue.json files (finetune_glue.py's) to add as points; '+' joins one checkpoint's
label = ""                # comma-separated labels, one per --add file; default: '<shape>, <hours> h'
png = os.path.join(ROOT, "docs", "glue_compute.png")  # the picture; empty: none
# -----------------------------------------------------------------------------

# Published rows, the main metric per task as finetune_glue.py's (MRPC: F1, whose majority class alone gets
# 81.2 on dev; STS-B: Pearson; CoLA: Matthews). The BERT miniatures (Turc et al. 2019, "Well-Read Students
# Learn Better"; google-research/bert's README): GLUE test sets, BERT's recipe at full scale. BERT-base
# fine-tuned with no pretraining at all: the Cramming paper's GLUE table (Geiping & Goldstein 2022, v1), dev
# sets, the floor that pretraining lifts a model from.
PUBLISHED = {  # name: (split, source, scores)
    "BERT-Tiny (2x128)": ("test", "Turc et al.", dict(cola=0.0, sst2=83.2, mrpc=81.1, stsb=74.3, qnli=81.5, rte=57.2)),
    "BERT-Mini (4x256)": ("test", "Turc et al.", dict(cola=0.0, sst2=85.9, mrpc=81.1, stsb=75.4, qnli=84.1, rte=57.9)),
    "BERT-Small (4x512)": ("test", "Turc et al.", dict(cola=27.8, sst2=89.7, mrpc=83.4, stsb=78.8, qnli=86.4, rte=61.8)),
    "BERT-base, no pretraining": ("dev", "Cramming paper", dict(cola=0.0, sst2=79.9, mrpc=77.9, stsb=17.8, qnli=50.0,
                                                                rte=47.3))}
# The ELECTRA paper's Table 1 (Clark et al. 2020): GLUE dev averages of 8 tasks (no WNLI; accuracy for MRPC
# and QQP, Spearman for STS-B: not our tasks or metrics, so a guide to where transfer starts, not a target)
# against its own count of training FLOPs. Both models 12 layers x 256 (not Turc's 4 x 512 BERT-Small).
ELECTRA = {"ELECTRA-Small (12x256), 6.25% to 100% trained": [(8.9e16, 74.1), (1.8e17, 76.0), (3.6e17, 77.7),
                                                              (7.1e17, 79.0), (1.4e18, 79.9)],
           "BERT-Small (12x256, MLM)": [(1.4e18, 75.1)]}


def read_result(path):
    """A glue.json's contents, refused unless it holds scores and the checkpoint's pretraining facts."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: no file {path} (finetune_glue.py writes glue.json beside the checkpoint)")
    results = read_json(path, "run finetune_glue.py on its checkpoint again")
    if not isinstance(results, dict) or "pretraining" not in results or "scores" not in results:
        raise SystemExit(f"error: {path} is not a glue.json with scores and pretraining facts (finetune_glue.py "
                         f"writes one; an older cram's lacks the facts: fine-tune again)")
    return results


def heads_of(entries):
    """Each task's head (finetune_glue.py's pooling). A glue.json older than the setting had only the first token's."""
    return {task: entry.get("settings", {}).get("pooling", "first") for task, entry in entries.items()}


def point_from(path, name):
    """A point from a glue.json, or from several of one checkpoint joined by '+': its label, pretraining facts, main
    scores, the majority class's, and how and with which head each task was fine-tuned."""
    files = path.split("+")
    parts = [read_result(f) for f in files]
    facts = parts[0]["pretraining"]
    if any(part["pretraining"] != facts for part in parts[1:]):
        raise SystemExit(f"error: {path} joins the glue.json files of different checkpoints: a point is one checkpoint")
    results = {key: {k: v for part in parts for k, v in (part.get(key) or {}).items()}
               for key in ("scores", "tasks", "no_pretraining", "no_pretraining_scores", "majority", "words_alone_scores")}
    if not results["scores"]:
        raise SystemExit(f"error: {path} holds no pretrained model's scores (only the no-pretraining control?): "
                         f"fine-tune the checkpoint itself, and run the control with the same --checkpoint so that "
                         f"it lands beside them")
    if not facts.get("tokens") or not facts.get("flops"):
        raise SystemExit(f"error: {path} is of a checkpoint that trained no tokens: nothing to place against compute")
    if not all("how" in entry for entry in results["tasks"].values()):
        raise SystemExit(f"error: {path} does not say how its tasks were fine-tuned (an older cram's): fine-tune "
                         f"again (--out_json= elsewhere) or add a seed")
    how = {task: entry["how"] for task, entry in results["tasks"].items()}
    return dict(label=name or f"{facts['shape']}, {facts['hours']:.2g} h", **facts, scores=results["scores"],
                no_pretraining=results["no_pretraining_scores"], majority=results["majority"],
                words_alone=results["words_alone_scores"],  # an older glue.json has none
                how=how, heads=heads_of(results["tasks"]), no_pretraining_heads=heads_of(results["no_pretraining"]),
                source="+".join(shown_path(f) for f in files))


def head_note(heads):
    """'first-token head' where scores came from a head other than the default pair head ('' for the pair head, and
    for a point kept before points said their heads)."""
    names = dict(first="first-token head", mean="mean head", pair="pair head")
    kinds = sorted(set(heads.values()))
    return "" if kinds in ([], ["pair"]) else ", ".join(names.get(k, f"{k} head") for k in kinds)


def shown_label(p):
    """A point's label, with its head where that is not the pair head."""
    note = head_note(p.get("heads", {}))
    return f"{p['label']} ({note})" if note else p["label"]


def shown_path(path):
    """A point's source as a reader of the committed points can follow it: relative to the repository
    when inside it (an absolute path names one machine's folders)."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def read_points(path):
    """The points file: a list of points, each with a label (what --add writes); [] if there is none."""
    if not os.path.exists(path):
        return []
    found = read_json(path, "fix or delete it, then --add the points again")
    if not isinstance(found, list) or not all(isinstance(p, dict) and "label" in p and "scores" in p for p in found):
        raise SystemExit(f"error: {path} is not a points file (a list of points, as --add writes): is it a glue.json? "
                         f"pass that as --add=")
    return found


def common_tasks(all_points):
    """The score names every point and the published rows have: what the average is over."""
    names = set.intersection(*(set(p["scores"]) for p in all_points), *(set(r) for _, _, r in PUBLISHED.values()))
    return [n for n in PUBLISHED["BERT-Tiny (2x128)"][2] if n in names]


def floors(all_points):
    """The measured no-pretraining scores, one column per shape and vocabulary: {name: scores}."""
    found = {}
    for p in all_points:
        if p.get("no_pretraining"):
            note = head_note(p.get("no_pretraining_heads", {}))
            name = f"no pretraining, {p['shape']}, vocabulary {p['vocab_size']:,}{', ' + note if note else ''} (measured)"
            found[name] = {**p["no_pretraining"], **found.get(name, {})}
    return found


def words_alone(all_points):
    """Words alone's scores (TF-IDF and a linear model, finetune_glue.py's): the same data give the same numbers, so
    the points' together."""
    return {k: v for p in all_points for k, v in p.get("words_alone", {}).items()}


def average(scores, names):
    return statistics.mean(scores[n] for n in names) if names and all(n in scores for n in names) else float("nan")


def score(value):
    """A score to one decimal ('-' if missing); a rounding error of zero prints as 0.0, not -0.0."""
    return "-" if value is None else f"{round(value, 1) + 0.0:.1f}"


def markdown(all_points):
    """Every task's score for every point, the majority class and the published rows; the average
    over the common tasks; then each point's pretraining (compute, MLM validation loss on its own
    corpus' held-out text) and how it was fine-tuned; points in the order given."""
    names = common_tasks(all_points)
    tasks = sorted({n for p in all_points for n in p["scores"]}, key=lambda n: (n not in names, n))
    majority = next((p["majority"] for p in all_points if p["majority"]), {})
    columns = [(shown_label(p), p["scores"]) for p in all_points] + list(floors(all_points).items()) + \
        [("words alone", words_alone(all_points)), ("majority class", majority)] + [(f"{name}, {split}", row) for name, (split, _, row) in PUBLISHED.items()]
    lines = ["| task | " + " | ".join(c for c, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for task in tasks:
        lines.append(f"| {task} | " + " | ".join(score(s.get(task)) for _, s in columns) + " |")
    lines.append(f"| average of {len(names)} | " + " | ".join(score(average(s, names)) for _, s in columns) + " |")
    lines.append("")
    for p in all_points:
        tasks_by_how = {}  # 'rte, mrpc: median of 3 seeds, 5 epochs; sst2: 1 seed, 1 epoch'
        for task, how in p["how"].items():
            note = head_note({task: p.get("heads", {}).get(task, "pair")})
            tasks_by_how.setdefault(f"{how}, {note}" if note else how, []).append(task)
        fine_tuned = "; ".join(f"{', '.join(tasks)}: {how}" for how, tasks in tasks_by_how.items())
        mlm = f", val loss {p['val_loss']:.3f} (accuracy {p['accuracy']:.3f})" if p.get("val_loss") is not None else ""
        lines.append(f"- {p['label']}: {p['shape']}, vocabulary {p['vocab_size']:,}, {p['tokens'] / 1e6:,.1f}M tokens in "
                     f"{p['hours']:.2f} h, {p['flops']:.2e} FLOPs{mlm}; fine-tuned {fine_tuned}")
    for name, row in floors(all_points).items():
        missing = [n for n in names if n not in row]
        if missing:
            lines.append(f"- {name}: no {', '.join(missing)}, so no average and no line (finetune_glue.py "
                         f"--from_scratch=True measures them)")
    lines.append("- published: the BERT miniatures' GLUE test scores (Turc et al. 2019); BERT-base with no pretraining, "
                 "dev (the Cramming paper, v1); on the picture also the ELECTRA paper's small models, GLUE-8 dev "
                 "averages by training FLOPs: " + "; ".join(f"{name} " + ", ".join(f"{g:.1f} at {f:.1e}" for f, g in runs)
                                                         for name, runs in ELECTRA.items()))
    return "\n".join(lines)


def draw(all_points, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = common_tasks(all_points)
    fig, ax = plt.subplots(figsize=(12, 7.5))
    for i, p in enumerate(all_points):  # a legend, not labels: budgets alike overlap; another head than pair's: hollow
        colour = f"C{i % 10}"
        ax.scatter(p["flops"], average(p["scores"], names), zorder=3, label=shown_label(p), edgecolors=colour,
                   facecolors="none" if head_note(p.get("heads", {})) else colour, linewidths=1.5)
    for (name, runs), marker in zip(ELECTRA.items(), "^v"):  # their own tasks and FLOPs count: black hollow triangles
        ax.plot(*zip(*runs), marker=marker, markerfacecolor="none", color="black", linewidth=0.8,
                label=f"{name}: ELECTRA paper, GLUE-8 dev average")
    majority = next((p["majority"] for p in all_points if p["majority"]), None)
    lines = [(f"{name} ({source}, {split} set)", row, "--", "grey") for name, (split, source, row) in PUBLISHED.items()]
    lines += [(name, row, "-.", "firebrick") for name, row in floors(all_points).items()]
    lines += [("majority class", majority, ":", "grey")] if majority else []
    lines += [("words alone (TF-IDF and a linear model)", words_alone(all_points), ":", "seagreen")]
    lines = sorted((line for line in lines if not math.isnan(average(line[1], names))), key=lambda line: average(line[1], names))
    for name, row, style, colour in lines:
        ax.axhline(average(row, names), linestyle=style, color=colour, linewidth=1)
    low, high = ax.get_ylim()
    shown = -math.inf  # each label right of the axes at its line's height, or a line of text above the one below it
    for name, row, style, colour in lines:
        shown = max(average(row, names), shown + 0.03 * (high - low))
        ax.annotate(name, (1.01, shown), xycoords=("axes fraction", "data"), va="center", fontsize=7, color=colour,
                    annotation_clip=False)
    ax.set_xscale("log")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=7)  # below: the points stay in sight
    ax.set_xlabel("pretraining compute (FLOPs = flops_per_token x tokens)")
    ax.set_ylabel(f"GLUE dev average ({', '.join(names)})")
    ax.set_title("cram: GLUE against pretraining compute", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main():
    files = [f for f in add.split(",") if f]
    labels = [x.strip() for x in label.split(",")] if label else [""] * len(files)
    if len(labels) != len(files):
        raise SystemExit(f"error: {len(files)} --add file(s) but {len(labels)} --label(s): give one label per file")
    if png and not installed("matplotlib"):
        raise SystemExit("error: the picture needs matplotlib: pip install matplotlib (or pass --png=)")
    all_points = read_points(points)
    if files:
        new = {p["label"]: p for p in (point_from(f, name) for f, name in zip(files, labels))}  # a label once
        for old in all_points:  # a point of the same label is replaced: said where it came from another file
            if old["label"] in new and old.get("source") != new[old["label"]]["source"]:
                print(f"replacing the point '{old['label']}' of {old.get('source')} (give --label= to keep both)")
        all_points = [p for p in all_points if p["label"] not in new] + list(new.values())
        write_json(points, all_points)
    if not all_points:
        raise SystemExit(f"error: no points in {points}: add one with --add=<glue.json> (finetune_glue.py writes it)")
    all_points = sorted(all_points, key=lambda p: p["flops"])  # the table's columns and the legend by compute
    print(markdown(all_points))
    if png:
        draw(all_points, png)
        print(f"wrote {png}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, f"{points} is written whole or not at all")
