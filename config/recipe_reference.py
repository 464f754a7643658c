# The paper's crammed-BERT recipe (Geiping & Goldstein 2022; train.py's "The settings' reasons" lists where cram's
# code departs from its reference code): train.py's defaults without smear, cram's one change to the recipe's model (it won
# the CPU ablations at two scales and on STS-B: BENCHMARKS.md).
# On top of any other config; with the paper's shape, rate and its reference code's batch of 8192 too (train.py's
# budget picks that shape and rate at 24 hours on the paper's GPU, with a batch of 4096, the paper's best for GLUE):
# python train.py config/recipe_reference.py config/shape_paper.py --out_dir=out/paper
# The learning rate is the base's (a config's, or train.py's by the width: 1e-3 at the paper's width), so a
# comparison against train.py's recipe on the same base tests smear alone where the base gives the shape and batch
# (smear's FLOPs can move the budget's pick); config/shape_paper.py pins the paper's.
smear = False
