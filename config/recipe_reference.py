# The paper's crammed-BERT recipe (Geiping & Goldstein 2022; the README says where cram's code departs from its
# reference code): train.py's defaults without smear, cram's one change to the recipe (it won the CPU ablations at
# two scales and on STS-B: BENCHMARKS.md).
# On top of any other config; with the paper's shape and batch too (train.py's budget picks them only at
# 24 hours on the paper's GPU):
# python train.py config/recipe_reference.py config/shape_paper.py --out_dir=out/paper
# The learning rate is the base's (a config's, or train.py's by the width: 1e-3 at the paper's width), so a
# comparison against train.py's recipe on the same base tests smear alone where the base gives the shape and batch
# (smear's FLOPs can move the budget's pick); config/shape_paper.py pins the paper's.
smear = False
