"""A checkpoint -> a folder that Hugging Face transformers loads with no cram code installed.

    python tools/export.py --checkpoint=out/quickstart/ckpt.pt  # writes out/quickstart/hf/

and load it with the lines of `usage` (docs/export.md and the folder's model card show them).

The folder holds: model.safetensors (the encoder's weights, float32), config.json (CrammedBert's
arguments), model.py with modeling_cram.py (the code transformers runs: AutoModel gives hidden
states, AutoModelForMaskedLM logits at every position, AutoModelForSequenceClassification the
reference GLUE head, new), tokenizer.json (the corpus' byte-level BPE in the `tokenizers` format,
giving the same ids as cram's tiktoken encoding, with [PAD] [CLS] [SEP] [MASK] and the
"[CLS] a [SEP] b [SEP]" template fine-tuning uses), and README.md, a model card with how the
model was trained, and its GLUE scores when finetune_glue.py's glue.json is beside the checkpoint.
The tokenizer returns no token_type_ids: the model has no segment embeddings. Written in text,
"[MASK]" and the other three are the special tokens, as transformers users expect (cram's own
scripts read raw text with encode_ordinary, where they are plain text); "[MASK]" takes the space
before it, as RoBERTa's <mask>: pretraining masked whole tokens, space included (" True"), so the
model's guesses carry their space and "import [MASK] as np" fills in as "import True as np".
"""
import dataclasses
import functools
import hashlib
import math
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.data import SPECIAL_TOKENS, bytes_to_unicode  # noqa: E402
from cram.files import (check_writable, load_checkpoint, load_json, parse_ranks, read_json, read_metrics, write_atomically,  # noqa: E402
                        weights_digest, write_json)
from model import MASK_RATE, ModelConfig, saved_model_args  # noqa: E402
from cram.process import guarded  # noqa: E402

# -----------------------------------------------------------------------------
checkpoint = "out/quickstart/ckpt.pt"  # a train.py checkpoint (its tokenizer and settings travel in it)
out_dir = ""              # default: hf/ beside the checkpoint; a new or empty folder, or an earlier export
# -----------------------------------------------------------------------------
HERE = os.path.dirname(os.path.abspath(__file__))
CLASSES = {"AutoConfig": "CramConfig", "AutoModel": "CramModel", "AutoModelForMaskedLM": "CramForMaskedLM",
           "AutoModelForSequenceClassification": "CramForSequenceClassification"}


def bpe_merges(ranks):
    """The merge list behind tiktoken ranks (bytes -> rank, ranks in merge order): each token longer
    than a byte splits into the two parts that merging with lower ranks only reaches."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, i = min((ranks.get(parts[i] + parts[i + 1], math.inf), i) for i in range(len(parts) - 1))
            if best >= rank:
                raise SystemExit(f"error: the tokenizer's token {token!r} cannot be built from lower-ranked merges")
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append(tuple(parts))
    return merges


def hf_tokenizer(ranks, special_ids, seq_len):
    """cram's tokenizer as a `tokenizers` Tokenizer that gives the same ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    char = bytes_to_unicode()  # the byte-level alphabet the BPE was trained in

    def text(token):
        return "".join(char[b] for b in token)
    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in bpe_merges(ranks)]
    # ignore_merges: a pre-token that is itself in the vocabulary is one token, as in tiktoken
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split, as ours
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                                  for t in SPECIAL_TOKENS])  # [MASK] takes its space: see the docstring
    got = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if got != special_ids:
        raise SystemExit(f"error: special token ids {got} differ from the checkpoint's {special_ids}")
    cls, sep = ("[CLS]", special_ids["[CLS]"]), ("[SEP]", special_ids["[SEP]"])
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                             special_tokens=[cls, sep])
    tokenizer.enable_truncation(seq_len)
    return tokenizer


def training_facts(ckpt, run_dir):
    """Markdown lines on how the checkpoint was trained, from the checkpoint and the files beside it."""
    config, meta = ckpt.get("config", {}), ckpt["meta"]
    trained = all(k in ckpt for k in ("step", "tokens", "elapsed"))  # a user's conversion may hold the model alone
    hours = config.get("budget_hours")
    budget = (f"{config['budget_tokens']:,} tokens" if config.get("budget_tokens") else "not recorded" if hours is None
              else f"{hours:g} hours" if hours >= 1 else f"{60 * hours:g} minutes")
    if config.get("max_steps"):
        budget += f" or {config['max_steps']:,} steps, whichever came first"
    lines = [f"- Data: {meta.get('source', 'unknown')} ({meta.get('train_sequences', 0):,} training sequences of "
             f"{meta['seq_len']} tokens; vocabulary {meta['vocab_size']:,}, a byte-level BPE trained on that text)",
             f"- Budget: {budget}; " + (f"trained {ckpt['step']:,} steps, {ckpt['tokens'] / 1e6:,.1f}M tokens in "
                                         f"{ckpt['elapsed'] / 60:,.1f} minutes" if trained else "the training not recorded")
             + ("" if ckpt.get("final") or not trained else " (an intermediate checkpoint)"),
             f"- Objective: masked language modelling, " + (f"{100 * config['mask_rate']:g}% of the tokens masked" if
                                                             "mask_rate" in config else "the share masked not recorded")
             + " (80% [MASK], 10% random, 10% kept)"]
    evals = read_metrics(run_dir) if os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) else []  # one a step
    last = next((r for r in evals if (r["step"], r.get("run")) == (ckpt.get("step"), ckpt.get("run"))), None)  # its own
    if last:
        lines.append(f"- Validation at step {last['step']:,}: MLM loss {last['val_loss']:.4f}, masked-token accuracy "
                     f"{last['accuracy']:.3f} ({100 * config.get('eval_mask_rate', MASK_RATE):g}% of held-out tokens masked)")
    glue_path = os.path.join(run_dir, "glue.json")
    if os.path.isfile(glue_path):
        glue, why = load_json(glue_path)
        if isinstance(glue, dict) and glue.get("checkpoint_digest") == weights_digest(ckpt["model"]) and "table" in glue:
            lines += ["", "GLUE dev scores (finetune_glue.py; each row says its seeds and epochs; reference: the "
                          "published crammed BERT):", "", glue["table"]]
        elif why:  # finetune_glue.py's to make again (it sets it aside): the card goes on without it
            print(f"warning: {glue_path} is damaged ({why}): the card shows no GLUE scores; finetune_glue.py makes it again")
        else:  # said, so a card without scores is not a surprise
            print(f"{glue_path} holds no scores of this checkpoint (another's, an older cram's, or JSON of another "
                  f"shape): the card shows none")
    return lines


def model_settings(args):
    """The model's other settings, each ModelConfig field (model.py) by its name, so a new switch shows here with no
    list to edit; one that differs from its default says the default."""
    defaults = dataclasses.asdict(ModelConfig())
    return ", ".join(f"{k}={v}" + ("" if v == defaults.get(k, v) else f" (default {defaults[k]})") for k, v in args.items()
                     if k not in ("n_layers", "d_model", "n_heads", "d_ffn", "seq_len", "vocab_size"))


def model_card(ckpt, run_dir, folder_name):
    a = saved_model_args(ckpt["model_args"])
    return "\n".join([
        "---", "library_name: transformers", "pipeline_tag: fill-mask", "tags: [cram, bert, masked-lm]", "---",
        "", "# A crammed BERT encoder trained from scratch with cram", "",
        f"{a['n_layers']} layers, width {a['d_model']}, {a['n_heads']} heads, feed-forward {a['d_ffn']}, sequence length "
        f"{a['seq_len']}, vocabulary {a['vocab_size']:,}, tied output layer; cram's model settings: {model_settings(a)}.", "",
        "## How it was trained", "", *training_facts(ckpt, run_dir), "",
        "## Use", "", "```python", usage(folder_name).rstrip("\n"), "```", "",
        "`AutoModel` gives the final hidden states, `AutoModelForSequenceClassification` adds the reference GLUE "
        "head (first token -> dense 1024 -> Tanh -> dropout -> classes; `num_labels=1` regresses; "
        "`classifier_pooling=\"mean\"` averages the tokens instead, `\"pair\"` each text apart), newly "
        "initialised. The reference fine-tunes with dropout 0.1 (pass `dropout=0.1` to `from_pretrained`); "
        "pretraining ran without. The tokenizer gives no token_type_ids: the model has no segment embeddings.", ""])


def usage(folder):
    """The lines that load an export and fill in a word: the model card's and docs/export.md's (a
    test runs the latter as written). trust_remote_code on the tokenizer too: without it,
    transformers stops to ask, then warns about the model type."""
    return (f'from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline\n'
            f'folder = "{folder}"\n'
            f'tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n'
            f'model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)\n'
            f'for guess in pipeline("fill-mask", model=model, tokenizer=tokenizer)("import [MASK] as np"):\n'
            f'    print(f"{{guess[\'score\']:.3f}} {{guess[\'sequence\']}}")\n')


MANIFEST = ".cram_export.json"  # what this tool wrote in a folder: file -> sha256


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


TEMPORARY = re.compile(r".+\.\d+\.tmp")  # files.temporary_path's names: <file>.<pid>.tmp


def check_folder(folder, names):
    """Refuse a folder that holds anything but an unchanged earlier export (each file as its
    manifest says this tool wrote it), so a user's own file, or one they edited, is never replaced;
    then check that each file the export writes can be written, before any is."""
    present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    for name in [n for n in present if n.rsplit(".", 2)[0] in (*names, MANIFEST) and TEMPORARY.fullmatch(n)]:
        os.remove(os.path.join(folder, name))  # an export killed mid-write left its own temporary file
        present.remove(name)
    manifest = read_json(os.path.join(folder, MANIFEST), f"delete it to export into {folder}") \
        if MANIFEST in present else {}
    if not isinstance(manifest, dict):
        manifest = {}
    theirs = [name for name in present if name != MANIFEST and
              (name not in manifest or not os.path.isfile(os.path.join(folder, name)) or
               manifest[name] not in (None, digest(os.path.join(folder, name))))]  # None: an export was stopped
    if theirs:
        raise SystemExit(f"error: {folder} holds files this export did not write, or that changed since "
                         f"({', '.join(theirs[:5])}): export into a new or empty folder (--out_dir=)")
    for name in [*names, MANIFEST]:
        check_writable(os.path.join(folder, name), "--out_dir")


def copy_file(source, path):
    write_atomically(path, lambda tmp: shutil.copyfile(source, tmp))


FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "model.py", "modeling_cram.py",
         "README.md")


def main():
    ckpt = load_checkpoint(checkpoint)  # checked: its model_args, weights, meta and tokenizer agree
    run_dir = os.path.dirname(os.path.abspath(checkpoint))
    folder = out_dir or os.path.join(run_dir, "hf")
    check_folder(folder, FILES)
    meta, args = ckpt["meta"], saved_model_args(ckpt["model_args"])
    ranks = parse_ranks(ckpt["tokenizer"])
    tokenizer = hf_tokenizer(ranks, meta["special_ids"], args["seq_len"])
    card = model_card(ckpt, run_dir, folder)

    from safetensors.torch import save_file
    path = functools.partial(os.path.join, folder)
    write_json(path(MANIFEST), dict.fromkeys(FILES))  # first: a stopped export's files are still its own
    # every transformers class keeps the encoder as `cram`, so the keys get that prefix
    weights = {f"cram.{k}": v.float().contiguous() for k, v in ckpt["model"].items()}
    write_atomically(path("model.safetensors"), lambda tmp: save_file(weights, tmp, metadata={"format": "pt"}))
    specials = meta["special_ids"]
    write_json(path("config.json"), dict(
        architectures=["CramForMaskedLM"], model_type="cram", auto_map={k: f"modeling_cram.{v}" for k, v in CLASSES.items()},
        **args,  # the GLUE head's classifier_* settings are left to CramConfig's defaults (model.py's), but where its texts end
        classifier_sep_id=specials["[SEP]"],
        pad_token_id=specials["[PAD]"], cls_token_id=specials["[CLS]"], sep_token_id=specials["[SEP]"],
        mask_token_id=specials["[MASK]"], torch_dtype="float32"))
    write_atomically(path("tokenizer.json"), tokenizer.save)
    write_json(path("tokenizer_config.json"), dict(
        tokenizer_class="PreTrainedTokenizerFast", model_max_length=args["seq_len"], padding_side="right",
        pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"]))
    copy_file(os.path.join(ROOT, "model.py"), path("model.py"))
    copy_file(os.path.join(HERE, "modeling_cram.py"), path("modeling_cram.py"))
    write_atomically(path("README.md"), lambda tmp: Path(tmp).write_text(card, encoding="utf-8"))
    write_json(path(MANIFEST), {name: digest(path(name)) for name in FILES})  # what a rerun may replace
    print(f"wrote {folder}: {sum(v.numel() for v in ckpt['model'].values()) / 1e6:.2f}M parameters, "
          f"{len(ranks) + len(SPECIAL_TOKENS):,} tokens; load it with "
          f"AutoModelForMaskedLM.from_pretrained({folder!r}, trust_remote_code=True)")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "each file of the export is replaced whole or not at all; run the same command again")
