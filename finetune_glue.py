"""Fine-tune a pretrained checkpoint on GLUE and score it the way the reference does.

    python finetune_glue.py --checkpoint=out/reference/ckpt.pt                  # all 8 tasks, hub data
    python finetune_glue.py --checkpoint=out/quickstart/ckpt.pt --glue_dir=glue_data --tasks=rte,mrpc
    python finetune_glue.py --checkpoint=... --seeds=5                          # median of 5, as published
    python finetune_glue.py --checkpoint=... --protocol=grid                    # each task's best of a grid on dev
    python finetune_glue.py --checkpoint=... --predict=True                     # and the GLUE server's test files
    python finetune_glue.py --checkpoint=... --from_scratch=True                # the shape never pretrained: the floor

The batch, rate and epochs follow the checkpoint's width and the task's size (settings_for), the rest the reference's;
prints a table beside the published row and the floor, every number in a JSON file. docs/glue.md: more; a task: a row."""
import contextlib
import csv
import glob
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from configurator import configure  # first: it checks for the temporary folder that torch's import needs
import torch
import torch.nn.functional as F

from cram import memory, process, runtime
from cram.data import make_encoding, to_device
from cram.files import (check_writable, load_checkpoint, load_json, parse_ranks, read_jsonl, set_aside, text_encoding, unfound,
                        weights_digest, write_atomically, write_json)
from model import MASK_RATE, CrammedBert, ModelConfig, SequenceClassifier, saved_model_args

# -----------------------------------------------------------------------------
checkpoint = "out/quickstart/ckpt.pt"
tasks = "cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte"  # wnli on request
glue_dir = ""           # a folder in the original GLUE layout (<dir>/<TASK>/train.tsv ...); empty: the hub
seeds = 0               # [0, 100000]: fine-tuning seeds per task, their median reported (the reference's: 5); 0: 5 on a GPU, 1 on a CPU
batch_size = 0          # >= 0: 0: by the checkpoint's width (settings_for)
lr = 0.0                # >= 0: 0: by the checkpoint's width (settings_for)
beta1 = 0.9             # [0, 1)
beta2 = 0.98            # [0, 1)
eps = 1e-6              # >= 0
weight_decay = 0.0      # >= 0
epochs = 0              # >= 0: 0: by the checkpoint's width and the task's training examples (settings_for)
warmup = 0.1            # [0, 1): share of the steps
dropout = 0.1           # [0, 1)
pooling = "pair"        # {first, mean, pair}: the head reads each text's mean apart, [u, v, |u - v|, u * v] (of more texts, the first against each later one; docs/glue.md: STS-B 62 against 18 on a CPU model), the first token's state (BERT's [CLS], the published head: --pooling=first to compare with published rows) or all tokens' mean
from_scratch = False    # fine-tune a freshly initialised encoder of the checkpoint's shape and tokenizer: the no-pretraining floor, kept beside the scores
eval_batch_size = 0     # >= 0: if 0, 512 on a GPU and 128 on a CPU
max_train_examples = 0  # >= 0: use only the first N training examples (0: all); for quick looks
group_by_length = True  # batches of similar lengths (shuffled in pools of 64 batches): less padding, same epochs
out_json = ""           # default: glue.json beside the checkpoint
device = "auto"         # as train.py: 'auto', 'cpu', 'cuda', 'cuda:N'
dtype = "auto"          # {auto, float32, bfloat16, float16}: as train.py (no compile here: padded lengths vary)
seed = 0                # [0, 4294967295]: the first fine-tuning seed (seed + s for the others)
protocol = "fixed"      # {fixed, grid, task_start}: fixed: each task's settings by the rule, given ones as given; grid: each task's best on dev over grid_lr x grid_batch (the miniatures' protocol), said so; task_start: as fixed, RTE, MRPC and STS-B from the same seed's fine-tune of start_task (from MNLI's: RoBERTa's)
start_task = "mnli"     # {mnli, qnli, qqp, mrpc, stsb}: --protocol=task_start's first task, fine-tuned first and added to the tasks
grid_lr = "3e-4,1e-4,5e-5,3e-5"  # --protocol=grid's learning rates (Turc et al. 2019's), in place of lr
grid_batch = "8,16,32,64,128"    # --protocol=grid's batch sizes (Turc et al. 2019's), in place of batch_size
predict = False         # also the test sets' predictions, as the GLUE server takes them: <glue>_test/, each task's median seed's
# -----------------------------------------------------------------------------

# A task is its row, task() filling in GLUE's layout where it is silent: folder under glue_dir, reader (read_rows'), train file,
# dev sets (score name -> (file, hub split)), columns (header names, keys, or indices in a file without a header), label
# names in the hub's id order (None: regression; a jsonl value as str() writes it), metrics (main first), hub dataset,
# configuration and columns, test sets (server's file -> (file, hub configuration, split); AX is MNLI's) and the
# published crammed BERT's dev scores (A6000, 24 h, its model card); glue: whether the GLUE server takes its test files.
def task(name, folder, **row):
    text = row.get("text", ("sentence1", "sentence2"))
    return dict(folder=folder, reader="tsv", train="train.tsv", dev={name: ("dev.tsv", "validation")}, text=text,
                label="label", hub=("nyu-mll/glue", name), hub_text=text, labels=("0", "1"), metrics=("accuracy",),
                tests={folder: ("test.tsv", name, "test")}, test_text=text, test_index="index", reference={}, glue=True) | row


TASKS = {name: task(name, **row) for name, row in dict(
    cola=dict(folder="CoLA", header=False, text=(3,), label=1, hub_text=("sentence",), test_text=("sentence",), metrics=("mcc",), reference={"cola": 53.3}),
    sst2=dict(folder="SST-2", text=("sentence",), reference={"sst2": 92.0}),
    mrpc=dict(folder="MRPC", text=("#1 String", "#2 String"), label="Quality", hub_text=("sentence1", "sentence2"), metrics=("f1", "accuracy"), reference={"mrpc": 88.9}),
    stsb=dict(folder="STS-B", label="score", labels=None, metrics=("pearson", "spearman"), reference={"stsb": 87.4}),
    qqp=dict(folder="QQP", text=("question1", "question2"), label="is_duplicate", metrics=("f1", "accuracy"), test_index="id", reference={"qqp": 87.5}),
    mnli=dict(folder="MNLI", label="gold_label", hub_text=("premise", "hypothesis"), labels=("entailment", "neutral", "contradiction"),
              dev={"mnli-m": ("dev_matched.tsv", "validation_matched"), "mnli-mm": ("dev_mismatched.tsv", "validation_mismatched")},
              tests={"MNLI-m": ("test_matched.tsv", "mnli", "test_matched"), "AX": (os.path.join("..", "diagnostic", "diagnostic.tsv"),
                     "ax", "test"), "MNLI-mm": ("test_mismatched.tsv", "mnli", "test_mismatched")}, reference={"mnli-m": 84.1, "mnli-mm": 84.6}),
    qnli=dict(folder="QNLI", text=("question", "sentence"), labels=("entailment", "not_entailment"), reference={"qnli": 90.2}),
    rte=dict(folder="RTE", labels=("entailment", "not_entailment"), reference={"rte": 58.5}),
    wnli=dict(folder="WNLI")).items()}
REFERENCE = {score: value for row in TASKS.values() for score, value in row["reference"].items()}  # the average's nine
# Fine-tuning's rule: the reference's settings (batch 16, lr 4e-5, 5 epochs: its GLUE config for its 16 x 768) at its
# width and above; below it ELECTRA-Small's (Clark et al. 2020, width 256: batch 32, lr 3e-4, 3 epochs, 10 for its
# small tasks), the rate geometric in the width between the two and at most 3e-4, the top of the miniatures' grid
# (Turc et al. 2019). Small: under 8,000 examples (RTE, MRPC, STS-B, WNLI). A GPU grid at width 512 (BENCHMARKS.md, "The
# fine-tuning grid") found lr 4e-5 to 3e-4 x 5 or 10 epochs within one seed's spread there, the rule's point at STS-B's best.
REFERENCE_SETTINGS, SMALL_WIDTH_SETTINGS, SMALL_TASK = dict(width=768, batch_size=16, lr=4e-5, epochs=5), \
    dict(width=256, batch_size=32, lr=3e-4, epochs=3, small_task_epochs=10), 8000


def settings_for(width, train_examples, given):
    """{batch_size, lr, epochs} for an encoder of `width` on `train_examples`: the rule above, non-zero `given` ones kept."""
    ref, small = REFERENCE_SETTINGS, SMALL_WIDTH_SETTINGS
    if width >= ref["width"]:
        rule = {k: ref[k] for k in ("batch_size", "lr", "epochs")}
    else:
        slope = math.log(small["lr"] / ref["lr"]) / math.log(ref["width"] / small["width"])
        rule = dict(batch_size=small["batch_size"], lr=min(small["lr"], ref["lr"] * (ref["width"] / width) ** slope),
                    epochs=small["small_task_epochs"] if train_examples < SMALL_TASK else small["epochs"])
    return {k: given.get(k) or (float(f"{v:.2g}") if k == "lr" else v) for k, v in rule.items()}


PROTOCOLS = dict(fixed="settings fixed before any look at dev", grid="each the best of a grid on dev",
                 task_start="fixed settings, started from another task's fine-tune")  # as a table says them
HEADS = dict(first="the first token's state (the published head)", mean="the mean of the tokens' states",
             pair="each text's mean apart, [u, v, |u - v|, u * v]")  # --pooling's, as the table says them
STARTED = {"rte", "mrpc", "stsb"}  # --protocol=task_start's, but start_task: from its fine-tune (MNLI's: RoBERTa, MosaicBERT)
METRIC_NAMES = {"mcc": "Matthews corr.", "accuracy": "accuracy", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}


def texts_read(name):
    """How the pair head and words alone read a task of more than two texts, as the output says it after their own
    words; '' for one or two texts, which read as docs/glue.md says."""
    k = len(TASKS[name]["text"])
    return f" ({k} texts: the first against each later one, side by side)" if k > 2 else ""


# ---------------------------------------------------------------- metrics (float64, as percentages / 100)
def accuracy(pred, gold):
    return float(np.mean(np.asarray(pred) == np.asarray(gold)))


def f1(pred, gold):
    """Binary F1 of the positive class (label 1)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    tp, wrong = np.sum((pred == 1) & (gold == 1)), np.sum(pred != gold)
    return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def mcc(pred, gold):
    """Matthews correlation, the multi-class form (equal to the binary one for two classes)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    classes = np.union1d(pred, gold)
    confusion = np.array([[np.sum((gold == t) & (pred == p)) for p in classes] for t in classes], dtype=np.float64)
    n, correct = confusion.sum(), np.trace(confusion)
    true_sum, pred_sum = confusion.sum(1), confusion.sum(0)
    cov_tp = correct * n - true_sum @ pred_sum
    cov_pp, cov_tt = n * n - pred_sum @ pred_sum, n * n - true_sum @ true_sum
    return float(cov_tp / math.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp else 0.0


def pearson(x, y):
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # a constant: no correlation (its mean's rounding would give 1e-17)
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    return float(x @ y / math.sqrt((x @ x) * (y @ y)))


def average_ranks(values):
    """Ranks 1..n, ties sharing the mean of their ranks."""
    _, group, counts = np.unique(np.asarray(values, dtype=np.float64), return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[group]  # a group's last rank, less half its ties


def spearman(x, y):
    return pearson(average_ranks(x), average_ranks(y))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


# ---------------------------------------------------------------- data
def read_rows(path, reader):
    """[(line number, {column: value} or a JSON line's value)] of a file, blank lines left out; one line if it is missing,
    not UTF-8 or bad. tsv (a header but in CoLA's train and dev files), as written: by csv's quoting where the quotes are
    a csv writer's (Python's, pandas') for what they read, else split at tabs, quotes as text (GLUE's `He said " no " .`)."""
    if not os.path.isfile(path):
        raise unfound(path, f"error: GLUE file not found: {path}")
    rows, n = [], 0
    try:
        with open(path, encoding=text_encoding(path), newline="") as f:  # MRPC starts with a UTF-8 mark; \r\n and \r end lines
            quotes = sum(line.count('"') for line in f) if reader == "tsv" else 0
            csv.field_size_limit(2 ** 31 - 1)  # no limit on a field's size (csv's: 128 kB; this: Windows' C long's most)
            for quoting in (csv.QUOTE_MINIMAL, csv.QUOTE_NONE) * (reader == "tsv"):
                f.seek(0)
                with contextlib.suppress(csv.Error):  # a field that starts with a quote and is not quoted whole: not csv's
                    rows, n, lines = [], 0, csv.reader(f, delimiter="\t", quoting=quoting, strict=True)
                    for row in lines:
                        rows += [(n + 1, dict(enumerate(row)))] if row else []
                        n = lines.line_num
                    written = [sum(2 + 2 * v.count('"') for _, row in rows for v in row.values() if every or any(
                        c in v for c in '"\t\r\n')) for every in (0, 1)]
                    if quoting == csv.QUOTE_NONE or quotes in written:  # a writer's that quotes the fields needing it, or all
                        return rows
            for n, line in enumerate(f, 1):
                rows += [(n, json.loads(line))] if line.strip() else []
    except UnicodeDecodeError as e:  # no mark, and not UTF-8: its writer's encoding is a guess (Excel's Text: cp1252)
        quoted = shlex.quote(path)
        raise SystemExit(f"error: {path} is not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start}): fetch it "
                         f"again, or convert it from the encoding it was saved in (Excel's Text: cp1252) with iconv -f "
                         f"cp1252 -t utf-8 {quoted} > {quoted}.new && mv {quoted}.new {quoted}")
    except ValueError:
        raise SystemExit(f"error: {path}:{n} is not a JSON line: mend or remove it") from None
    return rows


def read_task_file(path, spec, test=False):
    """(texts, labels) of a task's file. A row of another width (tsv: its header's, else most rows') or without a value
    (not null) in a column it needs is never read amiss or dropped unsaid: in a `test` file one line; in a train or dev
    file (QQP's train.tsv has a few) left out and counted aloud, past 1% of the rows (or 10) one line."""
    rows, text, label, tsv = read_rows(path, spec["reader"]), spec["text"], spec["label"], spec["reader"] == "tsv"
    width = statistics.mode(len(row) for _, row in rows) if rows and tsv else 0  # without a header, CoLA's: its rows'
    if tsv and spec.get("header", True):  # the columns by name
        header, rows = list(rows[0][1].values()) if rows else [], rows[1:]
        missing, width = [c for c in (*text, label) if c not in header], len(header)
        if missing:
            raise SystemExit(f"error: {path} is not in the GLUE layout: no column {', '.join(map(repr, missing))} "
                             f"in its header ({', '.join(header[:12])})")
        text, label = [header.index(c) for c in text], len(header) - 1 - header[::-1].index(label)  # MNLI: the last
    fits = [isinstance(r, dict) and len(r) == (width or len(r)) and all(isinstance(r.get(c), (str, int, float)) for c in (*text, label)) for _, r in rows]
    short, kept = [n for (n, _), ok in zip(rows, fits) if not ok], [r for r, ok in zip(rows, fits) if ok]  # null: no value
    lines = f"line{'s' * (len(short) > 1)} {', '.join(map(str, short[:5]))}{', ...' * (len(short) > 5)}"
    want = f"exactly {width} tab-separated fields" if tsv else f"a value (not null) in each of {', '.join(map(str, (*spec['text'], spec['label'])))}"
    if short and test:
        raise SystemExit(f"error: {path}: {lines} lack{'s' * (len(short) == 1)} {want}: a test file needs a prediction "
                         f"for every row; mend it (a trailing tab trimmed? a tab in a field, not quoted?)")
    if len(short) > max(10, len(rows) // 100):
        raise SystemExit(f"error: {path} is not in the GLUE layout: {len(short)} of {len(rows)} rows lack {want}")
    if short:
        print(f"{path}: left out {len(short)} of {len(rows)} rows that lack {want} ({lines})")
    return [tuple(str(row[c]) for c in text) for _, row in kept], [parse_label(str(row[label]), spec, f"{path}:{n}")
                                                                   for n, row in kept]


def parse_label(raw, spec, where):
    if spec["labels"] is None:
        score = math.nan
        with contextlib.suppress(ValueError):
            score = float(raw)
        if not math.isfinite(score):
            raise SystemExit(f"error: {where}: score {raw!r} is not a finite number (is this the GLUE layout?)")
        return score
    if raw not in spec["labels"]:
        raise SystemExit(f"error: {where}: label {raw!r} is not one of {', '.join(spec['labels'])} "
                         f"(is this the GLUE layout?)")
    return spec["labels"].index(raw)


def load_task(name, tests=False):
    """{'train': (texts, labels), <dev score name>: (texts, labels), ...} from glue_dir (by the task's reader) or the hub;
    with `tests`, also {'test:<the server's file>': (texts, indices)} (the row's tests)."""
    spec = TASKS[name]
    splits = {"train": (spec["train"], spec["hub"][1], "train"), **{k: (f, spec["hub"][1], hub) for k, (f, hub) in spec[
        "dev"].items()}, **{f"test:{k}": v for k, v in spec["tests"].items() if tests}}
    test_spec = dict(spec, header=True, text=spec["test_text"], labels=None, label=spec["test_index"])  # no label
    if glue_dir:
        folder = os.path.join(glue_dir, spec["folder"])
        if not os.path.isdir(folder):
            raise unfound(folder, f"error: no folder {folder} for task {name} (expected "
                                  f"<glue_dir>/{spec['folder']}/{spec['train']})")
        return {split: read_task_file(os.path.join(folder, file), *((test_spec, True) if split.startswith("test:") else (spec,)))
                for split, (file, _, _) in splits.items()}
    if not process.hub_reachable():
        raise SystemExit("error: the Hugging Face hub cannot be reached; offline, pass --glue_dir= with the GLUE "
                         "tasks in their original layout (<dir>/CoLA/train.tsv, ...)")
    import datasets
    rows = {s: datasets.load_dataset(spec["hub"][0], config, split=hub) for s, (_, config, hub) in splits.items()}
    return {s: (list(zip(*(r[c] for c in spec["hub_text"]))), list(r["idx" if s.startswith("test:") else "label"]))
            for s, r in rows.items()}


def check_task(name, data):
    """A task's splits, or a one-line error if one is empty or cannot be scored (constant scores)."""
    where = glue_dir and os.path.join(glue_dir, TASKS[name]["folder"]) or "the hub's copy"
    for split, (texts, labels) in data.items():
        if not texts:
            raise SystemExit(f"error: task {name} has no {split} examples in {where}")
        if split in TASKS[name]["dev"] and TASKS[name]["labels"] is None and len(set(labels)) < 2:
            raise SystemExit(f"error: task {name}'s {split} scores are all {labels[0]} in {where}: a correlation "
                             f"cannot be measured")
    return data


def encode_examples(enc, texts, max_len, special_ids):
    """Each row's texts as [CLS] a [SEP] b [SEP] ..., every text closed by its [SEP] (one text: [CLS] a [SEP]). Where a
    row is longer than max_len, its longest text gives way a token at a time until the row fits."""
    cls, sep = special_ids["[CLS]"], special_ids["[SEP]"]
    if texts and max_len < 1 + 2 * len(texts[0]):
        raise SystemExit(f"error: the checkpoint's sequences of {max_len} tokens cannot hold [CLS] and a token and "
                         f"[SEP] of each of the task's {len(texts[0])} texts")
    segments = [enc.encode_ordinary_batch([t[i] for t in texts]) for i in range(len(texts[0]))] if texts else []
    encoded = []
    for parts in zip(*segments):
        parts = [list(p) for p in parts]
        room = max_len - 1 - len(parts)
        while sum(map(len, parts)) > room:
            max(parts, key=len).pop()
        encoded.append([cls] + [t for part in parts for t in part + [sep]])
    return encoded


def train_batches(lengths, size, generator, grouped):
    """One epoch's batches (lists of rows) in a random order; grouped, each pool of 64 shuffled batches sorted by length
    before it is cut, so a batch pads little (transformers' group_by_length)."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not grouped:
        return [order[start:start + size] for start in range(0, len(order), size)]
    pools = [sorted(order[start:start + 64 * size], key=lengths.__getitem__) for start in range(0, len(order), 64 * size)]
    batches = [rows[i:i + size] for rows in pools for i in range(0, len(rows), size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def collate(sequences, pad_id, device):
    """Right-padded (B, T) ids and the (B, T) mask of real tokens."""
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sequences], batch_first=True, padding_value=pad_id)
    ids = to_device(ids, device)
    return ids, ids != pad_id


# ---------------------------------------------------------------- fine-tuning
def eval_size(rt):
    return eval_batch_size or (512 if rt.device.type == "cuda" else 128)


@torch.no_grad()
def predictions_of(model, encoded, pad_id, rt, regression):
    model.eval()
    size = eval_size(rt)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths pad less
    out = {}
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        ids, mask = collate([encoded[i] for i in rows], pad_id, rt.device)
        with rt.autocast():
            logits = model(ids, mask).float()
        values = logits[:, 0] if regression else logits.argmax(-1)
        out.update(zip(rows, values.tolist()))
    model.train()
    return [out[i] for i in range(len(encoded))]


TRAIN_SCORED = 2000  # training examples scored after training, spread evenly over the file: a run's fit, beside dev


def finetune(name, encoded, ckpt, run_seed, rt, hp, start):
    """Fine-tune the checkpoint's shape on one task's splits (split -> (ids, labels)) with `hp`'s batch_size, lr and
    epochs, from `start`'s weights (None: fresh, seeded by run_seed as the head). Returns scores ({score name: {metric:
    value}} on dev), fit (on TRAIN_SCORED training examples), counts (tokens, padded_tokens, train_seconds), tests
    ('test:<file>' -> predictions; none if it diverged), encoder (its weights), diverged (its weights or a score)."""
    spec = TASKS[name]
    regression, pad_id = spec["labels"] is None, ckpt["meta"]["special_ids"]["[PAD]"]
    train_ids, labels = encoded["train"]
    torch.manual_seed(run_seed)
    encoder = CrammedBert(**{**saved_model_args(ckpt["model_args"]), "dropout": dropout})
    if start is not None:
        encoder.load_state_dict(start)
    model = SequenceClassifier(encoder, 1 if regression else len(spec["labels"]), dropout=dropout, pooling=pooling,
                               sep_id=ckpt["meta"]["special_ids"]["[SEP]"], texts=len(spec["text"])).to(rt.device)
    groups = [dict(params=list(model.parameters()), weight_decay=weight_decay)]  # the reference decays all of them
    optimizer = rt.optimizer(groups, lr=hp["lr"], betas=(beta1, beta2), eps=eps)
    scaler = rt.grad_scaler()
    total = hp["epochs"] * math.ceil(len(train_ids) / hp["batch_size"])
    warm = max(1, int(warmup * total))  # steps of linear warm-up, then a cosine decay to 0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / warm if step < warm else
                                                 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))
    targets = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    generator = torch.Generator().manual_seed(run_seed)
    lengths = [len(ids) for ids in train_ids]
    counts, losses, shown = dict(tokens=0, padded_tokens=0), torch.zeros((), device=rt.device), 0
    start_time = time.perf_counter()
    bar = process.progress(total=total, desc=f"{name} seed {run_seed}", unit="step", leave=False)
    for _ in range(hp["epochs"]):
        for rows in train_batches(lengths, hp["batch_size"], generator, group_by_length):
            batch = [train_ids[i] for i in rows]
            ids, mask = collate(batch, pad_id, rt.device)
            counts["tokens"] += sum(map(len, batch))  # counted on the host: no step waits for the device
            counts["padded_tokens"] += len(batch) * max(map(len, batch))
            y = to_device(targets[rows], rt.device)
            with rt.autocast():
                out = model(ids, mask).float()
            loss = F.mse_loss(out[:, 0], y) if regression else F.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            bar.update()
            losses += loss.detach()  # every step's loss counts: the mean of those since the last shown is shown
            if bar.n % 25 == 0 or bar.n in (1, total):  # only then, as .item() waits for the device (a launch-bound
                bar.set_postfix(loss=f"{losses.item() / (bar.n - shown):.3f}")  # step would wait every time)
                losses, shown = losses.zero_(), bar.n
    bar.close()
    counts["train_seconds"] = time.perf_counter() - start_time
    every = -(-len(train_ids) // TRAIN_SCORED)  # a file in some order (by source, by label) is sampled throughout
    scored = {s: encoded[s] for s in spec["dev"]} | {"train": (train_ids[::every], labels[::every])}
    predicted = {s: predictions_of(model, ids, pad_id, rt, regression) for s, (ids, _) in scored.items()}
    scores = {s: {m: finite(100 * METRICS[m](predicted[s], scored[s][1])) for m in spec["metrics"]} for s in scored}
    diverged = not all(p.isfinite().all() for p in model.parameters()) or any(None in s.values() for s in scores.values())
    tests = {s: predictions_of(model, ids, pad_id, rt, regression) for s, (ids, _) in encoded.items()
             if s.startswith("test:") and not diverged}  # a diverged model's would be no submission
    return dict(fit=scores.pop("train"), scores=scores, counts=counts, tests=tests, diverged=diverged,
                encoder=model.encoder.state_dict())


def finite(score):  # a score, or None where it is not a finite number (a diverged run's: JSON has no NaN)
    return score if isinstance(score, (int, float)) and math.isfinite(score) else None


def diverged(run):  # whether a run diverged: its weights or a score not finite (an older run's file may hold NaN)
    return run.get("diverged") or any(finite(v) is None for s in run["scores"].values() for v in s.values())


# ---------------------------------------------------------------- words alone: the baseline with no network
def words_alone(name, data):
    """Each dev set of `data` scored by a bag-of-words model fitted on its training examples, {score name: {metric:
    value}}, or None without scikit-learn. The model is TF-IDF of words and word pairs and a linear one (logistic
    regression, ridge for a score). One text is read as its bag. Two texts are read as what they share (shared_words),
    not as two bags side by side. More texts are read as what the first shares with each later one, those side by side
    in the row's order. Seconds on a small task (minutes on MNLI), no seed: the same numbers on every machine."""
    try:
        from scipy import sparse
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression, Ridge
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        return None
    (texts, labels), k = data["train"], len(data["train"][0][0])
    bag, scale = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), StandardScaler()

    def features(bags, fit=False):  # a bag per text of each row
        if k == 1:
            return bags[0]
        shared = [shared_words(bags[0], later) for later in bags[1:]]  # the first text against each later one
        numbers = np.hstack([n for n, _ in shared])  # (N, 7 (k - 1)): cosines, overlaps, lengths
        numbers = scale.fit_transform(numbers) if fit else scale.transform(numbers)
        return sparse.hstack([sparse.csr_matrix(numbers), *(product for _, product in shared)]).tocsr()

    fitted, one = bag.fit_transform([t for row in texts for t in row]), len(set(labels)) < 2  # text i of row r at r * k + i
    with warnings.catch_warnings():  # lbfgs' "failed to converge" at its cap on a large task: the fit stands, quietly
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = None if one else (Ridge() if TASKS[name]["labels"] is None else LogisticRegression(max_iter=300)).fit(
            features([fitted[i::k] for i in range(k)], True), labels)  # one label (a tiny file): it is all words can say
    predicted = {s: [labels[0]] * len(data[s][0]) if one else model.predict(features([bag.transform([r[i] for r in data[s][0]])
                                                                                   for i in range(k)])) for s in TASKS[name]["dev"]}
    return {s: {m: 100 * METRICS[m](predicted[s], data[s][1]) for m in TASKS[name]["metrics"]} for s in predicted}


def shared_words(a, b):
    """What two texts' TF-IDF bags a and b (N, V each, sparse, each row of unit length) share, as (numbers, product).
    numbers (N, 7) holds their cosine, the words they share over those of either, of the shorter and of the longer,
    and the two lengths and their difference (logs of word counts). product (N, V) is the bags' product, the shared
    words weighted."""
    rows_sum = lambda m: np.asarray(m.sum(1)).ravel()  # (N,)
    seen_a, seen_b = [(m > 0).astype(np.float64) for m in (a, b)]
    n_a, n_b, shared = rows_sum(seen_a), rows_sum(seen_b), rows_sum(seen_a.multiply(seen_b))
    numbers = np.stack([rows_sum(a.multiply(b)), shared / np.maximum(1, n_a + n_b - shared), shared / np.maximum(1, np.minimum(
        n_a, n_b)), shared / np.maximum(1, np.maximum(n_a, n_b)), np.log1p(n_a), np.log1p(n_b), abs(np.log1p(n_a) - np.log1p(n_b))], 1)
    return numbers, a.multiply(b)


def kept_words_alone(path, name, data):
    """words_alone's scores of a task, kept under glue.json's runs (the summary reads them there) and fitted again only
    for other data (another file, --max_train_examples); or, where it cannot be fitted, why, in a few words (the table
    shows '-' there): a baseline beside the work never ends it."""
    file = os.path.join(runs_folder(path), "words_alone", f"{name}.json")
    digest = hashlib.sha1(json.dumps([data["train"], *(data[s] for s in TASKS[name]["dev"])]).encode()).hexdigest()
    kept, why = load_json(file) if os.path.isfile(file) else (None, None)
    if why:  # made again, as any damaged file a command makes
        set_aside(file, why)
    if isinstance(kept, dict) and kept.get("data") == digest and isinstance(kept.get("scores"), dict):
        return kept["scores"]
    try:
        scores = words_alone(name, data)
    except Exception as e:  # scikit-learn's refusal (texts of one-letter words: "empty vocabulary"), or out of memory
        return f"not fitted: {type(e).__name__}" + "".join(f": {line[:120]}" for line in str(e).splitlines()[:1])
    if scores is None:
        return "not fitted: pip install scikit-learn"
    write_json(file, dict(data=digest, scores=scores))
    return scores


def read_words_alone(path):
    """{task: {score name: {metric: value}}} of the words-alone files under glue.json's runs (a damaged one: none)."""
    found = {os.path.basename(f)[:-5]: load_json(f)[0] for f in glob.glob(os.path.join(glob.escape(runs_folder(path)), "words_alone", "*.json"))}
    return {name: kept["scores"] for name, kept in found.items() if name in TASKS and isinstance(kept, dict) and isinstance(kept.get("scores"), dict)}


# ---------------------------------------------------------------- results: a file per run, glue.json their summary
SCORE_SETTINGS = ("batch_size", "lr", "beta1", "beta2", "eps", "weight_decay", "epochs", "warmup", "dropout", "pooling",
                  "dtype", "max_train_examples", "group_by_length")  # what a score depends on: a run with other values does not reuse it
GROUPS = ("tasks", "no_pretraining")  # the checkpoint's runs; the --from_scratch control's: each score's floor
RUN_KEYS = {"seed", "settings", "scores", "facts", "counts", "finished"}  # what a run's file holds (and the identity)


def main_scores(tasks, key="median"):
    """score name -> its task's main metric in each task's `key` (the median over seeds, or the majority class)."""
    return {score_name: metrics[TASKS[name]["metrics"][0]]
            for name, result in tasks.items() if key in result for score_name, metrics in result[key].items()}


def majority_scores(name, data):
    """Each dev set scored as if every example had the training set's most frequent label (STS-B: its mean)."""
    labels = data["train"][1]
    guess = statistics.mean(labels) if TASKS[name]["labels"] is None else max(sorted(set(labels)), key=labels.count)
    return {score_name: {m: 100 * METRICS[m]([guess] * len(data[score_name][1]), data[score_name][1])
                         for m in TASKS[name]["metrics"]} for score_name in TASKS[name]["dev"]}


def how_made(entry):
    """How a task's scores were made (the table's, tools/glue_plot.py's), with any cap on the training examples and what
    diverged: 'best of 3 on dev, 1 diverged: lr 0.0003, batch 32, median of 2 seeds (1 of 3 diverged), 5 epochs'."""
    settings, e, points, seeds, lost = (entry["settings"], entry["settings"]["epochs"], entry.get("grid_size"),
                                        len(entry["seeds"]), len(entry.get("diverged", ())))
    epochs = f", {e} epoch{'s' * (e > 1)}" + f", first {entry['train_examples']:,} train examples" * bool(settings["max_train_examples"])
    if not entry["median"]:
        return f"every run diverged: {f'{points} settings x ' * bool(points)}{seeds} seed{'s' * (seeds > 1)}{epochs}"
    best = (f"best of {points} on dev" + f", {entry.get('grid_diverged')} diverged" * bool(entry.get("grid_diverged")) +
            f": lr {settings['lr']:g}, batch {settings['batch_size']}, ") * bool(points)
    best += f"from the seed's {TASKS[settings['start_from'].split()[0]]['folder']} fine-tune, " if settings.get("start_from") else ""
    n = seeds - lost
    return f"{best}{'median of ' * (n > 1)}{n} seed{'s' * (n > 1)}{f' ({lost} of {seeds} diverged)' * bool(lost)}{epochs}"


def cell(metrics, main, others, named=True, spread=None):
    """'58.1 [55.0-60.2] (F1 70.1)': the main metric, its seeds' `spread`, the others in brackets; '-' for none."""
    if metrics is None:
        return "-"
    low, high = (spread or {}).get(main, (None, None))
    return f"{metrics[main]:.1f}" + (f" [{low:.1f}-{high:.1f}]" if low != high else "") + "".join(
        f" ({METRIC_NAMES[m] + ' ' if named else ''}{metrics[m]:.1f})" for m in others)


def table(results, names=None):
    """Markdown, a row per score (main metric, others in brackets) and how it was made: the checkpoint's, the same
    shape's without pretraining (the floor), words alone's (a bag of words, no network), the majority class's, the
    reference's. Returns (markdown, {column: its
    mean over `counted`, nan if it lacks one}, counted: the reference's scores that ours, else the floor, has)."""
    ours, scratch = results.get("tasks", {}), results.get("no_pretraining", {})
    names = [n for n in (names or TASKS) if n in ours or n in scratch]
    words = results.get("words_alone", {})  # an older glue.json has none
    lines = ["| task | metric | ours | no pretraining | words alone | majority class | reference |", "|---|---|---|---|---|---|---|"]
    columns = dict(ours={}, no_pretraining={}, words_alone={}, majority={}, reference=REFERENCE)  # score name -> main score
    for name in names:
        main, *others = TASKS[name]["metrics"]
        made = ours.get(name) or scratch[name]  # the runs the row describes: ours where there are both
        how, floor_how = how_made(made), how_made(scratch[name]) if name in scratch else ""
        floor_how = f" ({floor_how})" if floor_how not in ("", how) else ""
        for score_name in TASKS[name]["dev"]:
            found = dict(ours=ours.get(name, {}).get("median", {}).get(score_name),
                         no_pretraining=scratch.get(name, {}).get("median", {}).get(score_name),
                         words_alone=words.get(name, {}).get(score_name),
                         majority=made["majority"].get(score_name))  # of the training labels those runs saw
            for column, metrics in found.items():
                if metrics is not None:
                    columns[column][score_name] = metrics[main]
            reference = f"{REFERENCE[score_name]:.1f}" if score_name in REFERENCE else "-"
            spread = {c: r.get(name, {}).get("spread", {}).get(score_name) for c, r in (("ours", ours), ("floor", scratch))}
            lines.append(f"| {score_name} | {METRIC_NAMES[main]} ({how}) | "
                         f"{cell(found['ours'], main, others, True, spread['ours'])} | "
                         f"{cell(found['no_pretraining'], main, others, True, spread['floor'])}"
                         f"{floor_how if found['no_pretraining'] else ''} | {cell(found['words_alone'], main, others, named=False)} | "
                         f"{cell(found['majority'], main, others, named=False)} | {reference} |")
    counted = [s for s in REFERENCE if s in columns["ours"]] or [s for s in REFERENCE if s in columns["no_pretraining"]]
    averages = {column: statistics.mean(scores[s] for s in counted) if counted and all(s in scores for s in counted)
                else float("nan") for column, scores in columns.items()}
    lines.append(f"| average ({len(counted)} of {len(REFERENCE)}) | | " +
                 " | ".join("-" if math.isnan(v) else f"{v:.1f}" for v in averages.values()) + " |")
    protocols, heads = {}, {}  # how each task's runs were made: its protocol, its head
    for name in names:
        made = ours.get(name) or scratch[name]
        protocols.setdefault(PROTOCOLS[made.get("protocol", "fixed")], []).append(name)
        head = made["settings"].get("pooling", "first")
        heads.setdefault(HEADS[head] + texts_read(name) * (head == "pair"), []).append(name)
    lines += ["", "Dev sets; " + "; ".join(f"{', '.join(n)}: {p}" for p, n in protocols.items()) + " (docs/glue.md).",
              "Heads: " + "; ".join(f"{', '.join(n)}: {h}" for h, n in heads.items()) + "."]
    return "\n".join(lines), averages, counted


def pretraining_facts(ckpt, run_dir):
    """What tools/glue_plot.py needs: the checkpoint's shape, tokens, hours, FLOPs (flops_per_token at its final masking
    rate x tokens) and, if its metrics.jsonl logged them at its step, its validation loss and accuracy."""
    args = saved_model_args(ckpt["model_args"])
    per_token = ModelConfig(**args).flops_per_token(ckpt.get("config", {}).get("mask_rate", MASK_RATE))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    at_step = [r for r in read_jsonl(metrics) if r.get("kind") == "eval" and r.get("step") == ckpt.get("step") and
               r.get("run") == ckpt.get("run")] if os.path.isfile(metrics) else []
    last = at_step[-1] if at_step else {}  # after a resume the later line counts (files.read_metrics)
    return dict(shape=f"{args['n_layers']}x{args['d_model']}", vocab_size=args["vocab_size"], tokens=ckpt.get("tokens"),
                hours=round(ckpt.get("elapsed", 0.0) / 3600, 4), flops_per_token=per_token,
                flops=per_token * (ckpt.get("tokens") or 0), val_loss=last.get("val_loss"), accuracy=last.get("accuracy"))


def kept_runs():
    """What a stop keeps, said when it comes: the runs finished so far, or that none had."""
    done = len(run_files(results_path()))
    return (f"the {done} run(s) finished so far are in {results_path()}; run the same command to do the rest" if done else
            "no fine-tuning run had finished, so nothing was written; run the same command to start")


def results_path():
    return out_json or os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "glue.json")


def runs_folder(path):
    """Where glue.json's runs live, a file each (run_file): each process writes its own, so none needs a lock."""
    return os.path.splitext(path)[0] + "_runs"


def run_file(path, group, name, seed, settings):
    """<glue>_runs/<group>/<task>/seed<N>-<settings digest>.json: a rerun with other settings keeps older files."""
    return os.path.join(runs_folder(path), group, name, f"seed{seed}-{settings_digest(settings)}.json")


def settings_digest(settings):
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def latest(run):
    """A run's place: its command's order (one past the latest: a count no clock set back can reorder), its time."""
    return run.get("order", 0), run.get("chosen", run["finished"])


def run_files(path):
    """The files of glue.json's runs, each with its time of change: what a summary was made from."""
    return [(f, os.stat(f).st_mtime_ns) for f in sorted(glob.glob(os.path.join(glob.escape(runs_folder(path)), "*", "*", "*.json")))]


def same_checkpoint(record, identity):
    """Whether a run's file or glue.json holds this checkpoint's scores (its weights' digest, step and tokens)."""
    return all(record.get(k) == v for k, v in identity.items() if k != "checkpoint")


def is_run(run):
    """Whether a run file's record has what the summary reads, of the types it reads."""
    return (isinstance(run, dict) and RUN_KEYS <= run.keys() and isinstance(run["seed"], int)
            and isinstance(run["finished"], (int, float)) and isinstance(run.get("chosen", 0), (int, float))
            and all(isinstance(run[k], dict) for k in ("settings", "scores", "facts", "counts"))
            and {"epochs", "max_train_examples"} <= run["settings"].keys() and isinstance(run.get("order", 0), int))


def read_runs(files, identity):
    """{group: {task: [run, ...]}} from run files; a damaged one set aside (its run is done again); a one-line error
    for one that holds another checkpoint's scores, which a rerun must not replace."""
    found = {}
    for file, _ in files:
        (run, why), (group, name) = load_json(file), file.split(os.sep)[-3:-1]
        if why or not (group in GROUPS and name in TASKS and is_run(run)):
            set_aside(file, why or "not a fine-tuning run's record")
            continue
        if not same_checkpoint(run, identity):
            raise SystemExit(f"error: {file} holds the scores of another checkpoint: pass --out_json= for this one's, "
                             f"or move it away")
        found.setdefault(group, {}).setdefault(name, []).append(run)
    return found


def grid_name():
    """How runs of --protocol=grid know their grid (a run's `grid`), or None."""
    return f"lr {grid_lr} x batch {grid_batch}" if protocol == "grid" else None


def task_entry(runs):
    """A task's entry in glue.json: the seeds run with the settings of its latest run, or of the latest command that
    found its runs done (`chosen`): a rerun with other settings supersedes the older runs (their files stay) until a
    command asks for those again; after a grid's command, the best on dev of that grid's settings (by the median of
    the first dev set's main metric), its size said."""
    last = max(runs, key=latest)
    pool = [r for r in runs if last.get("grid") and (r.get("grid"), latest(r)[0]) == (last["grid"], latest(last)[0])] or [last]
    plans = {json.dumps(r["settings"], sort_keys=True): r["settings"] for r in pool}.values()
    entries = [settings_entry([r for r in runs if r["settings"] == settings]) for settings in plans]
    best = max((e for e in entries if e["median"]), key=lambda e: next(iter(next(iter(e["median"].values())).values())),
               default=entries[0])  # a point that diverged is never the best (max keeps a NaN that comes first)
    best = dict(best, grid=last.get("grid"), grid_size=len(entries) if last.get("grid") else 0,
                grid_diverged=sum(not e["median"] for e in entries) * bool(last.get("grid")),
                protocol="grid" if last.get("grid") else "task_start" if best["settings"].get("start_from") else "fixed")
    return dict(best, how=how_made(best))  # what tools/glue_plot.py shows


def settings_entry(runs):
    """One setting's runs: each seed's latest, their scores and median, the median fit, the seconds and counts summed."""
    runs, settings = list({r["seed"]: r for r in sorted(runs, key=latest)}.values()), runs[0]["settings"]
    runs.sort(key=lambda r: r["seed"])  # each seed once: its latest run with these settings
    good = [r for r in runs if not diverged(r)]  # the median, spread and fit leave out a run that diverged (none: {})
    return dict(settings=settings, seeds=[r["seed"] for r in runs], diverged=[r["seed"] for r in runs if diverged(r)],
                 per_seed=[{n: {m: finite(v) for m, v in s.items()} for n, s in r["scores"].items()} for r in runs],
                 median={name: {m: statistics.median(r["scores"][name][m] for r in good) for m in metrics}
                         for name, metrics in good[0]["scores"].items()} if good else {},
                 spread={name: {m: [f(r["scores"][name][m] for r in good) for f in (min, max)] for m in metrics}
                         for name, metrics in good[0]["scores"].items()} if good else {}, **runs[-1]["facts"],
                 fit={m: statistics.median(r["fit"][m] for r in good) for m in good[0]["fit"]}
                 if good and all("fit" in r for r in good) else {},
                 **{k: round(sum(r["counts"][k] for r in runs), 1) for k in runs[0]["counts"]})


def write_summary(path, identity, facts):
    """glue.json anew from its runs' files: each group's tasks, the main scores, the averages and the table.
    Written again until the files are as they were before the read: of processes finishing together, the
    last to write has seen every run, so none is left out without a lock."""
    while True:
        before = run_files(path)
        runs = read_runs(before, identity)
        results = {group: {name: task_entry(r) for name, r in runs.get(group, {}).items()} for group in GROUPS}
        results["words_alone"] = read_words_alone(path)
        markdown, averages, counted = table(results)
        averages = {k: None if math.isnan(v) else v for k, v in averages.items()}
        results.update(identity, pretraining=facts, runs=os.path.basename(runs_folder(path)),
                       scores=main_scores(results["tasks"]), no_pretraining_scores=main_scores(results["no_pretraining"]),
                       majority=main_scores({**results["no_pretraining"], **results["tasks"]}, "majority"),
                       words_alone_scores={s: m[TASKS[n]["metrics"][0]] for n, t in results["words_alone"].items() for s, m in t.items()},
                       average=averages["ours"], no_pretraining_average=averages["no_pretraining"],
                       words_alone_average=averages["words_alone"],
                       average_over=counted, reference=REFERENCE, table=markdown)
        write_json(path, results)
        if run_files(path) == before:
            return results


def summary(name, entry):
    """A task's main scores, its fit on the training examples, and how they were made: 'accuracy 58.1, train 97.2
    (median of 3 seeds, 5 epochs, 386 s, 4,100 tokens/s, 96% of them not padding)'."""
    main = TASKS[name]["metrics"][0]
    if not entry["median"]:
        return f"no score: {how_made(entry)}, {entry['seconds']:.0f} s (a lower --lr or --grid_lr may not)"
    scores = ", ".join(f"{'' if score_name == name else score_name + ' '}{METRIC_NAMES[main]} {v[main]:.1f}"
                       for score_name, v in entry["median"].items()) + (f", train {entry['fit'][main]:.1f}" if entry.get("fit") else "")
    speed = (f", {entry['tokens'] / entry['train_seconds']:,.0f} tokens/s, {entry['tokens'] / entry['padded_tokens']:.0%} "
             f"of them not padding" if entry.get("train_seconds") else "")  # (0.0: runs too short to time)
    return f"{scores} ({how_made(entry)}, {entry['seconds']:.0f} s{speed})"


def remaining_seeds(per_task, n_seeds, runs, path, group, order):
    """task -> [(settings, the seeds they still need)], given the runs of `group` this one adds to: a rerun redoes no
    run whose file holds the same settings (`per_task`'s: it says so, and marks them chosen, with this command's
    `order` and grid: glue.json shows what was asked)."""
    wanted, todo, grid = [seed + s for s in range(n_seeds)], {}, grid_name()
    for name, plans in per_task.items():
        done = []
        for settings in plans:
            finished = [r for r in runs.get(name, []) if r["settings"] == settings and all(map(whole, kept_files(
                run_file(path, group, name, r["seed"], settings), name, group, diverged(r))))]
            missing = [s for s in wanted if s not in {r["seed"] for r in finished}]
            todo.setdefault(name, []).extend([(settings, missing)] if missing else [])
            for run in finished:
                done.append(dict(run, chosen=time.time(), order=order, grid=grid))
                write_json(run_file(path, group, name, run["seed"], settings), done[-1])
        if not todo[name]:
            del todo[name]
            print(f"{name}: done earlier, in {path}: {summary(name, task_entry(done))}")
    return todo


def plans_for(train_examples, width, settings, given):
    """task -> the settings of its runs (`train_examples`: task -> the examples it trains on, its file's): one, by
    settings_for (`given` ones in their place), or with --protocol=grid one for each rate and batch of grid_lr x
    grid_batch; a one-line error for a grid that is not lists of numbers."""
    points = []
    with contextlib.suppress(ValueError):  # each point once (3e-4 and 0.0003 are one)
        points = list({(float(r), int(b)): None for r in grid_lr.split(",") for b in grid_batch.split(",")})
    if protocol == "grid" and (not points or not all(r > 0 and b > 0 for r, b in points)):
        raise SystemExit(f"error: --grid_lr={grid_lr!r} and --grid_batch={grid_batch!r} must be lists of rates > 0 and "
                         f"batch sizes >= 1, each comma-separated (3e-4,1e-4 and 16,32)")
    plans = {name: [dict(settings, **settings_for(width, examples, {**given, **point})) for point in ([dict(lr=r, batch_size=b)
             for r, b in points] if protocol == "grid" else [{}])] for name, examples in train_examples.items()}
    for name in (STARTED - {start_task}) & plans.keys() if protocol == "task_start" else ():  # its start named
        plans[name] = [dict(plan, start_from=f"{start_task} {settings_digest(plans[start_task][0])}") for plan in plans[name]]
    return plans


def kept_files(file, name, group, lost=False):
    """What a run of `file` must leave beside it for this command: with --predict, its test-set predictions (the model's,
    unless it diverged: `lost`); with --protocol=task_start, start_task's encoder, which RTE, MRPC and STS-B start from."""
    tests = list(prediction_files(file, name).values())  # each: a stop may come between
    return tests * (predict and group == "tasks" and not lost) + [file[:-5] + ".encoder.pt"] * (protocol == "task_start" and name == start_task)


def whole(path):
    """Whether a file a run keeps is there and whole (an encoder's zip index reads, mmap: not its weights; a prediction
    file ends its last line), else set aside (a disk's fault, an older cram's write in place): its run is done again."""
    if not os.path.exists(path):
        return False
    try:
        if path.endswith(".pt"):
            torch.load(path, weights_only=True, mmap=True)
        elif Path(path).read_bytes()[-1:] != b"\n":
            raise ValueError("cut short")
        return True
    except Exception as e:  # torch's errors for a cut zip or pickle are of several kinds
        set_aside(path, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}")
        return False


def prediction_files(file, name):
    """Where the run of `file` keeps its test-set predictions: the server's file -> <run>.test/<that file>.tsv."""
    return {f: os.path.join(file[:-5] + ".test", f"{f}.tsv") for f in TASKS[name]["tests"]}


def settings_line(todo, per_task, given):
    """What the rule picked, tasks of the same picks together: 'rte, mrpc: batch 32, lr 8.4e-05, 10 epochs; sst2: ...
    (by the encoder's width and the task's size; given: lr)'; a grid's as its size."""
    picks = {}
    for name in todo:
        (b, r, e), n = (per_task[name][0][k] for k in ("batch_size", "lr", "epochs")), len(per_task[name])
        shown = f"{n} settings (lr {grid_lr} x batch {grid_batch})" if n > 1 else f"batch {b}, lr {r:g}"
        picks.setdefault(f"{shown}, {e} epoch{'s' * (e != 1)}", []).append(name)
    mine = [k for k in ("batch_size", "lr", "epochs") if given[k] and (protocol != "grid" or k == "epochs")]
    return "; ".join(f"{', '.join(names)}: {shown}" for shown, names in picks.items()) + \
        f" (by the encoder's width and the task's size{'; given: ' * bool(mine)}{', '.join(mine)})"


def write_predictions(file, name, data, predicted):
    """The run of `file`'s test-set predictions as the GLUE server takes them, a file each (prediction_files'): a header,
    then each example's index and prediction (a label's name; STS-B's score, clipped to 0-5)."""
    labels, paths = TASKS[name]["labels"], prediction_files(file, name)
    for split, values in predicted.items():
        if len(values) != len(data[split][1]):  # each test row needs its prediction: a file short of one is refused
            raise SystemExit(f"error: {len(values)} predictions for the {len(data[split][1])} rows of {split[5:]}'s test set")
        rows = "".join(f"{int(i)}\t{labels[v] if labels else f'{min(5.0, max(0.0, v)):.3f}'}\n"
                       for i, v in zip(data[split][1], values))
        write_atomically(paths[split[5:]], lambda tmp: Path(tmp).write_text("index\tprediction\n" + rows, encoding="utf-8"))


def write_submission(path, identity, chosen_settings):
    """<glue>_test/, the folder to zip for the GLUE server: each task's files from its median seed on dev (of the seeds
    of its `chosen_settings`, glue.json's, with predictions; of two middles, the lower); a line saying what it lacks."""
    runs, folder = read_runs(run_files(path), identity).get("tasks", {}), os.path.splitext(path)[0] + "_test"
    for name, settings in chosen_settings.items():
        files = {r["seed"]: list(prediction_files(run_file(path, "tasks", name, r["seed"], settings), name).values())
                 for r in runs[name] if r["settings"] == settings}
        mine = [r for r in runs[name] if r["settings"] == settings and not diverged(r) and all(map(os.path.exists, files[r["seed"]]))]
        main, score = TASKS[name]["metrics"][0], next(iter(TASKS[name]["dev"]))  # MNLI: matched
        for file in TASKS[name]["tests"]:  # the median seed's, or none: never another setting's left from before
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, f"{file}.tsv"))
        for source in files[sorted(mine, key=lambda r: (r["scores"][score][main], r["seed"]))[(len(mine) - 1) // 2]["seed"]
                            ] if mine else []:
            write_atomically(os.path.join(folder, os.path.basename(source)), lambda tmp: shutil.copyfile(source, tmp))
    server = [f for row in TASKS.values() if row["glue"] for f in row["tests"]]  # not another benchmark's tasks
    missing = [f for f in server if not os.path.isfile(os.path.join(folder, f"{f}.tsv"))]
    return (f"wrote {folder}: the test sets' predictions, each task's median seed on dev of those predicted; the GLUE server takes all "
            f"{len(server)} files" + (f", and these are missing: {', '.join(missing)} (--tasks= "
                                                           f"those with --predict=True and their settings)" if missing else ""))


def earlier_precision(runs):
    """(device type, dtype) of the latest finished run in {group: {task: [run]}}, or None: dtype=auto keeps it, so a
    rerun's timing cannot change the precision (and redo every run)."""
    done = [r for tasks in runs.values() for task in tasks.values() for r in task if "device" in r]
    latest = max(done, key=lambda r: r["finished"], default=None)
    return latest and (latest["device"], latest["settings"].get("dtype"))


def check_earlier(path, identity):
    """A glue.json already there must be this checkpoint's summary of its runs: one of another checkpoint, of an older
    cram (which kept the scores in glue.json alone) or JSON of another shape is not replaced, and said as what it is. One
    that does not parse is cram's, damaged, only where its runs' folder is beside it (cram writes that first): else it
    is a file of the user's (a JSON-lines log), never moved nor called damaged."""
    old, why = load_json(path) if os.path.exists(path) else ({"runs": True, **identity}, None)
    if why and os.path.isdir(runs_folder(path)):  # cram's, damaged (its runs' files come first): made again from them
        return set_aside(path, why)
    if not isinstance(old, dict) or "runs" not in old or not same_checkpoint(old, identity):
        what = f"text that is not JSON ({why}) and no runs' folder beside it: not finetune_glue.py's" if why else (
            "the scores of another checkpoint" if "runs" in old else "an older cram's scores, kept in it alone") if \
            isinstance(old, dict) and "tasks" in old else "JSON of another shape (no tasks: not finetune_glue.py's)"
        raise SystemExit(f"error: {path} holds {what}: pass --out_json= for this checkpoint's, or move it away")


def main(config):
    names = [t.strip().lower() for t in tasks.split(",") if t.strip()]
    names = [start_task, *(n for n in names if n != start_task)] if protocol == "task_start" else names  # the start first
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise SystemExit(f"error: unknown task {', '.join(map(repr, unknown)) or '(none given)'} "
                         f"(tasks: {', '.join(TASKS)})")
    ckpt = load_checkpoint(checkpoint)
    path, group = results_path(), GROUPS[from_scratch]
    for file in (path, os.path.join(runs_folder(path), group, "probe.json")):
        check_writable(file, "--out_json")  # now, not after an hour of fine-tuning
    identity = dict(checkpoint=os.path.abspath(checkpoint), checkpoint_digest=weights_digest(ckpt["model"]),
                    checkpoint_step=ckpt.get("step"), checkpoint_tokens=ckpt.get("tokens"))
    check_earlier(path, identity)
    facts = pretraining_facts(ckpt, os.path.dirname(os.path.abspath(checkpoint)))
    earlier = read_runs(run_files(path), identity)
    rt = runtime.setup(device, dtype, compile=False, continues=earlier_precision(earlier))
    settings = dict({k: config[k] for k in SCORE_SETTINGS}, dtype=rt.dtype_name())  # the precision as resolved
    tests = predict and not from_scratch  # the model's, not the floor's
    datasets_by_task = {name: check_task(name, load_task(name, tests)) for name in names}  # bad data fails before training
    for data in datasets_by_task.values():
        data["train"] = tuple(column[:max_train_examples or None] for column in data["train"])
    per_task = plans_for({name: len(data["train"][0]) for name, data in datasets_by_task.items()},
                         ckpt["model_args"]["d_model"], settings, config)  # the same for the floor
    most = max(s["batch_size"] for plans in per_task.values() for s in plans)
    shape = ModelConfig(**saved_model_args(ckpt["model_args"]))
    for size, setting, training in ((most, "batch_size", True), (eval_size(rt), "eval_batch_size", False)):
        memory.check_memory(shape, rt, 0.0, (size, f"--{setting}={size}"), training=training)  # one that surely cannot fit fails now
    words = {name: kept_words_alone(path, name, data) for name, data in datasets_by_task.items()}  # seconds each: after the checks
    print("words alone (TF-IDF and a linear model, the baseline with no network; '-' in the table where not fitted): " +
          ", ".join(f"{n} {next(iter(w.values()))[TASKS[n]['metrics'][0]]:.1f}{texts_read(n)}" if isinstance(w, dict)
                    else f"{n} - ({w})" for n, w in words.items()))
    order = 1 + max((latest(r)[0] for runs in earlier.get(group, {}).values() for r in runs), default=0)  # this command's
    n_seeds = seeds or (5 if rt.device.type == "cuda" else 1)
    todo = remaining_seeds(per_task, n_seeds, earlier.get(group, {}), path, group, order)
    enc = make_encoding(parse_ranks(ckpt["tokenizer"]), ckpt["meta"]["special_ids"])
    print(f"fine-tuning {'a never-pretrained encoder of the shape of ' * from_scratch}{checkpoint} (step "
          f"{ckpt.get('step')}, {ckpt['model_args']['n_layers']}x{ckpt['model_args']['d_model']}) on "
          f"{', '.join(todo) or 'nothing left to do'} with {n_seeds} seed(s){'' if seeds else ' (5 on a GPU, 1 on a CPU)'}"
          f" on {rt.describe()}" + f"\n{settings_line(todo, per_task, config)}" * bool(todo))

    for name, work in todo.items():
        data = datasets_by_task[name]
        encoded = {split: (encode_examples(enc, texts, ckpt["model_args"]["seq_len"], ckpt["meta"]["special_ids"]),
                           labels) for split, (texts, labels) in data.items()}
        task_facts = dict(train_examples=len(data["train"][0]), majority=majority_scores(name, data),
                          dev_examples={k: len(data[k][0]) for k in TASKS[name]["dev"]})
        for settings, run_seed in ((s, seed) for s, missing in work for seed in missing):  # each run in glue.json at once
            t0 = time.monotonic()
            start = None if from_scratch else ckpt["model"]
            if settings.get("start_from"):  # this seed's fine-tune of start_task (of this group), whose settings it names
                first = run_file(path, group, start_task, run_seed, per_task[start_task][0])
                start = torch.load(f"{first[:-5]}.encoder.pt", map_location="cpu")
            out = finetune(name, encoded, ckpt, run_seed, rt, settings, start)
            run = dict(identity, seed=run_seed, settings=settings, device=rt.device.type, scores=out["scores"], fit=out["fit"],
                       diverged=out["diverged"], facts=task_facts, counts=dict(out["counts"], seconds=time.monotonic() - t0),
                       finished=time.time(), order=order, grid=grid_name())
            file = run_file(path, group, name, run_seed, settings)
            if out["tests"]:
                write_predictions(file, name, data, out["tests"])
            if protocol == "task_start" and name == start_task:
                write_atomically(f"{file[:-5]}.encoder.pt", lambda tmp: torch.save(out["encoder"], tmp))
            write_json(file, run)  # last: a run's file says that what it keeps beside it is whole
            results = write_summary(path, identity, facts)
        print(f"{name}{' (no pretraining)' * from_scratch}: {summary(name, results[group][name])}")

    results = write_summary(path, identity, facts)
    print(table(results, names)[0])
    others = sorted({n for g in GROUPS for n in results[g]} - set(names))
    print(f"wrote {path}" + (f" (it also holds {', '.join(others)})" if others else ""))
    if tests:
        print(write_submission(path, identity, {name: entry["settings"] for name, entry in results["tasks"].items()}))
    elif predict:
        print("--predict=True with --from_scratch=True: the floor writes no test-set predictions, the model's do")
    if not from_scratch and any(n not in results["no_pretraining"] for n in names):
        print("no pretraining: '-' where not measured; the same command with --from_scratch=True fine-tunes a "
              "never-pretrained encoder of this shape, the floor these scores should beat")


if __name__ == "__main__":
    settings = configure(globals(), sys.argv[1:])
    process.guarded(main, kept_runs, settings)
