#!/usr/bin/env bash
# The learning-rate law's CPU evidence (issue 61; BENCHMARKS.md, "The budget's learning rate"): at each budget
# the rule's pick at the rule's rate (budget.lr_for_width), at half and at twice it, in float32 (so the CPU's
# precision rule does not move it), one after another on an otherwise idle machine; then 3 seeds of the rule's
# rate at the shortest, for the spread. Every variant trains the shape the rule picks here, given explicitly (a
# timing near a rung's boundary must not hand two variants two shapes). Resumable: tools/compare.py keeps each
# finished run, so run it again after a stop; each budget's table lands in $OUT/<minutes>.log as it finishes.
# Usage: bash tools/lr_sweep.sh [budgets...]   (default: 15 45; minutes; needs data/books32k: config/train_cpu.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/lr_sweep}
[ -e data/books32k/meta.json ] || { echo "error: no data/books32k: prepare it as config/train_cpu.py says" >&2; exit 2; }
pick() {  # "<n_layers> <d_model> <rate>": the rule's shape and rate for $1 minutes of this machine, in float32
  python - "$1" <<'PY'
import dataclasses, json, sys
import budget, runtime
from model import ModelConfig
meta = json.load(open("data/books32k/meta.json"))
compute = float(sys.argv[1]) * 60 * runtime.matmul_speed(runtime.setup("cpu", "float32", False)) * budget.STEP_EFFICIENCY
args = dataclasses.asdict(ModelConfig(vocab_size=meta["vocab_size"], seq_len=meta["seq_len"]))
rung = budget.shape_for_budget(compute, 0, meta["train_sequences"] * meta["seq_len"], args, 0.25)[0]
print(rung[0], rung[1], f"{budget.lr_for_width(rung[1]):.3g}")
PY
}
mkdir -p "$OUT"
for m in ${@:-15 45}; do
  [ -e "$OUT/$m.shape" ] || pick "$m" > "$OUT/$m.shape"  # kept: a rerun trains the same shape
  read -r layers width rate < "$OUT/$m.shape"
  shape="n_layers=$layers+d_model=$width"
  half=$(python -c "print(f'{$rate / 2:.3g}')"); double=$(python -c "print(f'{$rate * 2:.3g}')")
  echo "$m min: $layers x $width, the rule's rate $rate (half $half, twice $double)"
  python tools/compare.py --base=config/shape_sweep.py --budget_minutes="$m" --out_dir="$OUT/$m" \
    --train_args="--dtype=float32 --eval_interval_minutes=$(python -c "print($m / 5)")" \
    --variants="$shape+lr=$rate,$shape+lr=$half,$shape+lr=$double" | tee "$OUT/$m.log"
  if [ "$m" = "${1:-15}" ]; then  # the spread of seeds, once, at the first budget (seed 0 is the run above)
    python tools/compare.py --base=config/shape_sweep.py --budget_minutes="$m" --out_dir="$OUT/$m" --seeds=3 \
      --train_args="--dtype=float32 --eval_interval_minutes=$(python -c "print($m / 5)")" \
      --variants="$shape+lr=$rate" | tee "$OUT/${m}_seeds.log"
  fi
done
