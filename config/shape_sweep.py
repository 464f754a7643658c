# The base of the shape sweeps that test train.py's budget rule (shape_for_budget, batch_for_budget) on a
# CPU: config/train_cpu.py's data and evaluation with no shape or batch, so that the variant `crammed` is
# the rule's pick; the other variants give their shapes or batch (BENCHMARKS.md, "The budget's shape"):
# python tools/compare.py --base=config/shape_sweep.py --budget_minutes=5 --out_dir=out/shape_sweep/5 \
#     --variants=crammed,n_layers=3+d_model=192,n_layers=5+d_model=320,batch_size=256
data_dir = "data/books32k"
log_interval = 20
eval_sequences = 1000
ckpt_interval_minutes = 1e9  # the end's checkpoint only
