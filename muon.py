"""Muon on the blocks' weight matrices and AdamW on everything else, as one torch optimizer.

Muon (Keller Jordan, 2024; the optimizer of the modded-nanogpt speedruns) keeps SGD momentum per
matrix and replaces each update by the nearest semi-orthogonal matrix, found with five
Newton-Schulz iterations, so the update moves every direction of the matrix alike instead of
following its few dominant ones. Embeddings, norms, scalars and the tied output layer are not
hidden matrices and keep AdamW. The orthogonal update is scaled by 0.2 * sqrt(max(rows, cols)),
which gives it AdamW's typical update RMS (Moonshot AI, "Muon is Scalable for LLM Training",
2025): one learning rate, schedule and weight decay then serve both kinds of parameter.
Written here (not torch.optim.Muon, which newer torch has) so that torch >= 2.4 works.
"""
import math

import torch


def muon_groups(model, weight_decay):
    """Param groups: the 2-D weights inside model.blocks get Muon; the rest AdamW, with decay on
    matrices and embeddings and none on biases, norms and scalars (as model.param_groups)."""
    hidden = {id(p) for p in model.blocks.parameters() if p.requires_grad and p.dim() == 2}
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if id(p) in hidden], "weight_decay": weight_decay, "muon": True},
            {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2], "weight_decay": weight_decay,
             "muon": False},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "muon": False}]


def orthogonalize(g, steps=5):
    """The semi-orthogonal matrix nearest to g (U V^T of its SVD), approximately: a quintic
    Newton-Schulz iteration whose coefficients (Jordan's) push every singular value into about
    [0.7, 1.2] in five steps, which serves an update as well as the exact polar factor."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.bfloat16() if g.is_cuda else g.float()  # bfloat16 is fast on a GPU and slow on a CPU
    x = x / (x.norm() + 1e-7)  # singular values into [0, 1]
    tall = x.shape[0] > x.shape[1]
    if tall:  # iterate on the smaller Gram matrix
        x = x.T
    for _ in range(steps):
        gram = x @ x.T                             # (r, r), r = min(rows, cols)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Groups with muon=True: Nesterov momentum, orthogonalized, RMS-matched to AdamW, decoupled
    weight decay. Other groups: AdamW with the same lr, betas, eps and weight decay settings."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-12, weight_decay=0.01, momentum=0.95,
                 ns_steps=5):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      ns_steps=ns_steps, muon=False))

    @torch.no_grad()
    def step(self, closure=None):
        loss = torch.enable_grad()(closure)() if closure else None
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["muon"]:
                    if not state:
                        state["momentum"] = torch.zeros_like(p)
                    buf = state["momentum"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    update = p.grad.lerp(buf, group["momentum"])  # Nesterov: look ahead along the momentum
                    update = orthogonalize(update, group["ns_steps"]) * (0.2 * math.sqrt(max(p.shape)))
                    p.mul_(1 - lr * wd).add_(update, alpha=-lr)
                else:
                    beta1, beta2 = group["betas"]
                    if not state:
                        state["step"] = torch.tensor(0.0)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    t = state["step"].item()
                    state["exp_avg"].lerp_(p.grad, 1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                    p.mul_(1 - lr * wd).addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))
        return loss
