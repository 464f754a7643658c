#!/usr/bin/env bash
# The shape sweeps of train.py's budget rule on a CPU (BENCHMARKS.md, "The budget's shape"): at each
# budget the rule's pick (`crammed`: no shape given), the ladder's rung below and above it, and the pick
# at a second batch size, one after another on an otherwise idle machine; then 3 seeds of the pick at the
# shortest. Resumable: tools/compare.py keeps every finished run, so run it again after a stop.
# Usage: bash tools/shape_sweep.sh [budgets...]   (default: 5 15 45; minutes)
#        VARIANTS=crammed,... bash tools/shape_sweep.sh 45   (another host's neighbours: its pick's start-up line says it)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/shape_sweep}
variants() {  # $VARIANTS where given; else the pick, its neighbours and a second batch, as the rule (SIZE_EXPONENT 0.40) picks them on a 2-core Xeon (~300-370 GFLOP/s)
  [ -n "${VARIANTS:-}" ] && { echo "$VARIANTS"; return; }
  case $1 in
    5) echo "crammed,n_layers=2+d_model=128,n_layers=4+d_model=256,batch_size=64" ;;    # the pick 3 x 192 at 32
    15) echo "crammed,n_layers=2+d_model=128,n_layers=4+d_model=256,batch_size=128" ;;  # the pick 3 x 192 at 64
    45) echo "crammed,n_layers=3+d_model=192,n_layers=5+d_model=320,batch_size=64" ;;   # the pick 4 x 256 at 64-128
    *) echo "crammed" ;;
  esac
}
for minutes in "${@:-5 15 45}"; do
  for m in $minutes; do
    mkdir -p "$OUT"
    python tools/compare.py --base=config/shape_sweep.py --budget_minutes="$m" --out_dir="$OUT/$m" \
      --train_args="--eval_interval_minutes=$(python -c "print($m / 5)")" --variants="$(variants "$m")" | tee "$OUT/$m.log"
    if [ "$m" = 5 ]; then  # the spread of seeds, once, at the shortest (seed 0 is the run above)
      python tools/compare.py --base=config/shape_sweep.py --budget_minutes=5 --out_dir="$OUT/5" --seeds=3 \
        --train_args="--eval_interval_minutes=1.0" --variants=crammed | tee "$OUT/5_seeds.log"
    fi
  done
done
