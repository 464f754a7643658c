# Corpus for the 24-hour reference run: about 10B tokens of educational web text, streamed
# from the Hugging Face hub (needs internet; about 20 GB on disk). A day on an H100 trains about 22B tokens
# at the shape the budget picks, two passes of it; the paper's shape pinned trains 50B (docs/data.md).
# python prepare.py config/prepare_fineweb.py
dataset = "HuggingFaceFW/fineweb-edu"
hf_config = "sample-10BT"
vocab_size = 32768
val_fraction = 0.0005
tokenizer_train_chars = 2_000_000_000  # word counts, not text, are kept: a few GB at most (BENCHMARKS.md)
