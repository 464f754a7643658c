import dataclasses
import math

import numpy as np
import torch

import train
from model import MASK32, Masking, mask_tokens, row_noise
from cram.setup import split_micro_batches
from train import Batches, mask_keys, micro_batch_sizes, rows_at

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


def test_80_10_10_rule_splits_each_row_by_count():
    """As in the reference code: of a row's k chosen positions, round(0.8 k) become [MASK], the next ones up to
    round(0.9 k) a random regular token (the original itself 1/900 of the time) and the rest stay, in every row; the
    [MASK] ones are a random subset of the chosen positions."""
    for T, rate in ((128, 0.25), (40, 0.15), (8, 0.1)):  # k = 32: 26, 3 and 3; k = 6: 5, 0 and 1; k = 1: [MASK]
        idx, inputs, positions, labels = corrupt(B=2000, T=T, rate=rate)
        k = labels.shape[1]
        at_chosen = inputs.gather(1, positions)
        n_mask, n_random = round(0.8 * k), round(0.9 * k) - round(0.8 * k)
        assert ((at_chosen == MASK_ID).sum(1) == n_mask).all()
        assert (at_chosen[:, n_mask + n_random:] == labels[:, n_mask + n_random:]).all()
        random_slots = at_chosen[:, n_mask:n_mask + n_random]
        assert (random_slots < N_REGULAR).all()
        if n_random:
            kept = (random_slots == labels[:, n_mask:n_mask + n_random]).float().mean().item()
            assert kept < 0.01, kept  # uniform over 900 regular ids
        masked_at = torch.zeros_like(idx, dtype=torch.bool).scatter(1, positions[:, :n_mask], True)
        share = masked_at.float().mean(0)  # each position's share of [MASK]: n_mask / T for all
        assert (share - n_mask / T).abs().max() < 5 * math.sqrt(n_mask / T / 2000), (T, share)


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
    monkeypatch.setattr(train, "mask_tokens", lambda idx, m, *rest, **keys: seen.append(m) or mask_tokens(idx, m, *rest, **keys))
    tokens = np.random.default_rng(0).integers(0, N_REGULAR, (64, 16)).astype(np.uint16)
    meta = dict(special_ids={"[MASK]": N_REGULAR + 1}, n_regular=N_REGULAR)  # the [MASK] id inside the vocabulary
    batches = Batches(tokens, meta, 0, 1, torch.device("cpu"), 0)
    step = dataclasses.replace(masking, mask_rate=0.5)
    (inputs, positions, labels), = batches.for_step(8, [4], step)
    assert seen == [SpanMasking(mask_rate=0.5, span=3)] and positions.shape == (4, 8)
    (same, *_), = Batches(tokens, meta, 0, 1, torch.device("cpu"), 0).for_step(8, [4], 0.5)
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
    one_by_one = [train.validation_batch(tokens, [row], 0.25, meta) for row in range(40)]
    for batch in (train.validation_batch(tokens, range(40), 0.25, meta), train.validation_batch(tokens, range(16), 0.25, meta)):
        for row, alone in enumerate(one_by_one[:len(batch[0])]):
            assert all(torch.equal(part[row], single[0]) for part, single in zip(batch, alone))
    model, rt = CrammedBert(vocab_size=vocab, seq_len=T, n_layers=2, d_model=32, n_heads=2, d_ffn=64), \
        runtime.setup("cpu", "float32", compile=False)
    (loss_3, accuracy_3), (loss_16, accuracy_16) = (train.Validation(model, tokens, meta, micro, rt).score(40, 0.25)
                                                    for micro in (3, 16))
    assert abs(loss_3 - loss_16) <= 1e-6 * loss_3 and f"{loss_3:.4f}" == f"{loss_16:.4f}"
    assert accuracy_3 == accuracy_16


def reference_noise(key, column):
    """row_noise's value for one key and column in plain Python integers, wrapping at 2**32 by hand: the spec the
    tensor version (int64, no overflow) must match bit for bit on any device."""
    def mix(h):
        h = ((h ^ (h >> 16)) * 0x45D9F3B) % 2 ** 32
        h = ((h ^ (h >> 16)) * 0x45D9F3B) % 2 ** 32
        return h ^ (h >> 16)
    key %= 2 ** 64  # the key's bits as an unsigned number (a negative int64 too)
    row = mix(mix((key >> 32) ^ 0x9E3779B9) ^ (key % 2 ** 32))
    return mix(row ^ mix(column + 0x9E3779B9))


def test_row_noise_is_a_function_of_the_key_and_column_alone():
    """The noise of a row is the same computed alone, in a batch, in another order, split in two, or with more
    columns, and equals the plain-integer spec. Only integer operations that never overflow int64 make it, so a GPU
    gives the same bits; where CUDA is available the test compares it, and where not, that follows from the
    operations (no float, no wrap-around)."""
    keys = torch.from_numpy(np.random.default_rng(0).integers(-2 ** 63, 2 ** 63 - 1, 40, dtype=np.int64))
    keys[:3] = torch.tensor([0, 1, -1])
    noise = row_noise(keys, 48)  # (40, 48)
    assert noise.dtype == torch.int64 and noise.min() >= 0 and noise.max() <= MASK32
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(row_noise(keys[order], 48), noise[order])
    assert torch.equal(torch.cat([row_noise(keys[:7], 48), row_noise(keys[7:], 48)]), noise)
    assert torch.equal(row_noise(keys, 20), noise[:, :20]) and torch.equal(row_noise(keys[5:6], 48)[0], noise[5])
    assert all(noise[r, c] == reference_noise(int(keys[r]), c) for r in range(0, 40, 7) for c in (0, 1, 17, 47))
    if torch.cuda.is_available():
        assert torch.equal(row_noise(keys.cuda(), 48).cpu(), noise)
    assert len(set(noise.flatten().tolist())) > 0.99 * noise.numel()  # 32-bit values: hardly a repeat among 1,920


def keyed(B=40, T=32, rate=0.25, seed=0):
    """(idx, keys) for B random rows, each with its own random int64 key."""
    rng = np.random.default_rng(seed)
    idx = torch.from_numpy(rng.integers(0, N_REGULAR, (B, T)))
    return idx, torch.from_numpy(rng.integers(-2 ** 63, 2 ** 63 - 1, B, dtype=np.int64))


def test_a_keyed_row_is_masked_alike_alone_and_in_any_batch():
    """mask_tokens with keys: a row with the same key and tokens gets the same inputs, positions and labels alone, in
    a batch of 16 (in another order) and in one of 40; rows of other keys are masked otherwise."""
    idx, keys = keyed()
    alone = [mask_tokens(idx[r:r + 1], 0.25, MASK_ID, N_REGULAR, keys=keys[r:r + 1]) for r in range(40)]
    picks = torch.randperm(40, generator=torch.Generator().manual_seed(1))[:16]
    for rows in (picks, torch.arange(40)):
        batch = mask_tokens(idx[rows], 0.25, MASK_ID, N_REGULAR, keys=keys[rows])
        for i, r in enumerate(rows.tolist()):
            assert all(torch.equal(part[i], single[0]) for part, single in zip(batch, alone[r])), r
    assert len({tuple(positions[0].tolist()) for _, positions, _ in alone}) == 40


def masked_rows(micro_batches):
    """The masked rows of a step's micro-batches, each as a tuple of (inputs, positions, labels) lists, sorted."""
    return sorted((tuple(i.tolist()), tuple(p.tolist()), tuple(l.tolist()))
                  for inputs, positions, labels in micro_batches for i, p, l in zip(inputs, positions, labels))


def test_get_batch_returns_the_rows_in_the_order_asked_so_each_key_meets_its_row():
    """Batches pairs the i-th row it asks for with the i-th place's key, so get_batch must give the rows back in the
    order asked (it reads the file in row order): unsorted rows and a row asked twice come back where they were asked."""
    from cram.data import get_batch
    tokens = np.arange(60, dtype=np.uint16).reshape(12, 5)
    rows = np.array([9, 2, 9, 0, 11, 5])
    batch = get_batch(tokens, rows, torch.device("cpu"))
    assert batch.dtype == torch.int64 and torch.equal(batch, torch.from_numpy(tokens[rows].astype(np.int64)))


def test_a_step_s_masks_are_the_same_at_any_micro_batch_and_process_count():
    """Batches.for_step masks each row by the run's seed and the row's number in the run: at micro-batches of 4 and of 8
    in one process, in one micro-batch, and over 2 processes, a step gives the same masked rows, each exactly as
    mask_tokens masks that sequence alone under mask_keys(seed, its number). In the first epoch and across the second's
    start, where a row read twice in one step is masked once per reading."""
    n_rows, T, seed, batch = 500, 16, 3, 32
    tokens = np.random.default_rng(0).integers(0, N_REGULAR, (n_rows, T)).astype(np.uint16)
    meta = dict(special_ids={"[MASK]": MASK_ID}, n_regular=N_REGULAR)
    for consumed in (0, 96, 480):  # 480: the step crosses into epoch 2
        alone = [mask_tokens(torch.from_numpy(tokens[rows_at(s, 1, n_rows, seed)].astype(np.int64)), 0.25, MASK_ID,
                             N_REGULAR, keys=mask_keys(seed, [s])) for s in range(consumed, consumed + batch)]
        want = masked_rows(alone)
        for world, micro in ((1, 4), (1, 8), (1, None), (2, 8), (2, 4)):
            split = micro and split_micro_batches(world, micro, 48, 16, 0.6)
            assert not split or len(micro_batch_sizes(batch, world, *split)) == batch // world // micro
            sizes = micro_batch_sizes(batch, world, *split) if split else [batch // world]
            step = [part for rank in range(world) for part in
                    Batches(tokens, meta, rank, world, torch.device("cpu"), seed).for_step(consumed, sizes, 0.25)]
            assert masked_rows(step) == want, (consumed, world, micro)


def test_keyed_masks_keep_k_distinct_positions_and_the_80_10_10_split():
    """With keys: exactly k distinct positions a row, labels the tokens there, the rest unchanged; in every row 26
    [MASK], 3 random regular tokens and 3 kept of the 32; over 4,000 rows each position's share within 5 standard
    deviations of its binomial expectation."""
    B, T, rate = 4000, 128, 0.25
    idx, keys = keyed(B, T)
    inputs, positions, labels = mask_tokens(idx, rate, MASK_ID, N_REGULAR, keys=keys)
    k = round(rate * T)
    assert positions.shape == labels.shape == (B, k) and torch.equal(labels, idx.gather(1, positions))
    assert (positions.sort(1).values.diff(dim=1) > 0).all()  # distinct in every row
    chosen = torch.zeros_like(idx, dtype=torch.bool).scatter(1, positions, True)
    assert torch.equal(inputs[~chosen], idx[~chosen])
    at_chosen = inputs.gather(1, positions)
    assert ((at_chosen == MASK_ID).sum(1) == 26).all() and torch.equal(at_chosen[:, 29:], labels[:, 29:])
    assert (at_chosen[:, 26:29] < N_REGULAR).all() and (at_chosen[:, 26:29] != labels[:, 26:29]).float().mean() > 0.99
    counts = torch.bincount(positions.flatten(), minlength=T).float()  # each position's times chosen, of B rows
    assert ((counts / B - k / T).abs() < 5 * math.sqrt(k / T * (1 - k / T) / B)).all()


def test_validation_masks_differ_from_training_masks_for_every_seed():
    """A validation row's key has the sign bit set and a training row's never, so no training sequence shares a
    validation row's mask, at any seed: VALIDATION_SEED's too, whose salt validation uses."""
    rows = np.arange(64)
    val_keys = set(mask_keys(train.VALIDATION_SEED, -1 - rows).tolist())
    for seed in (0, 1, train.VALIDATION_SEED, 2 ** 32 - 1):
        assert not val_keys & set(mask_keys(seed, np.arange(10_000)).tolist()), seed
    meta = dict(special_ids={"[MASK]": MASK_ID}, n_regular=N_REGULAR)
    tokens = np.random.default_rng(0).integers(0, N_REGULAR, (64, 32))
    _, val_positions, _ = train.validation_batch(tokens, rows, 0.25, meta)
    keys = mask_keys(train.VALIDATION_SEED, rows)  # training's at that seed, sequence i on row i
    _, train_positions, _ = mask_tokens(torch.from_numpy(tokens), 0.25, MASK_ID, N_REGULAR, keys=keys)
    assert (val_positions != train_positions).any(1).float().mean() > 0.9
