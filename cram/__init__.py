"""cram's shared code, below the scripts at the top (the README's layout names its modules); a reader learning a
step can skip it. Layers (tests/test_structure.py): the scripts import this package, model.py and configurator.py;
the package imports model.py and configurator.py, never a script; those two import nothing of cram's. A step in two
files as far as it goes: the objective's masking beside the loss in model.py, the loop and its schedules in
train.py; the batches stay in data.py, their order (rows_at) shared with evaluation and tools/curriculum.py.
"""
