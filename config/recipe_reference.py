# The paper's crammed-BERT recipe exactly (Geiping & Goldstein 2022): train.py's defaults without
# smear, cram's one change (it won the CPU ablations at two scales and on STS-B: BENCHMARKS.md).
# On top of any other config:
# python train.py config/recipe_reference.py --out_dir=out/paper
smear = False
