"""Muon (cram/runtime.py): the update rules against small reference computations, and a run that learns with it."""
import json
import math

import torch

from conftest import TINY_MODEL, run_script
from model import CrammedBert, param_groups
from model import Muon, orthogonalize

TINY = dict(vocab_size=64, seq_len=16, n_layers=2, d_model=32, n_heads=2, d_ffn=64)


def test_orthogonalize_gives_the_polar_factor_approximately():
    """Newton-Schulz keeps the singular vectors and moves every singular value above a few percent
    of the largest near 1 (five steps cannot lift the tiniest: the known, harmless limit)."""
    torch.manual_seed(0)
    for shape in ((32, 96), (96, 32), (48, 48)):
        g = torch.randn(shape) * torch.logspace(-1, 0.5, shape[1])  # badly conditioned, like a gradient
        u, s, vt = torch.linalg.svd(g.double(), full_matrices=False)
        o = orthogonalize(g).double()
        inner = u.T @ o @ vt.T  # diagonal when the singular vectors are kept
        assert (inner - torch.diag(torch.diagonal(inner))).abs().max() < 1e-4
        moved = torch.diagonal(inner)[s > 0.03 * s[0]]
        assert len(moved) >= len(s) // 2 and moved.min() > 0.6 and moved.max() < 1.25, moved


def test_one_muon_step_matches_the_formula_and_adamw_groups_match_torch():
    torch.manual_seed(0)
    model = CrammedBert(**TINY)
    reference = CrammedBert(**TINY)
    reference.load_state_dict(model.state_dict())
    groups = param_groups(model, 0.01, "muon")
    hidden = groups[0]["params"]
    assert len(hidden) == 4 * TINY["n_layers"] and all(p.dim() == 2 for p in hidden)
    assert not any(p is model.tok_emb.weight for p in hidden)  # the embedding (and output layer) stays AdamW
    lr, momentum = 1e-2, 0.95
    optimizer = Muon(groups, lr=lr, betas=(0.9, 0.98), eps=1e-12, weight_decay=0.01, momentum=momentum)
    hidden_ids = {id(p) for p in hidden}
    ref_params = dict(reference.named_parameters())
    adam = torch.optim.AdamW([{"params": [ref_params[n] for n, p in model.named_parameters() if id(p) not in hidden_ids
                                          and p.dim() >= 2], "weight_decay": 0.01},
                              {"params": [ref_params[n] for n, p in model.named_parameters() if p.dim() < 2],
                               "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98), eps=1e-12)
    buffers = {n: torch.zeros_like(p) for n, p in model.named_parameters() if id(p) in hidden_ids}
    for step in range(3):
        grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
            ref_params[n].grad = grads[n].clone()
        optimizer.step()
        adam.step()
        with torch.no_grad():  # Muon by hand: momentum, Nesterov look-ahead, orthogonalize, scale, decay
            for n, buf in buffers.items():
                p, g = ref_params[n], grads[n]
                buf.mul_(momentum).add_((1 - momentum) * g)
                update = orthogonalize((1 - momentum) * g + momentum * buf) * 0.2 * math.sqrt(max(p.shape))
                p.mul_(1 - lr * 0.01).sub_(lr * update)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, ref_params[n], rtol=1e-5, atol=1e-6, msg=n)


def test_muon_update_has_adamw_size():
    """Scaled by 0.2 sqrt(max(rows, cols)), an update's RMS is about 0.2 lr whatever the shape:
    the size of a typical AdamW update, so one learning rate serves both."""
    torch.manual_seed(0)
    for shape in ((64, 256), (256, 64), (768, 2304)):
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = torch.randn(shape)
        Muon([{"params": [p], "muon": True}], lr=1.0, weight_decay=0.0).step()
        assert 0.12 < p.detach().pow(2).mean().sqrt().item() < 0.26, shape


def test_a_muon_run_learns_and_resumes(prepared, tmp_path):
    out = tmp_path / "run"
    common = [f"--data_dir={prepared}", f"--out_dir={out}", *TINY_MODEL, "--optim=muon", "--budget_tokens=61440"]
    run_script("train.py", *common, "--max_steps=20")
    run_script("train.py", *common, "--resume=True")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    assert evals[-1]["tokens"] == 61440
