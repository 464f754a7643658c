#!/usr/bin/env bash
# One GPU call (issue 99, item 1): more pretraining with the pair head, then GLUE against words alone.
#
#   1. prepares the carried text (tools/gpu_call.py --carry_text=True wrote data/gpu_call/corpus.txt.xz) at a 32k
#      vocabulary and sequences of 128, on the GPU machine's cores;
#   2. pretrains for PT_MINUTES at the budget's pick of shape, batch and rate (and PT_ARGS);
#   3. fine-tunes STS-B, MRPC, RTE and SST-2 with the pair head at the rule's settings, SEEDS seeds each, beside the
#      same shape never pretrained (the floor; FLOORS=0 leaves it out), and RTE once more from each seed's fine-tune of
#      each task in RTE_FROM (--protocol=task_start, PROBE_SEEDS seeds), all at once. Each run's JSON carries words
#      alone's scores. A process stopped at FT_LIMIT keeps the seeds it finished.
#
# Every step has its own deadline, so the whole call ends within about 9.5 minutes (timeout_s=600). Files land in
# $OUT: train.log, timeline.txt, env.txt, summary.txt (the table), ft.tar (every glue.json and log).
#
#   device run:  P=. OUT=$OUT bash tools/pair_call.sh            (carry: data/gpu_call)
#   rehearsal:   P=. OUT=/tmp/pc DEVICE=cpu PT_MINUTES=0.5 PREP_ARGS="--vocab_size=2048 --val_fraction=0.4" SEEDS=1 \
#                FT_LIMIT=150 EXTRA="--max_train_examples=64 --epochs=1" CARRY=<a small carry> bash tools/pair_call.sh
set -u
export PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
P=${P:-.}; OUT=${OUT:-/tmp/paircall}; W=${W:-/tmp/paircall_work}; DEVICE=${DEVICE:-cuda}; PY=${PY:-python3}
SEEDS=${SEEDS:-3}; PT_MINUTES=${PT_MINUTES:-4}; PREP_LIMIT=${PREP_LIMIT:-90}; FT_LIMIT=${FT_LIMIT:-230}
PREP_ARGS=${PREP_ARGS:---vocab_size=32768 --tokenizer_train_chars=120000000}; EXTRA=${EXTRA:-}
FLOORS=${FLOORS:-1}; RTE_FROM=${RTE_FROM-mrpc stsb}; PROBE_SEEDS=${PROBE_SEEDS:-2}  # RTE_FROM= (empty): no probes
PT_ARGS=${PT_ARGS:-}  # more train.py settings, e.g. --batch_ramp=0: at 8 x 512 on an H200 the ramp's micro-batches of
                      # 128 ran at 0.56-0.60x the full batch's tokens/s (docs/runs/h200_more_text_2026-11-29)
CARRY=${CARRY:-data/gpu_call}; DEADLINE=${DEADLINE:-570}  # seconds into the call by which the table is written
mkdir -p "$OUT" "$W/ft" "$W/logs"
T0=$(date +%s); mark() { echo "$1 at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/timeline.txt"; }
cd "$P" || exit 1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import torch, sklearn; print('torch', torch.__version__, 'sklearn', sklearn.__version__)"; nproc; } > "$OUT/env.txt" 2>&1
mark start

# 1. the corpus, prepared here from the carried text (a folder already prepared is kept)
timeout -s TERM -k 10 "$PREP_LIMIT" $PY prepare.py --dataset="$CARRY/corpus.txt.xz" --out_dir="$W/corpus" \
  --seq_len=128 $PREP_ARGS > "$OUT/prepare.log" 2>&1
mark "prepared rc=$?"

# 2. pretraining at the budget's pick; the budget counts compilation, so the call's clock is kept
timeout -s TERM -k 20 "$($PY -c "print(int($PT_MINUTES * 60) + 60)")" $PY train.py --data_dir="$W/corpus" --out_dir="$W/pt" \
  --budget_hours="$($PY -c "print($PT_MINUTES / 60)")" --eval_interval_minutes=1 --ckpt_interval_minutes=2 \
  --device="$DEVICE" $PT_ARGS > "$OUT/train.log" 2>&1
mark "pretraining rc=$?"
[ -f "$W/pt/ckpt.pt" ] || { mark "no checkpoint"; exit 1; }

# 3. fine-tuning, every run at once, stopped FT_LIMIT seconds on or 20 s before DEADLINE, whichever comes first
left=$(( DEADLINE - 20 - ($(date +%s) - T0) ))
FT_LIMIT=$(( left < FT_LIMIT ? left : FT_LIMIT )); (( FT_LIMIT > 0 )) || FT_LIMIT=1  # timeout 0 would mean no limit
mark "fine-tuning for $FT_LIMIT s"
G=$CARRY/glue
run() {  # name, task, extra arguments
  timeout -s TERM -k 15 "$FT_LIMIT" $PY finetune_glue.py --checkpoint="$W/pt/ckpt.pt" --glue_dir="$G" --tasks="$2" \
    --pooling=pair --device="$DEVICE" $EXTRA "${@:3}" --out_json="$W/ft/$1_$2.json" > "$W/logs/$1_$2.log" 2>&1 &
}
for t in stsb mrpc rte sst2; do
  ep=(); [ $t = sst2 ] && ep=(--epochs=1)  # SST-2's 67k examples: one epoch, as the grid
  run model "$t" --seeds="$SEEDS" "${ep[@]}"
  (( FLOORS )) && run floor "$t" --seeds="$SEEDS" --from_scratch=True "${ep[@]}"
done
for first in $RTE_FROM; do run "rtefrom$first" rte --seeds="$PROBE_SEEDS" --protocol=task_start --start_task="$first"; done
wait
mark "fine-tuning ended"
tar -C "$W" --exclude="*.pt" -cf "$OUT/ft.tar" ft logs  # not task_start's encoders: over 64 MiB, the tar would not come back

# the table: each variant's median [range] (seeds) per dev score, words alone beside
$PY - "$W/ft" > "$OUT/summary.txt" 2>&1 <<'EOF'
import glob, json, os, statistics, sys
cells, words, variants = {}, {}, []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*_*.json"))):
    variant, task = os.path.basename(path)[:-5].rsplit("_", 1)
    variants += [variant] * (variant not in variants)
    d = json.load(open(path))
    words.update(d.get("words_alone_scores") or {})
    for group in ("tasks", "no_pretraining"):
        for e in d.get(group, {}).values():
            for score, metrics in e["median"].items():
                main = next(iter(metrics))
                per = [s[score][main] for s in e["per_seed"]]
                cells[(variant, score)] = (metrics[main], f"{metrics[main]:.1f} [{min(per):.1f}-{max(per):.1f}] ({len(per)})")
scores = sorted({s for _, s in cells})
print("| dev, median [range] (seeds) | " + " | ".join(variants) + " | words alone |")
print("|---" * (len(variants) + 2) + "|")
for score in scores:
    w = words.get(score)
    print(f"| {score} | " + " | ".join(cells.get((v, score), (0, "-"))[1] for v in variants) +
          f" | {'-' if w is None else round(w, 1)} |")
for v in variants:
    got = [cells[(v, s)][0] for s in scores if (v, s) in cells]
    print(f"average of {v}: {statistics.mean(got):.1f} over {len(got)} scores" if got else f"average of {v}: -")
EOF
mark done
cat "$OUT/summary.txt"
