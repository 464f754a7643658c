#!/usr/bin/env bash
# RTE at 8 settings on the call's checkpoint, all at once (run on the device right after tools/pair_call.sh, whose
# work folder holds the checkpoint): each point 3 seeds, stopped at 170 s.
export PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1; W=/tmp/paircall_work; mkdir -p $W/rg
for p in 5e-5:10:32 1e-4:3:32 1e-4:5:16 3e-5:10:16 2e-4:3:32 5e-5:5:8 1e-4:10:16 3e-4:3:32; do
  IFS=: read lr ep bs <<< "$p"
  timeout -s TERM -k 10 170 python3 finetune_glue.py --checkpoint=$W/pt/ckpt.pt --glue_dir=data/gpu_call/glue \
    --tasks=rte --pooling=pair --device=cuda --seeds=3 --lr=$lr --epochs=$ep --batch_size=$bs \
    --out_json=$W/rg/rte_${lr}_${ep}_${bs}.json > $W/rg/rte_${lr}_${ep}_${bs}.log 2>&1 &
done
wait
python3 -c "
import json,glob
for f in sorted(glob.glob('$W/rg/*.json')):
    e=json.load(open(f))['tasks'].get('rte',{}); ps=[s['rte']['accuracy'] for s in e.get('per_seed',[])]
    print(f.split('/')[-1], e.get('median',{}).get('rte'), [round(x,1) for x in ps])
" | tee $OUT/rte_grid.txt
tar -C $W -cf $OUT/rg.tar rg
