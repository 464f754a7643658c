#!/usr/bin/env bash
# The batch sweeps of train.py's budget rule on a CPU (BENCHMARKS.md, "The budget's shape"): at each
# budget one shape (the rule's pick on this host: its start-up line says it) at several final batches,
# one after another on an otherwise idle machine, compared by validation loss after the same wall-clock
# budget. Resumable: tools/compare.py keeps every finished run, so run it again after a stop.
# Usage: SHAPE=n_layers=3+d_model=192 BATCHES="32 64 128" bash tools/batch_sweep.sh [budgets...]  (minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/batch_sweep}
SHAPE=${SHAPE:?the shape every run trains, e.g. SHAPE=n_layers=3+d_model=192}
BATCHES=${BATCHES:-32 64 128}
for m in "${@:-15 5}"; do
  variants=$(for b in $BATCHES; do printf "%s+batch_size=%s," "$SHAPE" "$b"; done)
  mkdir -p "$OUT"
  python tools/compare.py --base=config/shape_sweep.py --budget_minutes="$m" --out_dir="$OUT/$m" \
    --train_args="--eval_interval_minutes=$(python -c "print($m / 5)")" --variants="${variants%,}" | tee "$OUT/$m.log"
done
