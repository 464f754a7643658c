#!/usr/bin/env bash
# How the GLUE head reads a sentence pair, measured on a CPU (docs/glue.md, "Why pairs lagged words alone"): each
# variant fine-tuned from a checkpoint and from the same shape never pretrained (the floor), SEEDS seeds each, a
# glue.json per variant beside the checkpoint (glue_<variant>.json); then one table of every variant's median and
# spread. Every run is a file once scored, so after a stop the same command does only what is left.
#   CKPT=out/cpu/ckpt.pt GLUE=<GLUE in its TSV layout> bash tools/pair_study.sh [variant ...]
#   CKPT=out/cpu/ckpt.pt GLUE=... bash tools/pair_study.sh table     # only the table of what is there
# A variant is NAME:TASKS:WHICH:SETTINGS, WHICH one of model, floor or both, the settings comma-separated as
# finetune_glue.py takes them; the default list is the study's, most telling first. EPOCHS (default: 2, the pilot's;
# the rule's 10 for these tasks is 5x the CPU time) and SEEDS (3) apply to all.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:?"CKPT=<a checkpoint>"}; GLUE=${GLUE:?"GLUE=<GLUE in its TSV layout>"}; SEEDS=${SEEDS:-3}; EPOCHS=${EPOCHS:-2}
VARIANTS=${*:-"pair:stsb:both:--pooling=pair first:stsb:both:--pooling=first pair:mrpc,rte:model:--pooling=pair first:mrpc,rte:model:--pooling=first \
  mean:stsb:model:--pooling=mean pair:sst2:model:--pooling=pair,--epochs=1,--max_train_examples=16000 \
  first:sst2:model:--pooling=first,--epochs=1,--max_train_examples=16000 pair:mrpc,rte:floor:--pooling=pair first:mrpc,rte:floor:--pooling=first \
  pair_lr1e-4:stsb:model:--pooling=pair,--lr=1e-4 pair_nodrop:stsb:model:--pooling=pair,--dropout=0"}
dir=$(dirname "$CKPT")
[ "$VARIANTS" = table ] && VARIANTS=""
for variant in $VARIANTS; do
  IFS=: read -r name tasks which settings <<< "$variant"
  case $which in model) floors=False ;; floor) floors=True ;; both) floors="False True" ;;
                 *) echo "error: variant $variant: WHICH is model, floor or both, not '$which'" >&2; exit 2 ;; esac
  for floor in $floors; do
    python finetune_glue.py --checkpoint="$CKPT" --glue_dir="$GLUE" --tasks="$tasks" --seeds="$SEEDS" \
      --epochs="$EPOCHS" ${settings//,/ } --from_scratch=$floor --out_json="$dir/glue_$name.json"
  done
done
python - "$dir" <<'PY'
import glob, json, os, sys
print("| variant | task | model: median [lowest-highest] | floor | words alone |\n|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "glue_*.json"))):
    r = json.load(open(path))
    for task in sorted(set(r.get("tasks", {})) | set(r.get("no_pretraining", {}))):
        cells = []
        for group in ("tasks", "no_pretraining"):
            e = r[group].get(task, {})
            if e.get("median"):
                name, metrics = next(iter(e["median"].items()))
                main = next(iter(metrics))
                low, high = e["spread"][name][main]
                cells.append(f"{metrics[main]:.1f} [{low:.1f}-{high:.1f}] ({len(e['seeds'])} seeds, {e['settings']['epochs']} ep)")
            else:
                cells.append("-")
        words = r.get("words_alone", {}).get(task)
        cells.append(f"{next(iter(next(iter(words.values())).values())):.1f}" if words else "-")
        print(f"| {os.path.basename(path)[5:-5]} | {task} | " + " | ".join(cells) + " |")
PY
