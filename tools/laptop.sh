#!/usr/bin/env bash
# Raw text to a GLUE table on a CPU: the path a class can run on laptops, no GPU needed.
#
#   bash tools/laptop.sh <corpus: a .txt/.txt.gz/.jsonl file or a folder of them> <GLUE folder>
#
# The corpus: about 300 MB of English text (a 2-hour run on 2 cores reads a fraction of it once);
# the GLUE folder in its original layout (<dir>/RTE/train.tsv, ...; tasks missing there are
# skipped). Every stage resumes where it stopped: after Ctrl-C, a crash or a reboot, run the same
# command again and nothing finished is redone. Each stage takes more settings from PREPARE_ARGS,
# TRAIN_ARGS and GLUE_ARGS (the test runs the whole path with tiny ones); DATA_DIR and OUT_DIR say
# where the data and the run go.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash tools/laptop.sh <corpus> <GLUE folder>"
corpus=${1:?$usage}
glue=${2:?$usage}
data=${DATA_DIR:-data/laptop}
out=${OUT_DIR:-out/laptop}

# 1. A tokenizer trained on the corpus, and its token files (resumes from its progress record).
python prepare.py --dataset="$corpus" --out_dir="$data" --vocab_size=32768 --val_fraction=0.05 \
    --tokenizer_train_chars=30000000 ${PREPARE_ARGS:-}

# 2. Pretraining: config/train_cpu.py, two hours. A rerun resumes the checkpoint; a run that has
#    spent its budget is left as it is.
resume=False
[ -f "$out/ckpt.pt" ] && resume=True
python train.py config/train_cpu.py --data_dir="$data" --out_dir="$out" --resume=$resume ${TRAIN_ARGS:-}

# 3. GLUE with the reference's settings: the small tasks (WNLI too, though the reference leaves it out
#    of its average) over 3 seeds (the median), the large ones
#    (SST-2, QNLI: 67k and 105k pairs) 1 seed of 1 epoch, to keep a CPU's time in bounds; every row
#    of the table says its seeds and epochs. Each seed is a file (glue_runs/) once scored; glue.json sums them up.
present() {  # the tasks of $1 whose training file is in the GLUE folder
    local tasks=() task folder
    for task in ${1//,/ }; do
        case $task in rte) folder=RTE ;; mrpc) folder=MRPC ;; stsb) folder=STS-B ;; cola) folder=CoLA ;; wnli) folder=WNLI ;;
                      sst2) folder=SST-2 ;; qnli) folder=QNLI ;; esac
        [ -f "$glue/$folder/train.tsv" ] && tasks+=("$task")
    done
    local IFS=,
    echo "${tasks[*]}"
}
small=$(present rte,mrpc,stsb,cola,wnli)
large=$(present sst2,qnli)
if [ -z "$small$large" ]; then
    echo "error: no task's train.tsv in $glue (expected the original layout: $glue/RTE/train.tsv, ...)" >&2
    exit 1
fi
[ -n "$small" ] && python finetune_glue.py --checkpoint="$out/ckpt.pt" --glue_dir="$glue" --tasks="$small" \
    --seeds=3 ${GLUE_ARGS:-}
[ -n "$large" ] && python finetune_glue.py --checkpoint="$out/ckpt.pt" --glue_dir="$glue" --tasks="$large" \
    --seeds=1 --epochs=1 ${GLUE_ARGS:-}
echo "GLUE dev scores of $out/ckpt.pt (all tasks in $out/glue.json):"
python -c "import json, sys; print(json.load(open(sys.argv[1]))['table'])" "$out/glue.json"
