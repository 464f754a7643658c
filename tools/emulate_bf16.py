"""Run a script with bfloat16 autocast's numerics on float32's kernels: how training in bfloat16
learns, checked on a CPU whose bfloat16 matmuls crawl (AVX2 without bfloat16 units: 1/100 to
1/270 of float32's speed, BENCHMARKS.md "The CPU's precision").

    python tools/emulate_bf16.py train.py config/train_quickstart.py --dtype=bfloat16 --compile=False \\
        --budget_tokens=600000 --seed=0 --out_dir=out/bf16_emulated/seed0
    python tools/emulate_bf16.py finetune_glue.py --checkpoint=... --dtype=bfloat16 --out_json=glue_emulated.json

(A script with a compile setting needs --compile=False. Give emulated runs their own out_dir and
out_json: their records say bfloat16, as the numerics are, but nothing ran on bfloat16 kernels.)

Autocast hands every product bfloat16 operands. Below it, this runs those products (mm, addmm, bmm,
baddbmm) on the same bfloat16 values widened to float32, then rounds each result to bfloat16, as the
bfloat16 kernel returns it: rounding as bfloat16's (operands and results), accumulation in float32 as
AMX's and oneDNN's kernels accumulate, only the order of the sums differs. Everything else runs as
autocast has it (element-wise ops and norms on bfloat16 tensors; the loss and, on a CPU, attention's
softmax in float32: model.attend). One difference, towards less precision: it runs eager only (a dispatch mode
does not reach into torch.compile's kernels), and eager code rounds every op's output to bfloat16
where compiled code keeps a fused kernel's intermediates in float32. So this checks the recipe's
numerics, not a machine's speed: the real check in bfloat16 wants a CPU with AMX (or a GPU).
"""
import os
import re
import runpy
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def is_bf16(x):
    return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16


class Bfloat16Products(TorchDispatchMode):
    """Inside it, a product on bfloat16 tensors computes in float32 and returns bfloat16 results."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if func not in PRODUCTS or not tensors or not all(map(is_bf16, tensors)):
            return func(*args, **kwargs)  # float32's as it is; mixed precisions raise as they do without the mode
        wide = tree_map(lambda x: x.float() if is_bf16(x) else x, (args, kwargs))
        return func(*wide[0], **wide[1]).bfloat16()  # each product returns one tensor in its operands' precision


def main(argv):
    if argv[:1] in (["--help"], ["-h"]):  # a wrapper: its usage is the docstring; the script's own --help lists settings
        print(__doc__.strip())
        return
    if not argv or not argv[0].endswith(".py") or not os.path.isfile(argv[0]):
        raise SystemExit("usage: python tools/emulate_bf16.py <script.py> [its arguments]: e.g. train.py config/... "
                         "--dtype=bfloat16 --compile=False")
    script = os.path.abspath(argv[0])
    with open(script, encoding="utf-8") as f:
        compiles = re.search(r"^compile\s*=", f.read(), re.M)  # the script has a compile setting (train.py, bench.py)
    if compiles and "--compile=False" not in argv:
        raise SystemExit("error: the emulation runs eager only: add --compile=False (a dispatch mode does not reach "
                         "into compiled kernels)")
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))  # the script's own modules, as `python script.py` finds them
    with Bfloat16Products():
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
