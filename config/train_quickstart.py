# A few-minute CPU run on the embedded pydocs corpus: a 4-layer, 256-wide crammed BERT.
# python prepare.py && python train.py config/train_quickstart.py
# train.py's recipe, smear included: without smear (config/recipe_reference.py) five minutes end
# on the unigram plateau (masked-token accuracy 0.16, frequent tokens only); with it, near 0.3
# (BENCHMARKS.md, "Recipe ablations").
data_dir = "data/pydocs"
out_dir = "out/quickstart"
budget_hours = 5 / 60
n_layers = 4
d_model = 256
n_heads = 4
d_ffn = 1024
micro_batch = 32
batch_size = 64
batch_ramp_start = 32     # from one CPU micro-batch, as measured (train.py's 128 is the reference's GPU micro-batch)
lr = 2e-3                 # hand-tuned on this CPU; the width's rule would give 1.7e-3 (model.lr_for_width)
log_interval = 20
eval_interval_minutes = 1.0
ckpt_interval_minutes = 2.0
eval_sequences = 512
