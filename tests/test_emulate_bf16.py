"""tools/emulate_bf16.py: bfloat16 autocast's numerics on float32 kernels, the stand-in for a CPU
without bfloat16 units when checking how training in bfloat16 learns."""
import os
from contextlib import nullcontext

import pytest
import torch

from emulate_bf16 import Bfloat16Products, main
from model import CrammedBert


def loss_and_grads(model, batch, dtype, emulated=False):
    model.zero_grad()
    with Bfloat16Products() if emulated else nullcontext(), torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
        loss, _ = model(*batch)
        loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_emulation_rounds_as_bfloat16_does():
    """A tiny model's gradients: the emulation differs from float32 as much as real bfloat16 does
    (the rounding of every product's operands and results to 8 bits of mantissa), and from real
    bfloat16 only where a product's order of summation flips a rounding (attention is float32 in
    both): 1e-5 to 1e-4 of the rounding measured on AVX2 and on the default kernels, whose sums seem to
    run in float32's order; kernels that sum in another (AVX512-bf16, AMX) flip more, by estimate up
    to ~0.06 of it (a flip per ~1e3 roundings, each a whole step), hence the bound 0.25."""
    torch.manual_seed(0)
    model = CrammedBert(vocab_size=512, n_layers=2, d_model=64, n_heads=2, d_ffn=256, seq_len=32)
    batch = (torch.randint(5, 512, (8, 32)), torch.randint(0, 32, (8, 8)), torch.randint(5, 512, (8, 8)))
    loss32, g32 = loss_and_grads(model, batch, torch.float32)
    loss_bf16, g_bf16 = loss_and_grads(model, batch, torch.bfloat16)
    loss_emu, g_emu = loss_and_grads(model, batch, torch.bfloat16, emulated=True)
    rounding = (g_bf16 - g32).norm()
    assert rounding > 1e-3 * g32.norm()  # bfloat16 does round: ~3e-3 of the gradient
    assert 0.7 < (g_emu - g32).norm() / rounding < 1.3
    assert (g_emu - g_bf16).norm() < 0.25 * rounding
    assert abs(loss_emu - loss_bf16) < 0.25 * abs(loss_bf16 - loss32) + 1e-5


def test_emulation_leaves_float32_alone():
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    with Bfloat16Products():
        assert torch.equal(a @ b, torch.mm(a, b)) and (a @ b).dtype == torch.float32
        assert (a.bfloat16() @ b.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("argv, message", [([], "usage:"), (["nope.py"], "usage:"),
                                           ([os.path.join(os.path.dirname(__file__), "..", "train.py"), "--dtype=bfloat16"],
                                            "add --compile=False")])
def test_emulation_refuses_what_it_cannot_run(argv, message):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_help_prints_the_usage_and_runs_nothing(capsys):
    for flag in ("--help", "-h"):
        main([flag])
        out = capsys.readouterr().out
        assert out.startswith("Run a script with bfloat16 autocast's numerics") and "tools/emulate_bf16.py train.py" in out
