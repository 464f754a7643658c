"""Does the encoder know which text of a pair a token is in? cram has no token types: `[CLS] a [SEP] b [SEP]` tells
the two texts apart only by the [SEP] between them and the positions. A linear probe (logistic regression) reads each
text token's final state and guesses its text, trained on half of a task's dev pairs and scored on the other half;
beside it the same probe on the token's position alone (how far the lengths give it away), and the same encoder never
pretrained. docs/glue.md, "Why pairs lagged words alone", has the figures.

    python tools/segment_probe.py --checkpoint=out/cpu/ckpt.pt --glue_dir=<GLUE>
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from cram.data import make_encoding  # noqa: E402
from cram.files import load_checkpoint, parse_ranks  # noqa: E402
from model import CrammedBert, saved_model_args  # noqa: E402

# -----------------------------------------------------------------------------
checkpoint = "out/cpu/ckpt.pt"
glue_dir = ""        # a folder in the GLUE layout
task = "stsb"        # a pair task's dev file to probe (any of finetune_glue.py's pair tasks in the tsv layout)
pairs = 800          # [2, 100000]: dev pairs read, half to fit the probe, half to score it
seed = 0             # [0, 4294967295]: the never-pretrained encoder's
# -----------------------------------------------------------------------------
FILES = dict(stsb=("STS-B/dev.tsv", 7, 8), rte=("RTE/dev.tsv", 1, 2), mrpc=("MRPC/dev.tsv", 3, 4))  # file, a's and b's column


def token_rows(encoder, encoded, sep):
    """(states (N, d), positions (N, 1), text (N,): 0 for a's tokens, 1 for b's) of every text token ([CLS] and [SEP]s
    left out)."""
    states, positions, texts = [], [], []
    with torch.no_grad():
        for ids in encoded:
            hidden = encoder.encode(torch.tensor([ids]))[0].float()  # (T, d)
            first_sep = ids.index(sep)
            for t, token in enumerate(ids[1:-1], 1):
                if token != sep:
                    states.append(hidden[t].numpy()), positions.append([t]), texts.append(int(t > first_sep))
    return np.array(states), np.array(positions, dtype=np.float64), np.array(texts)


def probe(features, texts, half):
    """The probe's accuracy on the second half's tokens, fitted on the first's."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    scale = StandardScaler().fit(features[:half])
    fitted = LogisticRegression(max_iter=3000).fit(scale.transform(features[:half]), texts[:half])
    return 100 * fitted.score(scale.transform(features[half:]), texts[half:])


def main():
    configure(globals(), sys.argv[1:])
    if task not in FILES:
        raise SystemExit(f"error: --task={task!r}: one of {', '.join(FILES)}")
    path, a, b = FILES[task]
    lines = open(os.path.join(glue_dir, path), encoding="utf-8-sig").read().splitlines()[1:pairs + 1]
    ckpt = load_checkpoint(checkpoint)
    special = ckpt["meta"]["special_ids"]
    enc, room = make_encoding(parse_ranks(ckpt["tokenizer"]), special), ckpt["model_args"]["seq_len"] // 2 - 2
    rows = [line.split("\t") for line in lines]
    encoded = [[special["[CLS]"], *enc.encode_ordinary(r[a])[:room], special["[SEP]"], *enc.encode_ordinary(r[b])[:room],
                special["[SEP]"]] for r in rows]
    print(f"| {task} dev, {len(encoded)} pairs, probe fitted on half | which text, from the token's state | from its position alone |")
    print("|---|---|---|")
    for name, weights in (("pretrained", ckpt["model"]), ("never pretrained", None)):
        torch.manual_seed(seed)
        encoder = CrammedBert(**saved_model_args(ckpt["model_args"])).eval()
        if weights is not None:
            encoder.load_state_dict(weights)
        states, positions, texts = token_rows(encoder, encoded, special["[SEP]"])
        ends = np.cumsum([len(e) - 3 for e in encoded])  # each pair's last text token's row, plus one
        half = int(ends[np.searchsorted(ends, texts.size // 2)])  # whole pairs on each side
        print(f"| {name} | {probe(states, texts, half):.1f}% | {probe(positions, texts, half):.1f}% |")


if __name__ == "__main__":
    main()
