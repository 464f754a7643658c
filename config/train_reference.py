# The reference crammed-BERT recipe on one GPU for 24 hours (RECIPE.md). The model shape,
# optimizer and schedules are train.py's defaults; this file names the data and the budget.
# python train.py config/train_reference.py
data_dir = "data/fineweb-edu"
out_dir = "out/reference"
budget_hours = 24.0
micro_batch = 256  # raise until the GPU is full (bench.py finds the largest that fits)
batch_size = 8192
eval_interval_minutes = 60.0
ckpt_interval_minutes = 60.0
