import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn import metrics as sk

import finetune_glue as glue
from cram import runtime
from conftest import OBJECTS, PLACES, ROOT, SUBJECTS, VERBS, assert_one_line_error, run_script
from model import CrammedBert, SequenceClassifier

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue")
# task: {split: (examples, label values)} in the fixtures
EXPECTED = {
    "cola": {"train": (4, [1, 0, 1, 0]), "cola": (3, [1, 0, 1])},
    "sst2": {"train": (3, [1, 0, 1]), "sst2": (2, [1, 0])},
    "mrpc": {"train": (4, [1, 0, 1, 0]), "mrpc": (2, [1, 0])},
    "stsb": {"train": (3, [5.0, 0.25, 3.6]), "stsb": (2, [5.0, 0.25])},
    "qqp": {"train": (3, [1, 0, 1]), "qqp": (2, [1, 0])},  # the broken fourth row is skipped
    "mnli": {"train": (3, [0, 2, 1]), "mnli-m": (3, [0, 2, 1]), "mnli-mm": (3, [0, 2, 1])},
    "qnli": {"train": (2, [0, 1]), "qnli": (1, [0])},
    "rte": {"train": (2, [1, 0]), "rte": (1, [1])},
    "wnli": {"train": (1, [1]), "wnli": (1, [0])},
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_fixture_layouts_load(task, monkeypatch):
    monkeypatch.setattr(glue, "glue_dir", FIXTURES)
    data = glue.load_task(task)
    assert set(data) == set(EXPECTED[task])
    for split, (count, labels) in EXPECTED[task].items():
        texts, got = data[split]
        assert len(texts) == count and got == labels
        assert all(len(t) == len(glue.TASKS[task]["text"]) and all(t) for t in texts)


def test_quirks_of_the_layout(monkeypatch):
    monkeypatch.setattr(glue, "glue_dir", FIXTURES)
    assert glue.load_task("cola")["train"][0][2] == ('She said "hello" to them.',)  # quotes are text
    assert glue.load_task("mrpc")["train"][0][0] == ('He said " the witness " lied .', 'The witness lied , he said .')
    assert glue.load_task("mnli")["mnli-m"][0][1] == ("The cat sleeps on the sofa.", "The cat is running.")
    assert glue.load_task("stsb")["train"][0][0] == ("A plane is taking off.", "An air plane is taking off.")


def test_a_task_file_is_read_as_its_writer_wrote_it_or_said(tmp_path, monkeypatch, capsys):
    """Issue 93. A train.tsv written by Python's csv writer with a tab delimiter (pandas' to_csv(sep="\\t")) is read by
    the csv module's quoting rules: named, a sentence holding a tab, quoted (it was split and its second sentence
    dropped, unsaid); unnamed, the writer's doubled quotes and a sentence over two lines (numbered by its first). GLUE's
    own files, whose quotes are text, read as before (test_quirks_of_the_layout). A row with a column too many (named:
    an unquoted tab in RTE's; unnamed: in CoLA's, without a header) and a jsonl row whose value is null (named:
    pandas' missing passage; unnamed: a list) are left out and counted, as rows short of a column are, and in a test
    file are one line, whose advice (quote the tab) then reads."""
    import csv
    shutil.copytree(FIXTURES, tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
    rte = tmp_path / "RTE"
    with open(rte / "train.tsv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f, delimiter="\t").writerows([("index", "sentence1", "sentence2", "label"), (0, "A\ttab.", "B.", "entailment"),
                                               (1, 'He said "no".', "Two\nlines.", "not_entailment"), (2, "C.", "D.", "entailment")])
    assert glue.load_task("rte")["train"] == ([("A\ttab.", "B."), ('He said "no".', "Two\nlines."), ("C.", "D.")], [0, 1, 0])
    (rte / "train.tsv").write_text('index\tsentence1\tsentence2\tlabel\n0\tA\ttab.\tB.\tentailment\n1\t"Hi," he said.\tC.\t'
                                   'entailment\n')
    assert glue.load_task("rte")["train"] == ([('"Hi," he said.', "C.")], [0])
    assert f"{rte / 'train.tsv'}: left out 1 of 2 rows that lack exactly 4 tab-separated fields (line 2)" in capsys.readouterr().out
    cola = tmp_path / "CoLA" / "train.tsv"
    cola.write_text(cola.read_text() + "cj99\t1\t\tA\ttab.\n")
    assert len(glue.load_task("cola")["train"][0]) == 4
    assert f"{cola}: left out 1 of 5 rows that lack exactly 4 tab-separated fields (line 5)" in capsys.readouterr().out
    (rte / "test.tsv").write_text("index\tsentence1\tsentence2\n0\tA\ttab.\tB.\n")
    with pytest.raises(SystemExit, match="test.tsv: line 2 lacks exactly 3 tab-separated fields: a test file needs"):
        glue.load_task("rte", tests=True)
    (rte / "test.tsv").write_text('index\tsentence1\tsentence2\n0\t"A\ttab."\tB.\n')  # the advice followed: quoted
    assert glue.load_task("rte", tests=True)["test:RTE"] == ([("A\ttab.", "B.")], [0])
    row = glue.task("boolq", folder="BoolQ", reader="jsonl", train="train.jsonl", dev={}, text=("question", "passage"),
                    labels=("False", "True"), tests={"BoolQ": ("test.jsonl", "boolq", "test")}, test_index="idx")
    monkeypatch.setitem(glue.TASKS, "boolq", row)
    (tmp_path / "BoolQ").mkdir()
    lines = [dict(question="q?", passage=passage, label=True, idx=0) for passage in ("p.", None, ["a", "b"], "p.")]
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / "BoolQ" / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert glue.load_task("boolq")["train"] == ([("q?", "p.")] * 2, [1, 1])
    assert "left out 2 of 4 rows that lack a value (not null) in each of question, passage, label (lines 2, 3)" in \
        capsys.readouterr().out
    with pytest.raises(SystemExit, match="test.jsonl: lines 2, 3 lack a value .not null. in each of question, passage, idx"):
        glue.load_task("boolq", tests=True)


def test_a_task_file_saved_with_a_byte_order_mark_reads_as_its_utf8_twin(tmp_path, monkeypatch):
    """Issue 100, class 1. Named: RTE's train.tsv saved by Excel as "Unicode Text" (UTF-16 LE with its mark) reads as
    the UTF-8 file it was. Unnamed: a dev.tsv in UTF-16 BE, a jsonl task's files with a UTF-16 or UTF-8 mark. A file in
    another encoding without a mark is one line whose command, followed as written, converts it."""
    import codecs
    shutil.copytree(FIXTURES, tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
    rte = tmp_path / "RTE"
    expected = glue.load_task("rte")
    for name, encode in (("train.tsv", lambda t: t.encode("utf-16")),
                         ("dev.tsv", lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"))):
        (rte / name).write_bytes(encode((rte / name).read_text(encoding="utf-8").replace("\n", "\r\n")))
    assert glue.load_task("rte") == expected
    row = glue.task("boolq", folder="BoolQ", reader="jsonl", train="train.jsonl", dev={"boolq": ("dev.jsonl", "validation")},
                    text=("question", "passage"), labels=("False", "True"))
    monkeypatch.setitem(glue.TASKS, "boolq", row)
    (tmp_path / "BoolQ").mkdir()
    lines = "".join(json.dumps(dict(question=f"q{i}?", passage="caf\u00e9 \u2713", label=i % 2 == 0)) + "\n" for i in range(3))
    (tmp_path / "BoolQ" / "train.jsonl").write_bytes(lines.encode("utf-16"))
    (tmp_path / "BoolQ" / "dev.jsonl").write_bytes(codecs.BOM_UTF8 + lines.encode())
    assert glue.load_task("boolq") == {s: ([(f"q{i}?", "caf\u00e9 \u2713") for i in range(3)], [1, 0, 1]) for s in ("train", "boolq")}
    (rte / "train.tsv").write_bytes((rte / "train.tsv").read_text(encoding="utf-16").replace("No", "Caf\u00e9").encode("cp1252"))
    with pytest.raises(SystemExit, match="is not UTF-8 text") as refusal:
        glue.load_task("rte")
    subprocess.run(str(refusal.value).split(" with ", 1)[1], shell=True, check=True)  # the advice, as written
    assert glue.load_task("rte")["train"][0][0][0].startswith("Caf\u00e9 weapons")


def test_metrics_match_sklearn_and_scipy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 400))
        gold, pred = rng.integers(0, 2, n), rng.integers(0, 2, n)
        assert glue.accuracy(pred, gold) == pytest.approx(sk.accuracy_score(gold, pred), abs=1e-9)
        assert glue.f1(pred, gold) == pytest.approx(sk.f1_score(gold, pred), abs=1e-9)
        assert glue.mcc(pred, gold) == pytest.approx(sk.matthews_corrcoef(gold, pred), abs=1e-9)
        gold3, pred3 = rng.integers(0, 3, n), rng.integers(0, 3, n)
        assert glue.mcc(pred3, gold3) == pytest.approx(sk.matthews_corrcoef(gold3, pred3), abs=1e-9)
        x, y = rng.normal(size=n), rng.normal(size=n) + 0.3 * np.arange(n) / n
        assert glue.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-9)
        ties_x, ties_y = rng.integers(0, 6, n).astype(float), rng.integers(0, 6, n) / 5
        assert glue.spearman(ties_x, ties_y) == pytest.approx(stats.spearmanr(ties_x, ties_y)[0], abs=1e-9)
    assert glue.mcc([1, 1, 1], [1, 1, 1]) == 0.0 and glue.f1([0, 0], [0, 0]) == 0.0  # sklearn's conventions


def tiny_setup():
    from cram.data import make_encoding
    ranks = {bytes([b]): b for b in range(256)}
    special = {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 259}
    return make_encoding(ranks, special), special


def test_a_field_of_any_size_is_read_and_truncated_like_any_other(tmp_path, monkeypatch):
    """csv's field limit (128 kB) is no limit here: a 200,000-word sentence and a 10 MB line without
    a space load, and encode to max_len as a short one does (CoLA: a file without a header)."""
    for task, folder, header, row in (
            ("rte", "RTE", "index\tsentence1\tsentence2\tlabel\n", "0\t{}\tA short one.\tentailment\n"),
            ("cola", "CoLA", "", "src\t1\t\t{}\n")):
        for text in ("word " * 200_000, "x" * 10_000_000):
            shutil.copytree(os.path.join(FIXTURES, folder), tmp_path / folder, dirs_exist_ok=True)
            (tmp_path / folder / "train.tsv").write_text(header + row.format(text))
            monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
            texts, labels = glue.load_task(task)["train"]
            assert len(texts) == 1 and max(map(len, texts[0])) == len(text) and labels[0] == 1 - (task == "rte")
    enc, special = tiny_setup()
    (ids,) = glue.encode_examples(enc, [("x" * 10_000_000, "b")], 32, special)
    assert len(ids) == 32 and ids.count(ord("b")) == 1


def test_a_stop_says_which_runs_were_kept(tmp_path, monkeypatch):
    """The stop line's 'kept' is worked out when the stop comes: none yet, or how many and where."""
    monkeypatch.setattr(glue, "out_json", str(tmp_path / "glue.json"))
    assert glue.kept_runs().startswith("no fine-tuning run had finished, so nothing was written")
    run = tmp_path / "glue_runs" / "tasks" / "rte" / "seed0.json"
    run.parent.mkdir(parents=True)
    run.write_text("{}")
    assert glue.kept_runs() == f"the 1 run(s) finished so far are in {tmp_path / 'glue.json'}; run the same command to do the rest"


def test_encoding_truncates_longest_first():
    enc, special = tiny_setup()
    (ids,) = glue.encode_examples(enc, [("a" * 100, "b" * 10)], 32, special)
    assert len(ids) == 32 and ids[0] == 257 and ids[-1] == 258
    assert ids.count(ord("b")) == 10 and ids.count(ord("a")) == 32 - 3 - 10
    (short,) = glue.encode_examples(enc, [("hi",)], 32, special)
    assert short == [257, ord("h"), ord("i"), 258]
    (three,) = glue.encode_examples(enc, [("a" * 50, "bb", "c" * 20)], 32, special)  # each text closed by its [SEP]
    assert three == [257] + [ord("a")] * 13 + [258] + [ord("b")] * 2 + [258] + [ord("c")] * 13 + [258]


def test_padding_does_not_change_the_logits(monkeypatch):
    enc, special = tiny_setup()
    torch.manual_seed(0)
    model = SequenceClassifier(CrammedBert(vocab_size=260, seq_len=64, n_layers=2, d_model=32, n_heads=2, d_ffn=64),
                               num_labels=3).eval()
    encoded = glue.encode_examples(enc, [("short one", "x"), ("a much longer first sentence here", "and more")],
                                   64, special)
    alone = model(*glue.collate(encoded[:1], 256, torch.device("cpu")))
    ids, mask = glue.collate(encoded, 256, torch.device("cpu"))
    assert ids.shape[1] > len(encoded[0]) and not mask[0].all()
    torch.testing.assert_close(model(ids, mask)[:1], alone, rtol=1e-5, atol=1e-6)
    # predict() sorts by length and batches: the answers come back in input order, padding or not
    encoded = glue.encode_examples(enc, [("x" * n,) for n in (40, 3, 17, 9, 25)], 64, special)
    expected = [model(torch.tensor([ids]))[0, 0].item() for ids in encoded]
    assert len(set(expected)) == len(expected)
    for batch in (1, 2, 5):
        monkeypatch.setattr(glue, "eval_batch_size", batch)
        got = glue.predictions_of(model, encoded, 256, runtime.setup("cpu", "float32", compile=False), True)
        assert got == pytest.approx(expected, abs=1e-5)


def test_length_grouped_batches_cover_each_example_once_with_less_padding():
    rng = random.Random(0)
    lengths = [rng.choice((5, 8, 12, 30, 60, 128)) + rng.randrange(5) for _ in range(3000)]

    def epoch(grouped, seed=0):
        return glue.train_batches(lengths, 16, torch.Generator().manual_seed(seed), grouped)

    def padded(batches):
        return sum(len(rows) * max(lengths[i] for i in rows) for rows in batches)
    grouped, shuffled = epoch(True), epoch(False)
    for batches in (grouped, shuffled):  # every example once, as many steps as before (steps_per_epoch holds)
        assert sorted(i for rows in batches for i in rows) == list(range(len(lengths)))
        assert len(batches) == -(-len(lengths) // 16) and sum(len(rows) != 16 for rows in batches) == 1
    assert sum(lengths) / padded(grouped) > 0.9 > 0.6 > sum(lengths) / padded(shuffled)
    assert epoch(True) == grouped and epoch(True, seed=1) != grouped  # a pure function of the seed
    first_long = [max(lengths[i] for i in rows) > 100 for rows in grouped[:len(grouped) // 2]]
    assert 0.1 < np.mean(first_long) < 0.5  # the long batches are spread over the epoch, not bunched


def test_majority_class_is_the_floor():
    """Every dev example given the training set's most frequent label (STS-B: its mean score)."""
    mrpc = {"train": ([("a", "b")] * 3, [1, 1, 0]), "mrpc": ([("x", "y")] * 4, [1, 0, 1, 1])}
    assert glue.majority_scores("mrpc", mrpc) == {"mrpc": {"f1": pytest.approx(100 * 6 / 7), "accuracy": 75.0}}
    stsb = {"train": ([("a", "b")] * 3, [1.0, 2.0, 4.5]), "stsb": ([("x", "y")] * 3, [0.0, 2.5, 5.0])}
    assert glue.majority_scores("stsb", stsb) == {"stsb": {"pearson": 0.0, "spearman": 0.0}}  # a constant: no correlation


def marker_task(tmp_path, marker="dog"):
    """SST-2 layout; the label says whether the marker word occurs (in half of the sentences)."""
    rng = random.Random(0)
    others = [s for s in SUBJECTS if marker not in s]

    def rows(n):
        out = []
        for i in range(n):
            subject = f"a {marker}" if i % 2 else rng.choice(others)
            words = f"{subject} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)} ."
            out.append(f"{words}\t{i % 2}")
        return ["sentence\tlabel"] + out
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text("\n".join(rows(480)) + "\n")
    (tmp_path / "SST-2" / "dev.tsv").write_text("\n".join(rows(200)) + "\n")
    return tmp_path


def median_cell(group, task="sst2", metric="accuracy"):
    """A table's cell for a task of glue.json's `group`: the median over seeds, and their lowest and highest beside it."""
    low, high = group[task]["spread"][task][metric]
    return f"{group[task]['median'][task][metric]:.1f}" + (f" [{low:.1f}-{high:.1f}]" if low != high else "")


def test_finetuning_learns_a_marker_word(pretrained, tmp_path):
    glue_dir = marker_task(tmp_path)
    out = tmp_path / "glue.json"
    proc = run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={glue_dir}", "--tasks=sst2",
                      "--lr=1e-3", "--batch_size=16", "--epochs=5", f"--out_json={out}", "--seeds=3", "--device=cpu")
    results = json.loads(out.read_text())
    per_seed = [run["sst2"]["accuracy"] for run in results["tasks"]["sst2"]["per_seed"]]
    assert results["tasks"]["sst2"]["seeds"] == [0, 1, 2] and len(per_seed) == 3
    assert results["tasks"]["sst2"]["median"]["sst2"]["accuracy"] == sorted(per_seed)[1] >= 90.0
    assert results["tasks"]["sst2"]["spread"]["sst2"]["accuracy"] == [min(per_seed), max(per_seed)]  # beside the median
    fits = [json.loads(f.read_text())["fit"]["accuracy"] for f in (tmp_path / "glue_runs" / "tasks" / "sst2").glob("*.json")]
    assert len(fits) == 3 and results["tasks"]["sst2"]["fit"] == {"accuracy": sorted(fits)[1]} and min(fits) >= 90.0
    assert f"accuracy {sorted(per_seed)[1]:.1f}, train {sorted(fits)[1]:.1f} (median of 3 seeds" in proc.stdout
    assert "| sst2 | accuracy (median of 3 seeds, 5 epochs) |" in proc.stdout and "| 92.0 |" in proc.stdout
    assert results["tasks"]["sst2"]["majority"] == {"sst2": {"accuracy": 50.0}}  # half the sentences have the marker
    # the no-pretraining column is there, not yet measured, and the output says how to measure it
    assert re.search(rf"^\| sst2 \| accuracy \(median of 3 seeds, 5 epochs\) \| {re.escape(median_cell(results['tasks']))} \| - \| "
                     r"100.0 \| 50.0 \| 92.0 \|$", proc.stdout, re.M)  # words alone reads the marker word too
    assert "--from_scratch=True" in proc.stdout.splitlines()[-1] and results["tasks"]["sst2"]["protocol"] == "fixed"
    assert "Dev sets; sst2: settings fixed before any look at dev (docs/glue.md)." in proc.stdout  # the protocol, said
    assert "Heads: sst2: each text's mean apart, [u, v, |u - v|, u * v]." in proc.stdout  # the default head, said
    assert results["scores"] == {"sst2": results["tasks"]["sst2"]["median"]["sst2"]["accuracy"]}
    assert results["majority"] == {"sst2": 50.0}
    pretraining = results["pretraining"]  # what the plot against compute reads
    assert pretraining["tokens"] > 0 and pretraining["flops"] == pretraining["tokens"] * pretraining["flops_per_token"]
    # the checkpoint as a point of the picture of GLUE against compute, beside the published rows
    points, picture = tmp_path / "points.json", tmp_path / "glue.png"
    table = run_script("tools/glue_plot.py", f"--add={out}", "--label=tiny", f"--points={points}",
                       f"--png={picture}").stdout
    assert ("| task | tiny | words alone | majority class | BERT-Tiny (2x128), test | BERT-Mini (4x256), test | BERT-Small (4x512), test "
            "| BERT-base, no pretraining, dev |") in table
    assert re.search(rf"^\| sst2 \| {sorted(per_seed)[1]:.1f} \| 100.0 \| 50.0 \| 83.2 \| 85.9 \| 89.7 \| 79.9 \|$", table, re.M)
    assert re.search(r"^- tiny: 2x64, vocabulary 384, [\d.]+M tokens in [\d.]+ h, [\d.]+e\+\d+ FLOPs, val loss [\d.]+ "
                     r"\(accuracy [\d.]+\); fine-tuned sst2: median of 3 seeds, 5 epochs$", table, re.M), table
    assert picture.read_bytes()[:4] == b"\x89PNG" and [p["label"] for p in json.loads(points.read_text())] == ["tiny"]
    entry = results["tasks"]["sst2"]  # the speed of fine-tuning, and how much of it padding took
    assert entry["train_seconds"] > 0 and 0 < entry["tokens"] <= entry["padded_tokens"]
    assert entry["tokens"] > 3 * 5 * 480 * 5  # 3 seeds x 5 epochs x 480 sentences of 5+ tokens
    assert f"{entry['tokens'] / entry['train_seconds']:,.0f} tokens/s" in proc.stdout


def spy_on_start_weights(monkeypatch):
    """A list that gets a copy of each fine-tuned encoder's weights as its classifier is built: where it started."""
    starts = []

    class Spy(SequenceClassifier):
        def __init__(self, encoder, *args, **kwargs):
            starts.append({k: v.clone() for k, v in encoder.state_dict().items()})
            super().__init__(encoder, *args, **kwargs)
    monkeypatch.setattr(glue, "SequenceClassifier", Spy)
    return starts


def test_the_no_pretraining_control_starts_from_a_fresh_encoder_of_the_checkpoints_shape(pretrained, monkeypatch):
    """--from_scratch=True: the encoder fine-tuned is a fresh initialisation of the checkpoint's
    shape, seeded by the fine-tuning seed as the head is; without it, the checkpoint's weights."""
    from cram.files import load_checkpoint
    from model import saved_model_args
    ckpt = load_checkpoint(str(pretrained))
    start_weights = spy_on_start_weights(monkeypatch)
    cls, sep = ckpt["meta"]["special_ids"]["[CLS]"], ckpt["meta"]["special_ids"]["[SEP]"]
    encoded = {"train": ([[cls, 5, sep], [cls, 6, 7, sep]], [0, 1]), "rte": ([[cls, 5, sep]], [0])}
    rt = runtime.setup("cpu", "float32", compile=False)
    for pretrained_encoder in (True, False):
        out = glue.finetune("rte", encoded, ckpt, 3, rt, dict(batch_size=16, lr=4e-5, epochs=1),
                            ckpt["model"] if pretrained_encoder else None)
        assert 0.0 <= out["scores"]["rte"]["accuracy"] <= 100.0 and out["fit"]["accuracy"] in (0.0, 50.0, 100.0)
    torch.manual_seed(3)
    fresh = CrammedBert(**{**saved_model_args(ckpt["model_args"]), "dropout": glue.dropout}).state_dict()
    loaded, scratch = start_weights
    assert set(loaded) == set(scratch) == set(fresh) == set(ckpt["model"])
    for name in fresh:
        assert torch.equal(loaded[name], ckpt["model"][name]) and torch.equal(scratch[name], fresh[name]), name
    assert sum(not torch.equal(fresh[n], ckpt["model"][n]) for n in fresh) > len(fresh) // 2  # pretraining moved them


def test_the_fit_samples_the_whole_training_file(pretrained, monkeypatch):
    """A run's fit scores TRAIN_SCORED training examples spread over the file, every k-th: a file sorted by label (or by
    source) still gives each label its share, where its first rows would hold one label."""
    from cram.files import load_checkpoint
    ckpt = load_checkpoint(str(pretrained))
    cls, sep = ckpt["meta"]["special_ids"]["[CLS]"], ckpt["meta"]["special_ids"]["[SEP]"]
    train = [[cls, 10 + i, sep] for i in range(9)]
    encoded = {"train": (train, [0] * 5 + [1] * 4), "rte": ([[cls, 5, sep]], [0])}  # sorted by label
    seen, predict = [], glue.predictions_of
    monkeypatch.setattr(glue, "TRAIN_SCORED", 3)
    monkeypatch.setattr(glue, "predictions_of", lambda model, ids, *a: seen.append(ids) or predict(model, ids, *a))
    glue.finetune("rte", encoded, ckpt, 0, runtime.setup("cpu", "float32", compile=False),
                  dict(batch_size=4, lr=1e-4, epochs=1), ckpt["model"])
    assert seen[-1] == [train[0], train[3], train[6]]  # 9 examples, 3 scored: every 3rd, both labels among them


def test_the_no_pretraining_floor_sits_beside_the_scores(pretrained, tmp_path):
    """The control goes into the same glue.json, beside the model's scores (which it keeps), and
    into the same table, the picture's table and the model card; each is resumed on its own."""
    glue_dir = marker_task(tmp_path)
    out = tmp_path / "glue.json"
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={glue_dir}", "--tasks=sst2", "--epochs=1",
            "--seeds=2", "--max_train_examples=96", "--device=cpu", f"--out_json={out}"]
    run_script(*args)
    proc = run_script(*args, "--from_scratch=True")
    assert "fine-tuning a never-pretrained encoder of the shape of" in proc.stdout
    assert "(auto: as the run it continues)" in proc.stdout  # the scores' precision, not a new timing's
    results = json.loads(out.read_text())
    ours, floor = (results[group]["sst2"]["median"]["sst2"]["accuracy"] for group in ("tasks", "no_pretraining"))
    assert results["tasks"]["sst2"]["seeds"] == results["no_pretraining"]["sst2"]["seeds"] == [0, 1]
    assert results["scores"] == {"sst2": ours} and results["no_pretraining_scores"] == {"sst2": floor}
    assert results["average"] == ours and results["no_pretraining_average"] == floor
    # the precision that ran, not "auto": seeds fine-tuned in two precisions are never merged as one
    precisions = [results[g]["sst2"]["settings"]["dtype"] for g in ("tasks", "no_pretraining")]
    assert precisions[0] == precisions[1] in ("float32", "bfloat16")  # decided once for the command
    # the same settings as the scores it is the floor of: the rule's by the width (64), the given epochs as given
    picked = [{k: results[g]["sst2"]["settings"][k] for k in ("batch_size", "lr", "epochs")} for g in ("tasks", "no_pretraining")]
    assert picked[0] == picked[1] == dict(batch_size=32, lr=3e-4, epochs=1), picked
    assert "sst2: batch 32, lr 0.0003, 1 epoch (by the encoder's width and the task's size; given: epochs)" in proc.stdout
    words = results["words_alone_scores"]["sst2"]  # the marker word alone decides the label: words alone reads it
    assert words > 90 and results["words_alone"]["sst2"]["sst2"]["accuracy"] == words == results["words_alone_average"]
    assert f"| average (1 of 9) | | {ours:.1f} | {floor:.1f} | {words:.1f} | 50.0 | 92.0 |" in proc.stdout
    row = (rf"^\| sst2 \| accuracy \(median of 2 seeds, 1 epoch, first 96 train examples\) \| "
           rf"{re.escape(median_cell(results['tasks']))} \| {re.escape(median_cell(results['no_pretraining']))} \| {words:.1f} \| 50.0 \| 92.0 \|$")
    assert re.search(row, proc.stdout, re.M) and re.search(row, results["table"], re.M)
    assert "--from_scratch=True" not in proc.stdout.splitlines()[-1]  # measured: no hint
    again = run_script(*args, "--from_scratch=True")  # each group resumes on its own: nothing to redo
    assert "sst2: done earlier" in again.stdout
    assert {g: json.loads(out.read_text())[g] for g in ("tasks", "no_pretraining")} == \
        {g: results[g] for g in ("tasks", "no_pretraining")}
    # three seeds of the model, two of the control: the floor's cell says how it was made
    proc = run_script(*args[:5], "--seeds=3", *args[6:])
    assert re.search(rf"^\| sst2 \| accuracy \(median of 3 seeds, 1 epoch, first 96 train examples\) \| [^|]+ \| "
                     rf"{re.escape(median_cell(results['no_pretraining']))} \(median of 2 seeds, 1 epoch, first 96 train "
                     rf"examples\) \| {words:.1f} \| 50.0 \| 92.0 \|$", proc.stdout, re.M)
    # a task with only the control: its row shows the floor alone
    run_script(*args[:3], "--tasks=mrpc", *args[4:], "--seeds=1", f"--glue_dir={FIXTURES}", "--from_scratch=True")
    results = json.loads(out.read_text())
    assert "mrpc" in results["no_pretraining"] and "mrpc" not in results["tasks"]
    assert re.search(r"^\| mrpc \| F1 \(1 seed, 1 epoch, first 4 train examples\) \| - \| [\d.]+ \(accuracy [\d.]+\) \| [\d.]+ \([\d.]+\) \| [\d.]+ \([\d.]+\) \| 88.9 \|$",
                     results["table"], re.M)
    # the picture's table: the floor as a column; its line is drawn where it covers the average's tasks
    points, picture = tmp_path / "points.json", tmp_path / "glue.png"
    table = run_script("tools/glue_plot.py", f"--add={out}", "--label=tiny", f"--points={points}", f"--png={picture}").stdout
    assert re.search(r"^\| task \| tiny \| no pretraining, 2x64, vocabulary 384 \(measured\) \| words alone \| majority class \|", table, re.M)
    assert re.search(rf"^\| sst2 \| [\d.]+ \| {floor:.1f} \| {words:.1f} \| 50.0 \|", table, re.M)
    assert re.search(rf"^\| average of 1 \| [\d.]+ \| {floor:.1f} \| {words:.1f} \| 50.0 \|", table, re.M)  # sst2: the one task in common
    assert picture.read_bytes()[:4] == b"\x89PNG"
    # another file's point under a label already there replaces it, and says so
    (tmp_path / "copy.json").write_text(out.read_text())
    again = run_script("tools/glue_plot.py", f"--add={tmp_path / 'copy.json'}", "--label=tiny", f"--points={points}",
                       "--png=").stdout
    assert f"replacing the point 'tiny' of {out}" in again and len(json.loads(points.read_text())) == 1


def test_words_alone_reads_a_single_text_and_what_a_pair_shares(tmp_path, monkeypatch):
    """The bag-of-words baseline on tiny tasks: a marker word in one sentence (SST-2's layout), and a pair whose label
    is whether its two sentences share their subject (STS-B's layout, a score): no word decides that alone, so only
    the pair's shared words do. Fitted again only for other data; without scikit-learn, None and no file."""
    rng = random.Random(0)
    marker_task(tmp_path)
    rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    for i in range(400):
        a, b = rng.sample(SUBJECTS, 2)
        second = a if i % 2 else b
        rows.append(f"{i}\tx\tx\tx\tx\tx\tx\t{a} {rng.choice(VERBS)} .\t{second} {rng.choice(VERBS)} .\t{5.0 * (i % 2)}")
    (tmp_path / "STS-B").mkdir()
    for split, part in (("train", rows[:301]), ("dev", rows[:1] + rows[301:])):
        (tmp_path / "STS-B" / f"{split}.tsv").write_text("\n".join(part) + "\n")
    monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
    for name, metric, above in (("sst2", "accuracy", 95), ("stsb", "pearson", 90)):
        data = glue.load_task(name)
        scores = glue.words_alone(name, data)
        assert scores[name][metric] > above, scores
        path = str(tmp_path / "glue.json")
        assert glue.kept_words_alone(path, name, data) == scores == glue.read_words_alone(path)[name]
        monkeypatch.setattr(glue, "words_alone", lambda *a: pytest.fail("fitted again for the same data"))
        assert glue.kept_words_alone(path, name, data) == scores
        monkeypatch.undo()
        kept = tmp_path / "glue_runs" / "words_alone" / f"{name}.json"
        kept.write_text("{cut")  # damaged: set aside for a look, and fitted again
        assert glue.kept_words_alone(path, name, data) == scores and (tmp_path / "glue_runs" / "words_alone" / f"{name}.json.damaged").exists()
        monkeypatch.setattr(glue, "glue_dir", str(tmp_path))
    for module in [m for m in sys.modules if m.split(".")[0] == "sklearn"]:  # not installed: each import fails
        monkeypatch.setitem(sys.modules, module, None)
    assert glue.words_alone("sst2", glue.load_task("sst2")) is None


def test_a_baseline_that_cannot_be_fitted_is_a_dash_with_its_reason_not_the_end_of_the_run(pretrained, tmp_path, monkeypatch):
    """Issue 100, class 4. Named: words alone on a task whose texts are one-letter words (scikit-learn's "empty
    vocabulary" ended the run in a traceback before any fine-tuning): the run fine-tunes and scores, its line says
    '-' and why, the table shows '-'. Unnamed: a fit that runs out of memory (MNLI on a small machine) is the same
    line; a task whose training labels are all one class is fitted (the one label is all words can say)."""
    (tmp_path / "SST-2").mkdir()
    for split in ("train", "dev"):
        rows = "".join(f"{c} {c} x\t{i % 2}\n" for i, c in enumerate("abcd"))  # words of one letter
        (tmp_path / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    proc = run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}", "--tasks=sst2",
                      "--epochs=1", "--seeds=1", "--device=cpu", f"--out_json={tmp_path / 'glue.json'}")
    assert "sst2 - (not fitted: ValueError: empty vocabulary" in proc.stdout and "sst2: accuracy" in proc.stdout
    assert re.search(r"^\| sst2 \| accuracy .* \| - \| 50.0 \| 92.0 \|$", proc.stdout, re.M), proc.stdout
    (tmp_path / "marker").mkdir()
    monkeypatch.setattr(glue, "glue_dir", str(marker_task(tmp_path / "marker")))
    data = glue.load_task("sst2")
    ones = dict(data, train=(data["train"][0], [1] * len(data["train"][1])))
    assert glue.kept_words_alone(str(tmp_path / "ones.json"), "sst2", ones)["sst2"]["accuracy"] == 100 * np.mean(
        np.array(data["sst2"][1]) == 1)
    from sklearn.feature_extraction.text import TfidfVectorizer

    def out_of_memory(*args):
        raise MemoryError()
    monkeypatch.setattr(TfidfVectorizer, "fit_transform", out_of_memory)
    assert glue.kept_words_alone(str(tmp_path / "oom.json"), "sst2", data) == "not fitted: MemoryError"
    assert not (tmp_path / "oom_runs").exists()


def test_an_older_glue_json_without_words_alone_is_read(tmp_path):
    """A glue.json written before the column: the table shows '-' there, glue_plot adds it as a point."""
    entry = dict(median={"rte": {"accuracy": 60.0}}, spread={"rte": {"accuracy": [59.0, 61.0]}}, majority={"rte": {"accuracy": 50.0}},
                 settings=dict(epochs=3, max_train_examples=0, lr=1e-4, batch_size=32), seeds=[0, 1], train_examples=2490)
    markdown, averages, counted = glue.table({"tasks": {"rte": entry}, "no_pretraining": {}})
    assert "| rte | accuracy (median of 2 seeds, 3 epochs) | 60.0 [59.0-61.0] | - | - | 50.0 | 58.5 |" in markdown
    assert math.isnan(averages["words_alone"]) and averages["ours"] == 60.0 and counted == ["rte"]
    old = dict(scores={"rte": 60.0}, majority={"rte": 50.0}, tasks={"rte": dict(entry, how="median of 2 seeds, 3 epochs")},
               pretraining=dict(shape="2x64", vocab_size=384, tokens=1000, hours=0.1, flops=1e12))
    (tmp_path / "glue.json").write_text(json.dumps(old))
    table = run_script("tools/glue_plot.py", f"--add={tmp_path / 'glue.json'}", "--label=old",
                       f"--points={tmp_path / 'points.json'}", "--png=").stdout
    assert re.search(r"^\| rte \| 60.0 \| - \| 50.0 \|", table, re.M), table


def test_glue_plot_refuses_what_is_not_a_result(tmp_path):
    points = tmp_path / "points.json"
    args = ["tools/glue_plot.py", f"--points={points}", "--png="]
    (tmp_path / "other.json").write_text('{"tasks": {}}')
    (tmp_path / "control.json").write_text(json.dumps({"tasks": {}, "no_pretraining": {}, "scores": {}, "pretraining": {
        "tokens": 1, "flops": 1}}))
    for extra, message in [(["--add=missing.json"], "no file missing.json"),
                           ([f"--add={tmp_path / 'control.json'}"], "holds no pretrained model's scores"),
                           ([f"--add={tmp_path / 'other.json'}"], "is not a glue.json with scores and pretraining facts"),
                           ([f"--add={tmp_path / 'other.json'},{tmp_path / 'other.json'}", "--label=a"], "one label per file"),
                           ([], f"no points in {points}"),
                           ([f"--points={tmp_path / 'other.json'}"], "is not a points file")]:
        assert_one_line_error(run_script(*args, *extra, check=False), message)
    assert not points.exists()  # nothing written by a refused command


def test_glue_plot_joins_one_checkpoint_s_files_and_names_a_head_other_than_the_pair_head(tmp_path):
    """A call that fine-tuned each task, and the control, into a file of its own: '+' makes them one point. A point and a
    floor fine-tuned with the first-token head say so in the table; the pair head's, the default, need not. Files of
    two checkpoints are refused."""
    facts = dict(shape="2x64", vocab_size=384, tokens=1000, hours=0.1, flops=1e12)

    def result(name, pooling, scores=None, control=None, pretraining=facts):
        def runs(tasks):
            return {t: dict(how="1 seed, 3 epochs", settings=dict(pooling=pooling)) for t in tasks}
        (tmp_path / name).write_text(json.dumps(dict(
            scores=scores or {}, tasks=runs(scores or {}), no_pretraining_scores=control or {},
            no_pretraining=runs(control or {}), majority={"rte": 50.0, "sst2": 50.0}, pretraining=pretraining)))
        return str(tmp_path / name)
    rte, sst2 = result("rte.json", "pair", {"rte": 60.0}), result("sst2.json", "pair", {"sst2": 80.0})
    floor = result("floor.json", "pair", control={"rte": 55.0, "sst2": 70.0})
    first = result("first.json", "first", {"rte": 52.0, "sst2": 79.0}, control={"rte": 50.0, "sst2": 71.0})
    points = tmp_path / "points.json"
    table = run_script("tools/glue_plot.py", f"--add={rte}+{sst2}+{floor},{first}", "--label=pair,first",
                       f"--points={points}", f"--png={tmp_path / 'glue.png'}").stdout
    assert ("| task | pair | first (first-token head) | no pretraining, 2x64, vocabulary 384 (measured) | no pretraining, "
            "2x64, vocabulary 384, first-token head (measured) | words alone | majority class |") in table
    assert re.search(r"^\| rte \| 60.0 \| 52.0 \| 55.0 \| 50.0 \| - \| 50.0 \|", table, re.M), table
    assert re.search(r"^- pair: .*; fine-tuned rte, sst2: 1 seed, 3 epochs$", table, re.M), table
    assert re.search(r"^- first: .*; fine-tuned rte, sst2: 1 seed, 3 epochs, first-token head$", table, re.M), table
    saved = {p["label"]: p for p in json.loads(points.read_text())}
    assert saved["pair"]["source"] == f"{rte}+{sst2}+{floor}" and saved["first"]["heads"] == {"rte": "first", "sst2": "first"}
    other = result("other.json", "pair", {"mrpc": 70.0}, pretraining=dict(facts, tokens=2000))
    assert_one_line_error(run_script("tools/glue_plot.py", f"--add={rte}+{other}", f"--points={points}", "--png=",
                                     check=False), "joins the glue.json files of different checkpoints")


def test_bad_input_errors(pretrained, tmp_path):
    args = [f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}"]
    assert_one_line_error(run_script("finetune_glue.py", *args, "--tasks=rte,squad", check=False), "unknown task 'squad'")
    assert_one_line_error(run_script("finetune_glue.py", "--checkpoint=nowhere/ckpt.pt", f"--glue_dir={FIXTURES}",
                              "--tasks=rte", check=False), "checkpoint not found")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}",
                              "--tasks=rte", check=False), "no folder", "RTE")
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("premise\thypothesis\tlabel\nA\tB\tentailment\n")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}",
                              "--tasks=rte", check=False), "not in the GLUE layout", "sentence1")
    (tmp_path / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA\tB\tmaybe\n")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}",
                              "--tasks=rte", check=False), "label 'maybe'")
    (tmp_path / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA\tB\tentailment\n")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}",
                              "--tasks=rte", check=False), "GLUE file not found", "dev.tsv")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={pretrained}", "--tasks=rte", check=False),
                   "cannot be reached", "--glue_dir")
    ckpt = torch.load(pretrained, weights_only=False)
    ckpt["tokenizer"] = "\n".join(ckpt["tokenizer"].splitlines()[:300])  # another, smaller vocabulary
    torch.save(ckpt, tmp_path / "mixed.pt")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={tmp_path / 'mixed.pt'}", f"--glue_dir={FIXTURES}",
                              "--tasks=rte", check=False), "two vocabularies")
    (tmp_path / "junk.pt").write_bytes(b"\x00junk")
    assert_one_line_error(run_script("finetune_glue.py", f"--checkpoint={tmp_path / 'junk.pt'}", f"--glue_dir={FIXTURES}",
                              "--tasks=rte", check=False), "not a readable checkpoint")


def test_predictions_for_the_glue_server_come_from_each_task_s_median_seed(pretrained, tmp_path):
    """--predict=True: the server's 11 files (the nine tasks, MNLI's two test sets and AX, the diagnostic set, which
    MNLI's model scores) in <glue>_test/, each a header and every test example's index, in its file's order, with a
    label's name (STS-B: a score on its 0-5 scale), from the seed whose dev score is the median; the floor makes none."""
    out, test = tmp_path / "glue.json", tmp_path / "glue_test"
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}", "--epochs=1", "--device=cpu",
            f"--out_json={out}", "--predict=True"]
    run_script(*args[:-1], "--tasks=rte", "--seeds=3")  # scored earlier without predictions: seed 0 alone is redone
    run_script(*args, "--tasks=rte,mnli", "--seeds=1")
    seed0 = next((tmp_path / "glue_runs" / "tasks" / "rte").glob("seed0-*.test")) / "RTE.tsv"
    assert (test / "RTE.tsv").read_text() == seed0.read_text()  # the median of the seeds predicted, not a seed without
    proc = run_script(*args, "--tasks=rte,mnli", "--seeds=3")
    assert f"wrote {test}: the test sets' predictions" in proc.stdout and "these are missing: CoLA, SST-2, MRPC" in proc.stdout
    runs = json.loads(out.read_text())["tasks"]["rte"]["per_seed"]
    median_seed = sorted(range(3), key=lambda s: (runs[s]["rte"]["accuracy"], s))[1]
    seeds_file = next((tmp_path / "glue_runs" / "tasks" / "rte").glob(f"seed{median_seed}-*.test")) / "RTE.tsv"
    assert (test / "RTE.tsv").read_text() == seeds_file.read_text()
    proc = run_script(*args, "--tasks=cola,sst2,mrpc,stsb,qqp,qnli,rte,wnli", "--seeds=1")
    assert "missing" not in proc.stdout and (test / "RTE.tsv").read_text() == seeds_file.read_text()  # the 3 seeds' median
    allowed = dict(MNLI=("entailment", "neutral", "contradiction"), AX=("entailment", "neutral", "contradiction"),
                   QNLI=("entailment", "not_entailment"), RTE=("entailment", "not_entailment"))
    sources = dict(AX="diagnostic/diagnostic.tsv", **{"MNLI-m": "MNLI/test_matched.tsv", "MNLI-mm": "MNLI/test_mismatched.tsv"})
    assert sorted(p.name for p in test.iterdir()) == sorted(f"{f}.tsv" for f in ("CoLA", "SST-2", "MRPC", "STS-B", "QQP",
                                                                                "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI", "AX"))
    for file in test.iterdir():
        name = file.stem
        header, *rows = file.read_text().splitlines()
        source = open(os.path.join(FIXTURES, sources.get(name, f"{name}/test.tsv")), encoding="utf-8").read().splitlines()
        assert header == "index\tprediction" and [r.split("\t")[0] for r in rows] == [line.split("\t")[0] for line in source[1:]]
        for value in (r.split("\t")[1] for r in rows):
            if name == "STS-B":
                assert 0.0 <= float(value) <= 5.0 and re.fullmatch(r"\d\.\d{3}", value), value
            else:
                assert value in allowed.get(name.split("-")[0], ("0", "1")), (name, value)
    floor = run_script(*args, "--tasks=rte", "--seeds=1", "--from_scratch=True").stdout
    assert "the floor writes no test-set predictions" in floor and not list((tmp_path / "glue_runs" / "no_pretraining").rglob("*.test"))


def test_the_grid_protocol_reports_each_task_s_best_on_dev_and_says_so(pretrained, tmp_path):
    """--protocol=grid: every rate and batch of the grid per task, the floor on the same grid, and each task's entry the
    setting with the best median on dev, its row saying 'best of N on dev' and which; a later fixed command's settings
    are shown again; a grid that is not lists of numbers is one line."""
    out = tmp_path / "glue.json"
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}", "--tasks=rte,stsb", "--epochs=1",
            "--seeds=1", "--device=cpu", f"--out_json={out}", "--protocol=grid", "--grid_lr=1e-3,1e-5,0.001", "--grid_batch=2,4"]
    proc = run_script(*args)  # 0.001 is 1e-3: each point once
    assert "rte, stsb: 4 settings (lr 1e-3,1e-5,0.001 x batch 2,4), 1 epoch" in proc.stdout
    run_script(*args, "--from_scratch=True")
    results = json.loads(out.read_text())
    for group, name, metric in (("tasks", "rte", "accuracy"), ("no_pretraining", "rte", "accuracy"), ("tasks", "stsb", "pearson")):
        files = [json.loads(f.read_text()) for f in (tmp_path / "glue_runs" / group / name).glob("*.json")]
        assert len(files) == 4 and {(f["settings"]["lr"], f["settings"]["batch_size"]) for f in files} == \
            {(1e-3, 2), (1e-3, 4), (1e-5, 2), (1e-5, 4)}
        entry = results[group][name]
        assert entry["median"][name][metric] == max(f["scores"][name][metric] for f in files) and entry["grid_size"] == 4
        assert entry["how"].startswith(f"best of 4 on dev: lr {entry['settings']['lr']:g}, batch {entry['settings']['batch_size']}, 1 seed")
    assert f"| rte | accuracy ({results['tasks']['rte']['how']}) |" in results["table"] and results["tasks"]["rte"]["protocol"] == "grid"
    assert "Dev sets; stsb, rte: each the best of a grid on dev (docs/glue.md)." in results["table"]  # in TASKS order
    fixed = run_script(*args[:-3], "--batch_size=4", "--lr=1e-5")  # one of the grid's settings: done, and shown alone
    assert "rte: done earlier" in fixed.stdout and json.loads(out.read_text())["tasks"]["rte"]["grid_size"] == 0
    assert_one_line_error(run_script(*args[:-1], "--grid_batch=2,x", check=False), "--grid_batch='2,x' must be lists")
    run_script(*args[:4], "--epochs=3", *args[5:])  # the same grid with other epochs: its own best of 4, not of 8
    entry = json.loads(out.read_text())["tasks"]["rte"]
    assert entry["grid_size"] == 4 and entry["settings"]["epochs"] == 3


@pytest.mark.parametrize("first", ["mnli", "stsb"])
def test_task_start_begins_rte_from_the_same_seed_s_fine_tune_of_the_start_task(first, pretrained, tmp_path, monkeypatch,
                                                                                capsys):
    """--protocol=task_start: start_task (MNLI, or STS-B, itself started from nothing) is fine-tuned first (added to the tasks), its encoder kept
    beside its run, and RTE's run of each seed starts from that seed's encoder of it, its settings and row saying so."""
    from configurator import config_keys
    starts = spy_on_start_weights(monkeypatch)
    for key, value in dict(checkpoint=str(pretrained), glue_dir=FIXTURES, tasks="rte", epochs=3, seeds=2, device="cpu",
                           dtype="float32", out_json=str(tmp_path / "glue.json"), protocol="task_start",
                           start_task=first).items():
        monkeypatch.setattr(glue, key, value)
    glue.main(config_keys(vars(glue)))
    assert f"on {first}, rte with 2 seed(s)" in capsys.readouterr().out
    kept = sorted((tmp_path / "glue_runs" / "tasks" / first).glob("seed*.encoder.pt"))
    assert [p.name.split("-")[0] for p in kept] == ["seed0", "seed1"] and len(starts) == 4  # first 0, 1, then rte 0, 1
    for seed, file in enumerate(kept):
        tuned = torch.load(file)
        assert all(torch.equal(starts[2 + seed][k], tuned[k]) for k in tuned)  # rte's start: that seed's first encoder
        assert not all(torch.equal(starts[seed][k], tuned[k]) for k in tuned)  # which the first task's fine-tuning moved
    results = json.loads((tmp_path / "glue.json").read_text())
    assert results["tasks"]["rte"]["settings"]["start_from"].startswith(f"{first} ")
    assert f"from the seed's {glue.TASKS[first]['folder']} fine-tune, median of 2 seeds, 3 epochs" in results["tasks"]["rte"]["how"]


def test_the_settings_follow_the_width_and_the_task_s_size_and_a_given_one_wins():
    """The reference's batch, rate and epochs at its width and above; ELECTRA-Small's at 256 and below (10 epochs on a
    task under 8,000 examples, 3 on a larger one), the rate geometric between; a given (non-zero) setting in its place."""
    for width in (768, 1024):
        for examples in (2490, 67349):
            assert glue.settings_for(width, examples, {}) == dict(batch_size=16, lr=4e-5, epochs=5)
    assert glue.settings_for(256, 2490, {}) == glue.settings_for(128, 2490, {}) == dict(batch_size=32, lr=3e-4, epochs=10)
    assert glue.settings_for(256, 67349, {}) == dict(batch_size=32, lr=3e-4, epochs=3)
    middle = glue.settings_for(512, 5749, {})
    assert middle["batch_size"] == 32 and middle["epochs"] == 10 and 4e-5 < middle["lr"] < 3e-4
    assert middle["lr"] == pytest.approx(4e-5 * 7.5 ** (math.log(1.5) / math.log(3)), rel=0.01)  # geometric in the width
    assert glue.settings_for(512, 5749, dict(lr=1e-3, batch_size=0, epochs=2)) == dict(batch_size=32, lr=1e-3, epochs=2)
    assert glue.settings_for(512, 5749, dict(lr=0.0)) == middle  # 0: by the rule


def test_the_summary_is_made_from_the_run_files_and_a_rerun_with_other_settings_supersedes(tmp_path):
    """glue.json is rebuilt from glue_runs/ after each run: seeds sorted, counts summed, the median over
    the seeds of the latest run's settings (an older run's file stays, left out); a glue.json that is not
    such a summary (an older cram kept its scores there alone) is refused, not replaced."""
    path = str(tmp_path / "glue.json")
    identity = dict(checkpoint="/x/ckpt.pt", checkpoint_step=60, checkpoint_tokens=1000)
    settings = {k: getattr(glue, k) for k in glue.SCORE_SETTINGS}

    def write_run(seed, epochs, accuracy, finished):
        file = tmp_path / "glue_runs" / "tasks" / "rte" / f"seed{seed}.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(dict(
            identity, seed=seed, settings=dict(settings, epochs=epochs), scores={"rte": {"accuracy": accuracy}},
            facts=dict(train_examples=8, dev_examples={"rte": 4}, majority={"rte": {"accuracy": 50.0}}),
            counts=dict(tokens=100, padded_tokens=125, train_seconds=1.0, seconds=2.5), finished=finished)))
    for seed, accuracy in ((2, 75.0), (0, 50.0), (1, 62.5)):
        write_run(seed, 5, accuracy, finished=seed)
    results = glue.write_summary(path, identity, facts={"tokens": 1000})
    entry = results["tasks"]["rte"]
    assert entry["seeds"] == [0, 1, 2] and entry["median"] == {"rte": {"accuracy": 62.5}}
    assert entry["seconds"] == 7.5 and entry["tokens"] == 300 and entry["how"] == "median of 3 seeds, 5 epochs"
    assert results["scores"] == {"rte": 62.5} and results["no_pretraining"] == {} and json.loads(open(path).read()) == results
    write_run(1, 2, 25.0, finished=10)  # seed 1 again with 2 epochs: seeds 0 and 2 (5 epochs) are left out
    entry = glue.write_summary(path, identity, facts={})["tasks"]["rte"]
    assert entry["seeds"] == [1] and entry["median"] == {"rte": {"accuracy": 25.0}} and entry["settings"]["epochs"] == 2
    assert (tmp_path / "glue_runs" / "tasks" / "rte" / "seed0.json").exists()
    # a command asking for 5 epochs again (seed 0) finds it done: nothing to run, and
    # the summary shows what it asked for, not the later 2 epochs
    runs = glue.read_runs(glue.run_files(path), identity)["tasks"]
    assert glue.remaining_seeds({"rte": [dict(settings, epochs=5)]}, 1, runs, path, "tasks", 1) == {}
    # dtype=auto goes on in the latest run's precision; an older cram's files, without the device, leave it open
    assert glue.earlier_precision({"tasks": runs}) is None
    later = dict(runs["rte"][0], device="cpu", settings=dict(settings, dtype="bfloat16"), finished=20)
    older = dict(later, settings=dict(settings, dtype="float32"), finished=15)
    assert glue.earlier_precision({"tasks": runs, "no_pretraining": {"sst2": [later, older]}}) == ("cpu", "bfloat16")
    entry = glue.write_summary(path, identity, facts={})["tasks"]["rte"]
    assert entry["seeds"] == [0, 2] and entry["settings"]["epochs"] == 5
    # a run file of the right keys and wrong types, or in a folder that is no task, is named damaged and set aside
    for where, change in (("rte", dict(finished=None)), ("rte", dict(settings={})), ("squad", {})):
        file = tmp_path / "glue_runs" / "tasks" / where / "seed7.json"
        file.parent.mkdir(exist_ok=True)
        text = json.dumps(dict(json.loads((tmp_path / "glue_runs" / "tasks" / "rte" / "seed0.json").read_text()),
                               seed=7, **change))
        file.write_text(text)
        assert glue.write_summary(path, identity, facts={})["tasks"]["rte"]["seeds"] == [0, 2]  # as without it
        assert not file.exists() and Path(f"{file}.damaged").read_text() == text
        os.remove(f"{file}.damaged")
    glue.check_earlier(path, identity)  # this checkpoint's summary: taken
    # each refusal says what the file holds (issue 93, named: a list was "another checkpoint's scores"; unnamed: another
    # tool's scores, an object), and its advice works: moved away, the command goes on
    for old, held in (({"checkpoint_step": 60, "checkpoint_tokens": 1000, "tasks": {"rte": {}}}, "an older cram's scores"),
                      (dict(results, checkpoint_step=61), "the scores of another checkpoint"),
                      ([1, 2], "JSON of another shape"), ({"cola": 53.3}, "JSON of another shape")):
        (tmp_path / "glue.json").write_text(json.dumps(old))
        with pytest.raises(SystemExit, match=re.escape(f"error: {path} holds {held}")):
            glue.check_earlier(path, identity)
    os.replace(path, path + ".mine")
    glue.check_earlier(path, identity)


def test_reruns_keep_every_run_s_file_and_follow_the_commands_not_the_clock(pretrained, tmp_path):
    """A rerun with other settings (epochs, then the rate) keeps the earlier runs' files beside its own, and
    glue.json shows the latest command's runs, also where the machine's clock was set 2 hours back between
    two commands (a small preloaded module shifts time.time, as a stepped clock does)."""
    behind = tmp_path / "clock"
    behind.mkdir()
    (behind / "sitecustomize.py").write_text("import time\n_real = time.time\ntime.time = lambda: _real() - 7200\n")
    out = tmp_path / "glue.json"

    def finetune(*settings, clock=None):
        env = dict(os.environ, OMP_NUM_THREADS="1", **({"PYTHONPATH": str(clock)} if clock else {}))
        proc = subprocess.run([sys.executable, "finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}",
                               "--tasks=rte", "--seeds=1", "--device=cpu", f"--out_json={out}", *settings], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(out.read_text())["tasks"]["rte"]["settings"]

    assert finetune("--epochs=1")["epochs"] == 1
    assert finetune("--epochs=2", clock=behind)["epochs"] == 2
    assert finetune("--epochs=2", "--lr=1e-4")["lr"] == 1e-4
    assert finetune("--epochs=1", clock=behind)["epochs"] == 1  # done earlier: not run again, but what is shown
    files = sorted(p.name for p in (tmp_path / "glue_runs" / "tasks" / "rte").iterdir())
    assert len(files) == 3 and all(f.startswith("seed0-") for f in files), files


def strict_json(path):
    """A JSON file as a strict reader takes it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} in {path}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_point_is_never_the_best_nor_a_silent_score(pretrained, tmp_path):
    """A grid whose first rate diverges (lr 3e4): the point is said diverged and left out of the choice, where max kept
    the NaN that came first; every run diverged: the task's line says so, its cell is '-', and glue.json has no NaN.
    A classifier that diverges (NaN weights, argmax's class 0: a finite score) is caught too."""
    out = tmp_path / "glue.json"
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={FIXTURES}", "--tasks=stsb,rte", "--seeds=1",
            "--epochs=3", "--device=cpu", "--dtype=float32", f"--out_json={out}"]
    proc = run_script(*args, "--protocol=grid", "--grid_lr=3e4,3e-4,1e-4", "--grid_batch=2")
    results = strict_json(out)
    for name, metric in (("stsb", "pearson"), ("rte", "accuracy")):
        entry = results["tasks"][name]
        assert entry["settings"]["lr"] != 3e4 and entry["grid_size"] == 3 and entry["grid_diverged"] == 1, entry
        assert math.isfinite(entry["median"][name][metric]) and entry["how"].startswith("best of 3 on dev, 1 diverged: lr")
        assert re.search(rf"^{name}: \S+ -?[\d.]+, .*\(best of 3 on dev, 1 diverged: lr 0\.000[13], batch 2, 1 seed",
                         proc.stdout, re.M), proc.stdout
    diverged = [json.loads(f.read_text()) for f in (tmp_path / "glue_runs" / "tasks" / "stsb").glob("*.json")]
    assert [r["diverged"] for r in diverged if r["settings"]["lr"] == 3e4] == [True]
    assert [r["scores"]["stsb"]["pearson"] for r in diverged if r["settings"]["lr"] == 3e4] == [None]
    proc = run_script(*args, "--lr=3e4", "--predict=True")  # every run diverged: said, no score, nothing predicted
    for name in ("stsb", "rte"):
        assert re.search(rf"^{name}: no score: every run diverged: 1 seed, 3 epochs, \d+ s", proc.stdout, re.M), proc.stdout
    assert "| stsb | Pearson (every run diverged: 1 seed, 3 epochs) | - |" in proc.stdout
    results = strict_json(out)
    assert results["tasks"]["stsb"]["median"] == {} and results["scores"] == {} and results["average"] is None
    assert not list((tmp_path / "glue_runs").rglob("*.test"))  # a diverged model's predictions are none
    assert "stsb: done earlier" in run_script(*args, "--lr=3e4", "--predict=True").stdout  # not redone for them


def test_a_diverged_seed_is_left_out_of_the_median_and_the_average(tmp_path):
    """The fixed protocol, one seed of three diverged (an older run's file holds its NaN, a newer one null): the median,
    spread and fit are the other two's, the row says so, the average is finite and glue.json holds no NaN."""
    path, identity = tmp_path / "glue.json", dict(checkpoint="/x/ckpt.pt", checkpoint_step=60, checkpoint_tokens=1000)
    settings = {k: getattr(glue, k) for k in glue.SCORE_SETTINGS}
    for name, seed, pearson in (("stsb", 0, 40.0), ("stsb", 1, float("nan")), ("stsb", 2, 20.0), ("rte", 0, None)):
        file = tmp_path / "glue_runs" / "tasks" / name / f"seed{seed}.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        metrics = glue.TASKS[name]["metrics"]
        file.write_text(json.dumps(dict(
            identity, seed=seed, settings=settings, scores={name: dict.fromkeys(metrics, pearson)},
            fit=dict.fromkeys(metrics, pearson),
            facts=dict(train_examples=8, dev_examples={name: 4}, majority={name: dict.fromkeys(metrics, 0.0)}),
            counts=dict(tokens=100, padded_tokens=125, train_seconds=1.0, seconds=2.5), finished=seed)))
    results = glue.write_summary(str(path), identity, facts={})
    stsb = results["tasks"]["stsb"]
    assert stsb["median"] == {"stsb": {"pearson": 30.0, "spearman": 30.0}}
    assert stsb["spread"]["stsb"]["pearson"] == [20.0, 40.0] and stsb["fit"]["pearson"] == 30.0 and stsb["diverged"] == [1] and stsb["seeds"] == [0, 1, 2]
    assert stsb["how"] == "median of 2 seeds (1 of 3 diverged), 1 epoch" if settings["epochs"] == 1 else \
        stsb["how"].startswith("median of 2 seeds (1 of 3 diverged), ")
    assert results["average"] == 30.0 and results["average_over"] == ["stsb"]  # rte diverged: no score to average
    assert strict_json(path)["tasks"]["stsb"]["per_seed"][1] == {"stsb": {"pearson": None, "spearman": None}}
    assert "| rte | accuracy (every run diverged: 1 seed" in results["table"]
    # a grid whose diverged point comes first, in whatever order its files are read: never its best
    run = json.loads((tmp_path / "glue_runs" / "tasks" / "stsb" / "seed0.json").read_text())
    for points in permutations(((3e4, float("nan")), (3e-4, 10.0), (1e-4, 5.0))):
        entry = glue.task_entry([dict(run, settings=dict(settings, lr=lr), scores={"stsb": dict(pearson=p, spearman=p)},
                                      grid="lr 3e4,3e-4,1e-4 x batch 32", order=1) for lr, p in points])
        assert entry["settings"]["lr"] == 3e-4 and entry["median"]["stsb"]["pearson"] == 10.0 and entry["grid_diverged"] == 1


def rte_rows(n, trimmed=()):
    """An RTE test file of n rows; the rows in `trimmed` have lost their empty last field's tab."""
    return "index\tsentence1\tsentence2\n" + "".join(f"{i}\tA dog sleeps.{'' if i in trimmed else chr(9)}\n" for i in range(n))


def test_no_input_row_is_dropped_unsaid(pretrained, tmp_path):
    """A test row short of a column (an editor trimmed its trailing tab) is a one-line error, where 37 predictions were
    written for 40 rows; AX's diagnostic file too; a short training row is left out and said; a prediction file short
    of a row is refused before it is written."""
    glue_dir = tmp_path / "glue"
    shutil.copytree(FIXTURES, glue_dir)
    args = ["finetune_glue.py", f"--checkpoint={pretrained}", f"--glue_dir={glue_dir}", "--epochs=1", "--seeds=1",
            "--device=cpu", f"--out_json={tmp_path / 'glue.json'}", "--predict=True"]
    (glue_dir / "RTE" / "test.tsv").write_text(rte_rows(40, trimmed=(3, 15, 28)))
    assert_one_line_error(run_script(*args, "--tasks=rte", check=False), f"{glue_dir / 'RTE' / 'test.tsv'}: lines 5, 17, 30",
                          "a test file needs a prediction for every row")
    (glue_dir / "RTE" / "test.tsv").write_text(rte_rows(40))
    assert not (tmp_path / "glue_test").exists()
    diagnostic = glue_dir / "diagnostic" / "diagnostic.tsv"
    diagnostic.write_text(diagnostic.read_text() + "9\n")
    assert_one_line_error(run_script(*args, "--tasks=mnli", check=False), "diagnostic.tsv: line ", "lacks exactly 3 tab-separated fields")
    train = glue_dir / "RTE" / "train.tsv"
    train.write_text(train.read_text() + "7\tA lone premise.\n")
    proc = run_script(*args, "--tasks=rte")
    assert f"{train}: left out 1 of 3 rows that lack exactly 4 tab-separated fields (line 4)" in proc.stdout
    assert len((tmp_path / "glue_test" / "RTE.tsv").read_text().splitlines()) == 41  # a header and each row's
    data = {"test:RTE": ([("a", "b")] * 3, [0, 1, 2])}
    with pytest.raises(SystemExit, match="2 predictions for the 3 rows of RTE's test set"):
        glue.write_predictions(str(tmp_path / "run.json"), "rte", data, {"test:RTE": [0, 1]})


def test_a_task_is_one_row_even_from_jsonl(pretrained, tmp_path, monkeypatch, capsys):
    """BoolQ, SuperGLUE's jsonl, added as one row of TASKS (docs/glue.md's): it trains, scores and predicts end to end,
    its epochs by the examples in its file (12: a small task's 10), and a test line without a key is one line."""
    from configurator import config_keys
    folder = tmp_path / "BoolQ"
    folder.mkdir()
    rng = random.Random(0)

    def lines(n, test=False):
        rows = [dict(question=f"is the {rng.choice(OBJECTS)} {rng.choice(PLACES)}", passage=f"a {rng.choice(SUBJECTS)} "
                     f"{rng.choice(VERBS)} .", idx=i, **({} if test else dict(label=bool(i % 2)))) for i in range(n)]
        return "".join(json.dumps(row) + "\n" for row in rows)
    for file, n in (("train.jsonl", 12), ("val.jsonl", 6), ("test.jsonl", 5)):
        (folder / file).write_text(lines(n, test=file == "test.jsonl"))
    row = glue.task("boolq", folder="BoolQ", reader="jsonl", train="train.jsonl", dev={"boolq": ("val.jsonl", "validation")},
                    text=("question", "passage"), labels=("False", "True"), hub=("aps/super_glue", "boolq"),
                    tests={"BoolQ": ("test.jsonl", "boolq", "test")}, test_index="idx", glue=False)
    monkeypatch.setitem(glue.TASKS, "boolq", row)
    for key, value in dict(checkpoint=str(pretrained), glue_dir=str(tmp_path), tasks="boolq", seeds=1, device="cpu",
                           dtype="float32", out_json=str(tmp_path / "glue.json"), predict=True).items():
        monkeypatch.setattr(glue, key, value)
    glue.main(config_keys(vars(glue)))
    out = capsys.readouterr().out
    assert "boolq: batch 32, lr 0.0003, 10 epochs (by the encoder's width" in out
    assert "the GLUE server takes all 11 files, and these are missing: CoLA," in out and "BoolQ (" not in out  # not GLUE's
    entry = json.loads((tmp_path / "glue.json").read_text())["tasks"]["boolq"]
    assert entry["train_examples"] == 12 and 0 <= entry["median"]["boolq"]["accuracy"] <= 100
    predicted = (tmp_path / "glue_test" / "BoolQ.tsv").read_text().splitlines()
    assert predicted[0] == "index\tprediction" and [r.split("\t")[0] for r in predicted[1:]] == list("01234")
    assert all(r.split("\t")[1] in ("False", "True") for r in predicted[1:])
    (folder / "test.jsonl").write_text(lines(5, test=True) + '{"question": "a lone one"}\n')
    monkeypatch.setattr(glue, "seeds", 2)
    with pytest.raises(SystemExit, match="test.jsonl: line 6 lacks a value .not null. in each of question, passage, idx"):
        glue.main(config_keys(vars(glue)))


COPA = """import sys
sys.path.insert(0, {root!r})
import finetune_glue as glue
from configurator import configure
glue.TASKS["copa"] = glue.task("copa", folder="COPA", reader="jsonl", train="train.jsonl", dev={{"copa": ("val.jsonl", "validation")}},
                               text=("premise", "choice1", "choice2"), hub=("aps/super_glue", "copa"), tests={{}}, glue=False)
glue.process.guarded(glue.main, glue.kept_runs, configure(vars(glue), sys.argv[1:]))
"""  # finetune_glue.py with one more row of TASKS, as a fork adds a task: SuperGLUE's COPA, three texts


def test_a_task_of_three_texts_runs_end_to_end_and_says_how_it_read_them(pretrained, tmp_path):
    """A COPA-style task (a premise, two choices, the label naming the choice that goes with the premise; here the one
    that shares its subject) runs through finetune_glue.py as a process with the default head and words alone. Words
    alone reads what the premise shares with each choice in turn, so it finds the answer, which no bag of the three
    texts together holds; the pair head pools each text apart (model.py's tests), and both say so."""
    rng = random.Random(0)

    def lines(n):
        rows = []
        for i in range(n):
            subject, other = rng.sample(SUBJECTS, 2)
            right, wrong = (f"{s} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for s in (subject, other))
            rows.append(dict(premise=f"{subject} {rng.choice(VERBS)} {rng.choice(PLACES)} .", idx=i, label=i % 2,
                             choice1=wrong if i % 2 else right, choice2=right if i % 2 else wrong))
        return "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "COPA").mkdir()
    for file, n in (("train.jsonl", 200), ("val.jsonl", 60)):
        (tmp_path / "COPA" / file).write_text(lines(n))
    script = tmp_path / "finetune_copa.py"
    script.write_text(COPA.format(root=ROOT))
    proc = run_script(script, f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}", "--tasks=copa", "--epochs=2",
                      "--seeds=1", "--device=cpu", "--dtype=float32", f"--out_json={tmp_path / 'glue.json'}")
    results, read = json.loads((tmp_path / "glue.json").read_text()), " (3 texts: the first against each later one, side by side)"
    assert results["words_alone_scores"]["copa"] > 90  # each choice read against the premise, in order
    assert f"not fitted): copa {results['words_alone_scores']['copa']:.1f}{read}" in proc.stdout
    assert f"Heads: copa: each text's mean apart, [u, v, |u - v|, u * v]{read}." in proc.stdout
    entry = results["tasks"]["copa"]
    assert entry["settings"]["pooling"] == "pair" and entry["train_examples"] == 200
    assert 0 <= entry["median"]["copa"]["accuracy"] <= 100 and f"copa: accuracy {entry['median']['copa']['accuracy']:.1f}" in proc.stdout
    # the first token's head reads all of it as one, and the table says only that
    proc = run_script(script, f"--checkpoint={pretrained}", f"--glue_dir={tmp_path}", "--tasks=copa", "--epochs=1",
                      "--seeds=1", "--device=cpu", "--dtype=float32", f"--out_json={tmp_path / 'glue.json'}", "--pooling=first")
    assert "Heads: copa: the first token's state (the published head)." in proc.stdout

def test_the_progress_shows_the_mean_loss_of_every_step(pretrained, monkeypatch):
    """A 30-step run shows the loss at its first step, the 25th and its last, each the mean of the steps' losses since
    the one shown before: every step counts, and the device is read three times, not every step."""
    from types import SimpleNamespace
    from cram.files import load_checkpoint
    ckpt = load_checkpoint(str(pretrained))
    losses, shown = [], []

    class Bar:
        n = 0

        def update(self):
            self.n += 1

        def set_postfix(self, loss):
            shown.append((self.n, float(loss)))

        def close(self):
            pass

    def cross_entropy(*args):
        loss = torch.nn.functional.cross_entropy(*args)
        losses.append(loss.item())
        return loss
    monkeypatch.setattr(glue.process, "progress", lambda **kwargs: Bar())
    monkeypatch.setattr(glue, "F", SimpleNamespace(cross_entropy=cross_entropy))
    cls, sep = ckpt["meta"]["special_ids"]["[CLS]"], ckpt["meta"]["special_ids"]["[SEP]"]
    encoded = {"train": ([[cls, 10 + i, sep] for i in range(30)], [i % 2 for i in range(30)]), "rte": ([[cls, 5, sep]], [0])}
    glue.finetune("rte", encoded, ckpt, 0, runtime.setup("cpu", "float32", compile=False),
                  dict(batch_size=1, lr=1e-4, epochs=1), ckpt["model"])
    assert len(losses) == 30 and [n for n, _ in shown] == [1, 25, 30]
    for (n, value), (start, end) in zip(shown, ((0, 1), (1, 25), (25, 30))):
        assert value == pytest.approx(np.mean(losses[start:end]), abs=1e-3), n
