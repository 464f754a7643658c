"""cram's shared code, below the scripts (the README's layout names its modules); a reader learning a step can skip it.
Layers (tests/test_structure.py): the scripts import this package, model.py and configurator.py; the package imports
those two, never a script; they import nothing of cram's."""
