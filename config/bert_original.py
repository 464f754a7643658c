# The original BERT recipe (Devlin et al. 2018) expressed with our code, for comparisons with the
# crammed one: post-norm, biases, plain GELU MLP, learned positions, the prediction-head transform,
# dense prediction, 15% masking, dropout on, warm-up then linear decay, a fixed batch, lr 1e-4,
# Adam betas (0.9, 0.999), eps 1e-6, clipping at 1.0. bench.py reads this file too.
# python train.py config/train_quickstart.py config/bert_original.py --out_dir=out/bert
bias = True
norm_first = False
glu = False
position_scheme = "learned"
head_transform = True
sparse_prediction = False
dropout = 0.1
mask_rate = 0.15
lr_schedule = "warmup_linear"
warmup = 0.01
batch_ramp = 0.0
lr = 1e-4
beta2 = 0.999
eps = 1e-6
grad_clip = 1.0
smear = False  # cram's addition (train.py's default), not BERT's
