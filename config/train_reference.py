# The reference crammed-BERT recipe on one GPU for 24 hours (see the README). The model shape,
# optimizer and schedules are train.py's defaults; this file names the data and the budget.
# python train.py config/train_reference.py
data_dir = "data/fineweb-edu"
out_dir = "out/reference"
budget_hours = 24.0
micro_batch = 0    # the largest power of two that fits the GPU (a probe at the start; bench.py shows the same search)
batch_size = 8192
eval_interval_minutes = 60.0
ckpt_interval_minutes = 60.0
