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
    meta = dict(special_ids={"[MASK]": N_REGULAR + 1}, n_regular=N_REGULAR)  # the [MASK] id inside the vocabulary
    batches = data.Batches(tokens, meta, 0, 1, torch.device("cpu"), 0)
    step = dataclasses.replace(masking, mask_rate=0.5)
    (inputs, positions, labels), = batches.step(8, 4, step)
    assert seen == [SpanMasking(mask_rate=0.5, span=3)] and positions.shape == (4, 8)
    (same, *_), = data.Batches(tokens, meta, 0, 1, torch.device("cpu"), 0).step(8, 4, 0.5)
    assert torch.equal(inputs, same)



def test_validation_masks_each_row_alike_at_any_micro_batch_so_the_val_loss_is_the_same():
    """Validation draws each row's mask from the row's own index: a row is masked alike whether it is evaluated alone,
    in a batch of 3 or of 16, or among fewer rows. So the val loss at two micro-batch sizes is the same up to float32
    rounding in the batched matmuls. (The masks themselves are identical. Drawn batch by batch, as before, they moved
    this loss by 1.4e-3 between the two sizes.)"""
    from cram import runtime
    from model import CrammedBert
    torch.manual_seed(0)
    vocab, T = N_REGULAR + 5, 32
    meta = dict(special_ids={"[MASK]": N_REGULAR + 1}, n_regular=N_REGULAR)  # the [MASK] id inside the vocabulary
    tokens = np.random.default_rng(0).integers(0, N_REGULAR, (40, T)).astype(np.uint16)
    one_by_one = [data.validation_batch(tokens, [row], 0.25, meta) for row in range(40)]
    for batch in (data.validation_batch(tokens, range(40), 0.25, meta), data.validation_batch(tokens, range(16), 0.25, meta)):
        for row, alone in enumerate(one_by_one[:len(batch[0])]):
            assert all(torch.equal(part[row], single[0]) for part, single in zip(batch, alone))
    model, rt = CrammedBert(vocab_size=vocab, seq_len=T, n_layers=2, d_model=32, n_heads=2, d_ffn=64), \
        runtime.setup("cpu", "float32", compile=False)
    (loss_3, accuracy_3), (loss_16, accuracy_16) = (data.Validation(model, tokens, meta, micro, rt).score(40, 0.25)
                                                    for micro in (3, 16))
    assert abs(loss_3 - loss_16) <= 1e-6 * loss_3 and f"{loss_3:.4f}" == f"{loss_16:.4f}"
    assert accuracy_3 == accuracy_16
