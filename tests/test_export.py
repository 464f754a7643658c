"""tools/export.py: the exported folder, loaded by transformers in a fresh process that cannot import any
cram module, computes what cram computes: same logits, hidden states and token ids."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_one_line_error, run_script
from cram.data import make_encoding
from cram.files import load_checkpoint, parse_ranks
import export  # tools/export.py
from model import CrammedBert, saved_model_args
from test_glue import FIXTURES

# every kind of character: ASCII words and contractions, digits, punctuation runs, whitespace runs,
# accents, combining marks, CJK, right-to-left, emoji with modifiers, control bytes, and the
# special tokens inside text, glued and spaced
TEXTS = [
    "The cat saw the river in the morning.",
    "don't you'll I'M we've   three   spaces\tand\ttabs\n\nnew lines  \n",
    "3.14159 + 2,718 = 5.859; 1e-12 >= 0x1F? #tags @users 100% (ok) [brackets] {braces}",
    "café naïve résumé Ångström — “quotes” ‘single’ … ellipsis",
    "e\u0301 combining, 日本語のテキスト, 中文, 한국어, שלום עולם, مرحبا",
    "emoji 🙂👍🏽🇫🇷 and \x00\x07 control \u200b zero-width",
    "a [MASK] b [MASK][MASK] [CLS]x[SEP] [PAD] [SEP]",
    "  leading and trailing spaces  ",
]

# Runs in a fresh interpreter whose path holds only the folder's parent: transformers must find
# everything it needs in the exported folder.
LOADER = r'''
import importlib.util, json, sys
import numpy as np, torch
assert all(importlib.util.find_spec(m) is None for m in ("model", "train", "data", "export", "runtime")), "cram is importable"
from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer,
                          pipeline)
folder, inputs = sys.argv[1], json.load(open(sys.argv[2]))
out = {}
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
out["ids"] = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in inputs["texts"]]
out["ids_with_specials"] = [tokenizer(t)["input_ids"] for t in inputs["texts"]]
out["decoded"] = [tokenizer.decode(ids) for ids in out["ids"]]
out["input_names"] = sorted(tokenizer("a b").keys())
out["mask_ids"] = tokenizer("import [MASK] as np")["input_ids"]
ids = torch.tensor(inputs["batch"])
mlm = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
encoder = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    logits = mlm(input_ids=ids).logits
    hidden = encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
np.savez(sys.argv[3], logits=logits.numpy(), hidden=hidden.numpy())
out["fill_mask"] = pipeline("fill-mask", model=mlm, tokenizer=tokenizer)(inputs["masked"])

torch.manual_seed(0)
classifier = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=3).eval()
padded = tokenizer(inputs["pair_texts"], padding=True, return_tensors="pt")
with torch.no_grad():
    together = classifier(**padded).logits
    alone = torch.cat([classifier(**tokenizer([t], return_tensors="pt")).logits for t in inputs["pair_texts"]])
out["padding_widths"] = padded["attention_mask"].sum(1).tolist()
out["padded_vs_alone"] = (together - alone).abs().max().item()
out["head_pooling"] = classifier.head.pooling
# a setting of the head passed as transformers passes config overrides: mean or pair pooling (config.json says where a
# text ends, classifier_sep_id), padding ignored
for pooling in ("mean", "pair"):
    other = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=3,
                                                               classifier_pooling=pooling).eval()
    with torch.no_grad():
        alone = torch.cat([other(**tokenizer([t], return_tensors="pt")).logits for t in inputs["pair_texts"]])
        out[f"{pooling}_padded_vs_alone"] = (other(**padded).logits - alone).abs().max().item()
    out[f"{pooling}_head_pooling"] = other.head.pooling

# training steps as a user of transformers takes them: a classification step with token_type_ids
# from a BERT-style caller, a masked-LM step with -100 labels, and a bfloat16 forward
classifier.train()
optimizer = torch.optim.AdamW(classifier.parameters(), lr=1e-3)
before = [p.detach().clone() for p in classifier.parameters()]
loss = classifier(**padded, token_type_ids=torch.zeros_like(padded["input_ids"]), labels=torch.tensor([0, 2, 1])).loss
loss.backward()
optimizer.step()
out["classifier_loss"] = loss.item()
out["classifier_changed"] = all(not torch.equal(a, b) for a, b in zip(before, classifier.parameters()))
labels = torch.full_like(ids, -100)
labels[:, 1] = ids[:, 1]
mlm.train()
loss = mlm(input_ids=ids, labels=labels).loss
loss.backward()
out["mlm_loss"] = loss.item()
out["mlm_grads"] = all(p.grad is not None and torch.isfinite(p.grad).all().item() for p in mlm.parameters())
half = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16)
out["bf16_logits_dtype"] = str(half(input_ids=ids[:1, :8]).logits.dtype)
json.dump(out, open(sys.argv[4], "w"))
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory, pretrained):
    """The pretrained tiny checkpoint exported, and what the fresh process computed from it."""
    return export_and_load(tmp_path_factory.mktemp("export"), pretrained)


def export_and_load(root, checkpoint):
    folder = root / "hf"
    run_script("tools/export.py", f"--checkpoint={checkpoint}", f"--out_dir={folder}")
    ckpt = load_checkpoint(str(checkpoint))
    enc = make_encoding(parse_ranks(ckpt["tokenizer"]), ckpt["meta"]["special_ids"])
    rng = np.random.default_rng(0)
    batch = rng.integers(0, ckpt["model_args"]["vocab_size"], (3, ckpt["model_args"]["seq_len"])).tolist()
    inputs = dict(texts=TEXTS, batch=batch, masked="The cat [MASK] the river in the morning.",
                  pair_texts=["The king helped the sea.", "A dog", "My sister painted an apple after dinner at night."])
    (root / "inputs.json").write_text(json.dumps(inputs))
    (root / "loader.py").write_text(LOADER)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(root / "hf_home")}  # no PYTHONPATH: nothing of cram's on the path
    proc = subprocess.run([sys.executable, str(root / "loader.py"), str(folder), str(root / "inputs.json"),
                           str(root / "tensors.npz"), str(root / "out.json")],
                          cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(folder=folder, ckpt=ckpt, enc=enc, inputs=inputs, out=json.loads((root / "out.json").read_text()),
                tensors=np.load(root / "tensors.npz"))


def test_a_narrowed_model_exports_equal_to_ours(tmp_path, pretrained):
    """full_layers: transformers runs the narrowed layers over every position, as fine-tuning does."""
    ckpt = torch.load(pretrained)
    torch.manual_seed(0)
    args = dict(ckpt["model_args"], n_layers=3, full_layers=1)  # the third layer narrowed (random weights)
    ckpt.update(model_args=args, model=CrammedBert(**args).state_dict())
    torch.save(ckpt, tmp_path / "ckpt.pt")
    test_logits_and_hidden_states_equal_ours(export_and_load(tmp_path, tmp_path / "ckpt.pt"))


@pytest.mark.quick
def test_logits_and_hidden_states_equal_ours(exported):
    ckpt = exported["ckpt"]
    model = CrammedBert(**ckpt["model_args"]).eval()
    model.load_state_dict(ckpt["model"])
    with torch.no_grad():
        hidden = model.encode(torch.tensor(exported["inputs"]["batch"]))
        logits = model.logits(hidden)
    np.testing.assert_allclose(exported["tensors"]["logits"], logits.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(exported["tensors"]["hidden"], hidden.numpy(), rtol=0, atol=1e-5)


def test_tokenizer_ids_equal_ours(exported):
    enc, out, specials = exported["enc"], exported["out"], exported["ckpt"]["meta"]["special_ids"]
    for text, ids, with_specials, decoded in zip(TEXTS, out["ids"], out["ids_with_specials"], out["decoded"]):
        text = text.replace(" [MASK]", "[MASK]")  # [MASK] takes the space before it (RoBERTa's <mask> does)
        ours = enc.encode(text, allowed_special="all")
        assert ids == ours, text
        assert with_specials == [specials["[CLS]"], *ours, specials["[SEP]"]]  # fine-tuning's layout
        assert decoded == text
    assert specials["[MASK]"] in out["ids"][6]
    assert out["input_names"] == ["attention_mask", "input_ids"]  # no token_type_ids: no segment embeddings


def test_fill_mask_and_padding_and_training_through_transformers(exported):
    out = exported["out"]
    predictions = out["fill_mask"]
    assert len(predictions) == 5 and all(p["sequence"] and 0 <= p["score"] <= 1 for p in predictions)
    assert predictions[0]["score"] >= predictions[-1]["score"]
    assert len(set(out["padding_widths"])) == 3  # three lengths: every row but the longest is padded
    assert out["padded_vs_alone"] < 1e-5
    assert out["head_pooling"] == "first" and out["mean_head_pooling"] == "mean" and out["pair_head_pooling"] == "pair"
    assert out["mean_padded_vs_alone"] < 1e-5 and out["pair_padded_vs_alone"] < 1e-5  # model.py's default, the overrides
    assert np.isfinite(out["classifier_loss"]) and out["classifier_changed"]
    assert np.isfinite(out["mlm_loss"]) and out["mlm_grads"]
    assert out["bf16_logits_dtype"] == "torch.bfloat16"


def test_the_documented_snippet_runs_as_written(exported):
    """docs/export.md's lines, run as a user pastes them (only the folder changed): no question, no
    warning, and the blank filled without a double space."""
    docs = (Path(__file__).parent.parent / "docs" / "export.md").read_text()
    snippet = docs.split("```python\n", 1)[1].split("```", 1)[0]
    assert snippet == export.usage("out/quickstart/hf")  # the model card shows the same lines
    root = exported["folder"].parent
    (root / "snippet.py").write_text(snippet.replace('"out/quickstart/hf"', repr(str(exported["folder"]))))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(root / "hf_home")}
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=root, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Do you wish" not in proc.stdout + proc.stderr and "[transformers]" not in proc.stderr, proc.stderr
    guesses = proc.stdout.splitlines()
    assert len(guesses) == 5 and all(re.fullmatch(r"[01]\.\d{3} import.* as np", g) for g in guesses), guesses
    enc, specials = exported["enc"], exported["ckpt"]["meta"]["special_ids"]
    # the model sees what pretraining showed it: the mask in place of a whole token, space and all
    assert exported["out"]["mask_ids"] == [specials["[CLS]"], *enc.encode("import"), specials["[MASK]"],
                                           *enc.encode(" as np"), specials["[SEP]"]]


def test_model_card_says_how_it_was_trained(exported, pretrained, tmp_path):
    card = (exported["folder"] / "README.md").read_text()
    ckpt = exported["ckpt"]
    args = saved_model_args(ckpt["model_args"])  # every switch by its name, from the config: a fork's new one too
    assert all(f"{k}={args[k]}" in card for k in args if k not in ("n_layers", "d_model", "n_heads", "d_ffn", "seq_len", "vocab_size"))
    assert f"trained {ckpt['step']:,} steps, {ckpt['tokens'] / 1e6:,.1f}M tokens in" in card
    assert f"- Data: {ckpt['meta']['source']} ({ckpt['meta']['train_sequences']:,} training sequences" in card
    assert "- Budget: 24 hours or 60 steps, whichever came first" in card  # the fixture stops at --max_steps=60
    assert f"- Validation at step {ckpt['step']:,}: MLM loss" in card and "(25% of held-out tokens masked)" in card
    assert "GLUE dev scores" not in card
    assert export.usage(str(exported["folder"])) in card  # the lines docs/export.md runs
    # with finetune_glue.py's glue.json beside the checkpoint, the card shows its scores
    shutil.copy(pretrained, tmp_path / "ckpt.pt")
    tuned = run_script("finetune_glue.py", f"--checkpoint={tmp_path / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte",
                       "--epochs=1", "--device=cpu").stdout
    assert "with 1 seed(s) (5 on a GPU, 1 on a CPU) on cpu" in tuned  # no --seeds: by where it runs, said
    run_script("tools/export.py", f"--checkpoint={tmp_path / 'ckpt.pt'}")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "GLUE dev scores" in card and "| rte | accuracy (1 seed, 1 epoch) |" in card
    # another run's checkpoint in its place, of the same step and tokens: the scores beside it are not its own
    other = torch.load(tmp_path / "ckpt.pt")
    name = next(iter(other["model"]))
    other["model"][name] = other["model"][name] + 0.01
    torch.save(other, tmp_path / "ckpt.pt")
    said = run_script("tools/export.py", f"--checkpoint={tmp_path / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf2'}").stdout
    assert "GLUE dev scores" not in (tmp_path / "hf2" / "README.md").read_text()
    assert "glue.json holds no scores of this checkpoint (another's, an older cram's, or JSON of another shape)" in said, said
    proc = run_script("finetune_glue.py", f"--checkpoint={tmp_path / 'ckpt.pt'}", f"--glue_dir={FIXTURES}", "--tasks=rte",
                      "--epochs=1", "--device=cpu", check=False)
    assert_one_line_error(proc, "holds the scores of another checkpoint")


def test_a_run_in_place_of_another_keeps_its_own_validation(prepared, tmp_path):
    """A checkpoint set aside (`mv ckpt.pt ckpt_seed0.pt`) and a new run of the same steps in its folder: the new run's
    metrics.jsonl has a line at the old checkpoint's step, which is not its validation, so neither the export's card
    nor finetune_glue's facts (the plot's) show it; the new checkpoint's own are shown."""
    import finetune_glue
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", "--n_layers=1", "--d_model=32", "--n_heads=1",
             "--d_ffn=64", "--batch_size=16", "--micro_batch=16", "--max_steps=2", "--device=cpu", "--compile=False",
             "--dtype=float32", "--eval_sequences=16", "--fill_in_examples=0"]
    run_script(*train)
    (tmp_path / "ckpt.pt").rename(tmp_path / "ckpt_seed0.pt")
    run_script(*train, "--seed=1")
    for name, shown in (("ckpt_seed0", False), ("ckpt", True)):
        run_script("tools/export.py", f"--checkpoint={tmp_path / name}.pt", f"--out_dir={tmp_path / name}")
        card = (tmp_path / name / "README.md").read_text()
        assert ("- Validation at step 2: MLM loss" in card) == shown, (name, card)
        facts = finetune_glue.pretraining_facts(load_checkpoint(str(tmp_path / f"{name}.pt")), str(tmp_path))
        assert (facts["val_loss"] is not None) == shown, (name, facts)


def test_bad_input_gives_one_line_errors(tmp_path):
    assert_one_line_error(run_script("tools/export.py", f"--checkpoint={tmp_path / 'none.pt'}", check=False),
                          "checkpoint not found")
    torch.save({"model": {}}, tmp_path / "other.pt")
    assert_one_line_error(run_script("tools/export.py", f"--checkpoint={tmp_path / 'other.pt'}", check=False),
                          "not a usable checkpoint written by train.py")


def test_merges_rebuild_the_ranks():
    """Ranks in merge order -> the merges that produced them, each token the join of its pair."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"th", b"he", b"the", b" t", b" the", b"er", b"her"):
        ranks[token] = len(ranks)
    merges = export.bpe_merges(ranks)
    # " the": th (rank 256) merges first, then the (258) before " t" (259); "her": he before er
    assert merges == [(b"t", b"h"), (b"h", b"e"), (b"th", b"e"), (b" ", b"t"), (b" ", b"the"), (b"e", b"r"),
                      (b"he", b"r")]
