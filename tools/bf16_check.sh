#!/usr/bin/env bash
# bfloat16 beside float32 on a CPU where dtype=auto picks bfloat16 (its matmuls at least 1.5x float32's: AMX
# Xeons, AMD's avx512_bf16): every figure BENCHMARKS.md's "The CPU's precision" asks of such a host, one step
# after another on an otherwise idle machine, most decisive first (about 2 hours in all on 2 cores):
#   attention   tools/bench_attention.py in both precisions: which attention model.attend should run there
#   step        bench.py --profile=True in both precisions, the quickstart's shape, then the CPU recipe's
#               (tokens/s, the share of the matmul speed, the time by kind of kernel), and the compile modes
#   quickstart  the README's 5-minute run in each precision: steps, tokens, val loss, accuracy
#   parity      the quickstart at equal tokens, 3 seeds a precision (tools/compare.py's token protocol)
#   glue        RTE and STS-B fine-tuned from the float32 quickstart in each precision, 3 seeds
#   cpu20       config/train_cpu.py for 20 minutes in each precision (needs CORPUS)
# Each step's output goes to $OUT/<step>.log; a step that finished leaves $OUT/<step>.done and is skipped
# on the next call, so after a stop run the same command again (an interrupted training run resumes).
# Usage: GLUE_DIR=<GLUE in its TSV layout> CORPUS=<300 MB of books, .txt or .txt.gz> bash tools/bf16_check.sh [steps...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/bf16_check}
fail() { echo "error: $*" >&2; exit 2; }
ALL="attention step quickstart parity glue cpu20"
STEPS=${*:-$ALL}
for s in $STEPS; do
  [[ " $ALL " == *" $s "* ]] || fail "unknown step '$s' (the steps: $ALL)"
done
if [ -z "${FORCE:-}" ]; then  # dtype=auto's own timing decides (runtime.auto_dtype), not what the CPU lists
  pick=$(python -c "import torch; from cram import runtime; print(*runtime.auto_dtype(torch.device('cpu'))[:2], sep=': ')")
  [[ $pick == bfloat16* ]] || fail "dtype=auto keeps float32 on this CPU ($pick): bfloat16 would crawl here; FORCE=1 runs it anyway"
fi
# what a later step needs, asked now rather than after an hour of the earlier ones
[[ " $STEPS " != *" glue "* || -d "${GLUE_DIR:-}" ]] || fail "the glue step needs GLUE_DIR=<a folder in the GLUE TSV layout>"
[[ " $STEPS " != *" cpu20 "* || -e data/books32k/meta.json || -e "${CORPUS:-}" ]] ||
  fail "the cpu20 step needs CORPUS=<about 300 MB of plain text> to prepare data/books32k"
mkdir -p "$OUT"
step() {  # step NAME COMMAND...: run it once, its output in $OUT/NAME.log
  local name=$1; shift
  [ -e "$OUT/$name.done" ] && { echo "$name: done earlier ($OUT/$name.log)"; return; }
  echo "$name: $* -> $OUT/$name.log"
  { echo "\$ $*"; "$@"; } 2>&1 | tee -a "$OUT/$name.log"
  touch "$OUT/$name.done"
}
pydocs() { [ -e data/pydocs/meta.json ] || python prepare.py; }  # the quickstart's data, made offline
books32k() {  # the CPU recipe's data, from CORPUS where it is not prepared yet
  [ -e data/books32k/meta.json ] || [ -z "${CORPUS:-}" ] ||
    step prepare_books32k python prepare.py --dataset="$CORPUS" --out_dir=data/books32k --vocab_size=32768 \
      --val_fraction=0.05 --tokenizer_train_chars=30000000
}
train() {  # train NAME OUT_DIR ARGS...: train.py once; a run stopped midway (its ckpt.pt) resumes
  local name=$1 dir=$2; shift 2
  step "$name" python train.py "$@" --out_dir="$dir" --resume="$([ -e "$dir/ckpt.pt" ] && echo True || echo False)"
}
for s in $STEPS; do
  case $s in
    attention)
      step attention_bfloat16 python tools/bench_attention.py --dtype=bfloat16
      step attention_float32 python tools/bench_attention.py --dtype=float32 ;;
    step)
      pydocs
      books32k
      for d in bfloat16 float32; do
        step "step_$d" python bench.py --baselines=False --profile=True --dtype=$d
      done
      step step_modes python bench.py --baselines=False --sweep=False --dtype=bfloat16 \
        --compile_mode=default,max-autotune-no-cudagraphs
      if [ -e data/books32k/meta.json ]; then
        for d in bfloat16 float32; do
          step "step_cpu_$d" python bench.py --shape=cpu --data_dir=data/books32k --baselines=False --sweep=False \
            --profile=True --dtype=$d
        done
      else
        echo "step: the CPU recipe's shape skipped: no data/books32k (give CORPUS to prepare it)"
      fi ;;
    quickstart)
      pydocs
      for d in bfloat16 float32; do
        train "quickstart_$d" "$OUT/quickstart_$d" config/train_quickstart.py --dtype=$d
      done ;;
    parity)
      pydocs
      step parity python tools/compare.py --base=config/train_quickstart.py --protocol=tokens --budget_tokens=600000 \
        --variants=dtype=float32,dtype=bfloat16 --seeds=3 --out_dir="$OUT/parity" ;;
    glue)
      [ -e "$OUT/quickstart_float32.done" ] || fail "the glue step fine-tunes the quickstart step's float32 checkpoint: run that first"
      for d in bfloat16 float32; do
        step "glue_$d" python finetune_glue.py --checkpoint="$OUT/quickstart_float32/ckpt.pt" --glue_dir="$GLUE_DIR" \
          --tasks=rte,stsb --seeds=3 --dtype=$d --out_json="$OUT/glue_$d.json"
      done ;;
    cpu20)
      books32k
      for d in bfloat16 float32; do
        train "cpu20_$d" "$OUT/cpu20_$d" config/train_cpu.py --budget_hours=0.3333 --eval_interval_minutes=5 --dtype=$d
      done ;;
  esac
done
echo "all asked steps done: $OUT/*.log"
