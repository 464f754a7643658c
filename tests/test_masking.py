import dataclasses

import numpy as np
import torch

from cram import data
from model import Masking, mask_tokens

MASK_ID, N_REGULAR = 999, 900


def corrupt(B=512, T=128, rate=0.25, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, N_REGULAR, (B, T), generator=g)
    return idx, *mask_tokens(idx, rate, MASK_ID, N_REGULAR, g)


def test_static_count_and_distinct_positions():
    for rate, T in [(0.25, 128), (0.15, 128), (0.25, 32)]:
        idx, inputs, positions, labels = corrupt(B=64, T=T, rate=rate)
        k = round(rate * T)
        assert positions.shape == labels.shape == (64, k)
        assert all(len(set(row.tolist())) == k for row in positions)
        assert torch.equal(labels, idx.gather(1, positions))


def test_only_chosen_positions_change():
    idx, inputs, positions, labels = corrupt()
    chosen = torch.zeros_like(idx, dtype=torch.bool).scatter(1, positions, True)
    assert torch.equal(inputs[~chosen], idx[~chosen])


def test_80_10_10_rule():
    idx, inputs, positions, labels = corrupt()
    at_chosen = inputs.gather(1, positions)
    n = labels.numel()
    masked = (at_chosen == MASK_ID).float().mean().item()
    unchanged = (at_chosen == labels).float().mean().item()
    random_token = ((at_chosen != MASK_ID) & (at_chosen != labels)).float().mean().item()
    # a random replacement equals the original 1/900 of the time, so 'unchanged' is ~0.1001
    assert abs(masked - 0.8) < 0.01 and abs(unchanged - 0.1) < 0.01 and abs(random_token - 0.1) < 0.01, \
        (masked, unchanged, random_token, n)
    assert at_chosen.max() <= MASK_ID and at_chosen[at_chosen != MASK_ID].max() < N_REGULAR


def test_positions_are_uniform():
    idx, inputs, positions, labels = corrupt(B=4000, T=16, rate=0.25)
    counts = torch.bincount(positions.flatten(), minlength=16).float() / positions.numel()
    assert (counts - 1 / 16).abs().max() < 0.01


def test_a_fork_s_masking_setting_reaches_mask_tokens_as_one_object(monkeypatch):
    """A fork's span masking: a field of Masking (here a subclass's) is taken from train.py's settings by its name and
    reaches mask_tokens whole through Batches, at the step's rate; the same rate alone masks as the object does."""
    @dataclasses.dataclass(frozen=True)
    class SpanMasking(Masking):
        span: int = 1

    masking = SpanMasking.from_settings(dict(mask_rate=0.2, span=3, lr=1e-3, n_layers=2))  # train.py's config
    assert masking == SpanMasking(mask_rate=0.2, span=3)
    seen = []
    monkeypatch.setattr(data, "mask_tokens", lambda idx, m, *rest: seen.append(m) or mask_tokens(idx, m, *rest))
    tokens = np.random.default_rng(0).integers(0, N_REGULAR, (64, 16)).astype(np.uint16)
    meta = dict(special_ids={"[MASK]": MASK_ID}, n_regular=N_REGULAR)
    batches = data.Batches(tokens, meta, 0, 1, torch.device("cpu"), 0)
    step = dataclasses.replace(masking, mask_rate=0.5)
    (inputs, positions, labels), = batches.step(8, 4, step)
    assert seen == [SpanMasking(mask_rate=0.5, span=3)] and positions.shape == (4, 8)
    (same, *_), = data.Batches(tokens, meta, 0, 1, torch.device("cpu"), 0).step(8, 4, 0.5)
    assert torch.equal(inputs, same)

