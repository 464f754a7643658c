#!/usr/bin/env bash
# The learning-rate law's CPU evidence (issue 61; BENCHMARKS.md, "The budget's learning rate"): at each budget
# the rule's pick at the rule's rate (model.lr_for_width), at twice and at half it, in float32 (so the CPU's
# precision rule does not move it); then 3 seeds of the rule's rate at the shortest, for the spread. A budget of
# minutes is turned once into what the rule makes of it here (this machine's float32 matmul speed x a compiled
# CPU step's share, budget.step_efficiency, buys the FLOPs; the rule's shape and rate for them; the tokens those
# FLOPs train there) and every run trains those tokens of that shape (tools/compare.py --protocol=tokens --budget_tokens):
# equal compute for every rate, and results that do not depend on what else the machine runs. Resumable:
# compare.py keeps each finished run and $OUT/<minutes>.shape keeps the pick, so run it again after a stop;
# each budget's table lands in $OUT/<minutes>.log as it finishes.
# Usage: bash tools/lr_sweep.sh [budgets...]   (default: 15 45; minutes; needs data/books32k: config/train_cpu.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/lr_sweep}
[ -e data/books32k/meta.json ] || { echo "error: no data/books32k: prepare it as config/train_cpu.py says" >&2; exit 2; }
pick() {  # "<n_layers> <d_model> <rate> <tokens>": the rule's shape, rate and tokens for $1 minutes here, in float32
  python - "$1" <<'PY'
import dataclasses, json, sys
from cram import budget, runtime
from model import ModelConfig, lr_for_width
meta = json.load(open("data/books32k/meta.json"))
compute = float(sys.argv[1]) * 60 * runtime.matmul_speed(runtime.setup("cpu", "float32", False))
args = dataclasses.asdict(ModelConfig(vocab_size=meta["vocab_size"], seq_len=meta["seq_len"]))
rung = budget.shape_for_budget(compute, 0, meta["train_sequences"] * meta["seq_len"], args, 0.25, budget.step_efficiency)[0]
shape = ModelConfig.from_settings({**args, **budget.shape_of(rung, {})}, vocab_size=meta["vocab_size"], seq_len=meta["seq_len"])
print(rung[0], rung[1], f"{lr_for_width(rung[1]):.3g}", int(compute * budget.step_efficiency(rung[1]) / shape.flops_per_token(0.25)))
PY
}
mkdir -p "$OUT"
for m in ${@:-15 45}; do
  if [ ! -e "$OUT/$m.shape" ]; then  # kept, and whole (a stop while it is written leaves none): a rerun trains the same shape and tokens
    pick "$m" > "$OUT/$m.shape.tmp"
    mv "$OUT/$m.shape.tmp" "$OUT/$m.shape"
  fi
  read -r layers width rate tokens < "$OUT/$m.shape"
  [ -n "$tokens" ] || { echo "error: $OUT/$m.shape is an older sweep's pick, without tokens: move it and $OUT/$m away to sweep again" >&2; exit 2; }
  shape="n_layers=$layers+d_model=$width"
  half=$(python -c "print(f'{$rate / 2:.3g}')"); double=$(python -c "print(f'{$rate * 2:.3g}')")
  echo "$m min: $layers x $width, $tokens tokens, the rule's rate $rate (half $half, twice $double)"
  sweep=(python tools/compare.py --base=config/shape_sweep.py --protocol=tokens --budget_tokens="$tokens"
         --out_dir="$OUT/$m" --train_args="--dtype=float32 --eval_interval_minutes=$(python -c "print($m / 5)")")
  "${sweep[@]}" --variants="$shape+lr=$rate,$shape+lr=$double,$shape+lr=$half" | tee "$OUT/$m.log"
  if [ "$m" = "${1:-15}" ]; then  # the spread of seeds, once, at the first budget (seed 0 is the run above)
    "${sweep[@]}" --seeds=3 --variants="$shape+lr=$rate" | tee "$OUT/${m}_seeds.log"
  fi
done
