# The larger of the two CPU scales of the recipe comparisons (tools/compare.py): a 6-layer, 384-wide crammed BERT on a book corpus of
# about 11 MB of text (any plain-text .txt.gz; 24 books), prepared with its own 32768-token tokenizer
# (a tenth of the books held out: 1% of 24 would be none):
# python prepare.py --dataset=<folder>/gutenberg_en.small_train.txt.gz --out_dir=data/gutenberg_small --vocab_size=32768 --val_fraction=0.1
# python tools/compare.py --base=config/ablate_small.py --variants=crammed,recipe_reference --protocol=tokens --seeds=3 --budget_minutes=15 --out_dir=out/ablate_small
data_dir = "data/gutenberg_small"
budget_hours = 0.25
n_layers = 6
d_model = 384
n_heads = 6
d_ffn = 1536
micro_batch = 32
batch_size = 128
lr = 1e-3
log_interval = 20
eval_sequences = 400
