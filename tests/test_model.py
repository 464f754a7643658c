import math

import pytest
import torch
import torch.nn.functional as F

from model import ClassificationHead, CrammedBert, SequenceClassifier, attend, mask_tokens, mean_over, param_groups

TINY = dict(vocab_size=300, seq_len=32, n_layers=2, d_model=64, n_heads=4, d_ffn=256)


def test_reference_parameter_count():
    V, d, L, ffn = 32768, 768, 16, 3072
    per_block = 3 * d * d + d * d + d * ffn + (ffn // 2) * d  # qkv, out, GLU up, down: no biases
    norms = 2 * d * (1 + 2 * L + 1)                            # embedding, two per block, final
    model = CrammedBert(smear=False)  # the paper's model
    assert model.num_params(matmul_only=True) == L * per_block
    assert model.num_params() == V * d + L * per_block + norms + 1  # + the position scale
    assert 119e6 < model.num_params() < 121e6 and 94e6 < model.num_params(True) < 95e6
    # the paper's arithmetic: about 0.62 GFLOP per token for training
    assert model.config.flops_per_token(0.25) == pytest.approx(0.62e9, rel=0.01)


def test_a_switch_that_adds_a_module_leaves_every_other_weight_as_it_was_at_the_same_seed():
    """Each weight is drawn from a generator keyed by the seed and its name (keyed_generator), so a paired ablation
    starts both variants from the same weights wherever they share them: smear on against off (the README's), and a
    switch nobody named, the original BERT's head transform. Before, one more module shifted every draw after it. The
    same seed gives the same model, another seed another, and the draws keep BERT's N(0, 0.02). Building the model takes
    one draw of torch's generator whatever its modules, so dropout's draws after it do not depend on them either."""
    def weights(seed, **switches):
        torch.manual_seed(seed)
        return dict(CrammedBert(**TINY, **switches).named_parameters())
    for plain, switched in ((dict(smear=False), dict(smear=True)), (dict(), dict(head_transform=True)),
                            (dict(position_scheme="learned"), dict(position_scheme="learned", bias=True))):
        a, b = weights(3, **plain), weights(3, **switched)
        shared = a.keys() & b.keys()
        assert len(shared) > 10 and all(torch.equal(a[k], b[k]) for k in shared), [k for k in shared if not torch.equal(a[k], b[k])]
    # building it takes one draw of torch's generator whatever its modules, so dropout's draws follow the seed alone
    draws = []
    for switches in (dict(), dict(smear=False), dict(head_transform=True), dict(bias=True)):
        weights(3, **switches)
        draws.append(torch.rand(4))
    torch.manual_seed(3)
    torch.randint(2 ** 62, ())  # the one draw
    expected = torch.rand(4)
    assert all(torch.equal(d, expected) for d in draws), draws
    again, other = weights(3), weights(4)
    assert all(torch.equal(again[k], weights(3)[k]) for k in again)
    assert not torch.equal(again["tok_emb.weight"], other["tok_emb.weight"])
    assert again["tok_emb.weight"].std().item() == pytest.approx(0.02, rel=0.05)  # 19,200 draws: 0.5% standard error


def test_an_odd_width_trains_with_sinusoidal_positions():
    """ModelConfig allows an odd width (65 with 5 heads of 13): the position table has that width too (its last cosine
    dropped), so the forward and the loss run; before, the table was one column wider and the embedding failed."""
    model = CrammedBert(**dict(TINY, d_model=65, n_heads=5))
    idx = torch.randint(0, 290, (2, 32))
    loss, _ = model(*mask_tokens(idx, 0.25, 299, 296))
    loss.backward()
    assert model.encode(idx).shape == (2, 32, 65) and torch.isfinite(loss)


def test_original_bert_shape_options():
    model = CrammedBert(**TINY, bias=True, norm_first=False, glu=False, position_scheme="learned",
                        head_transform=True, sparse_prediction=False)
    assert model.blocks[0].ffn.down.in_features == 256 and model.blocks[0].attn.qkv.bias is not None
    assert model.decoder_bias is not None and hasattr(model, "pos_emb")
    idx = torch.randint(0, 290, (2, 32))
    loss, _ = model(*mask_tokens(idx, 0.15, 299, 296))
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.quick
def test_sparse_prediction_equals_dense():
    torch.manual_seed(0)
    sparse = CrammedBert(**TINY, sparse_prediction=True).eval()  # eval mode: the correct count too
    dense = CrammedBert(**TINY, sparse_prediction=False).eval()
    dense.load_state_dict(sparse.state_dict())
    idx = torch.randint(0, 296, (8, 32))
    inputs, positions, labels = mask_tokens(idx, 0.25, 299, 296, torch.Generator().manual_seed(1))
    loss_s, correct_s = sparse(inputs, positions, labels)
    loss_d, correct_d = dense(inputs, positions, labels)
    assert loss_s.item() == pytest.approx(loss_d.item(), rel=1e-5)
    assert correct_s.item() == correct_d.item()
    loss_s.backward()
    loss_d.backward()
    torch.testing.assert_close(sparse.tok_emb.weight.grad, dense.tok_emb.weight.grad, rtol=1e-4, atol=1e-7)
    assert sparse.train()(inputs, positions, labels)[1] is None  # training's step skips the count's argmax


def test_a_cpu_attends_in_bfloat16_products_around_a_float32_softmax():
    """On a CPU a bfloat16 attention runs as two bfloat16 products around a float32 softmax (torch's CPU
    flash kernel runs bfloat16's backward as small unpacked products): float32 attention within
    bfloat16's rounding, bfloat16 out, a padded key ignored, under autocast or not, compiled as eager."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16).bfloat16() for _ in range(3))
    mask = torch.rand(2, 1, 1, 32) > 0.2  # padding's mask, as fine-tuning gives it
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = attend(q, k, v, mask, 0.0)
        compiled = torch.compile(attend, fullgraph=True)(q, k, v, mask, 0.0)
    plain = attend(q, k, v, mask, 0.0)
    assert eager.dtype == compiled.dtype == plain.dtype == torch.bfloat16 and torch.equal(eager, plain)
    for got in (eager, compiled):  # bfloat16's rounding of the scores, the probabilities and the output
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)
    changed = torch.where(mask[:, :, 0, :, None], v, v + 100)  # (2, 4, 32, 16): the padded keys' values moved
    assert torch.equal(attend(q, k, changed, mask, 0.0), plain)
    additive = torch.zeros(2, 1, 1, 32).masked_fill(~mask, float("-inf"))  # SDPA's other kind of mask
    assert torch.equal(attend(q, k, v, additive, 0.0), plain)


def test_the_tied_weights_one_node_gives_autograds_gradients():
    """On a CPU under bfloat16 autocast the embedding's lookup and the tied output layer's copy are one node
    (model.TiedLookup): its gradients are autograd's own for the two uses, summed in another order, eager and
    compiled (fullgraph: no graph break)."""
    torch.manual_seed(0)
    model = CrammedBert(vocab_size=300, seq_len=16, n_layers=2, d_model=32, n_heads=2, d_ffn=64)
    idx = torch.randint(0, 296, (4, 16))
    idx[:, :8] = 7  # a token looked up many times: its rows' gradients add up
    positions = torch.rand(4, 16).topk(4, 1).indices

    def plain(inputs, at, labels):  # the two uses apart: what forward ran before the one node
        return model.mlm_loss(model.encode(inputs, positions=at), inputs, at, labels)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = fn(idx, positions, idx.gather(1, positions))
        loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    apart = grads(plain)
    bfloat16 = dict(rtol=2e-2, atol=1e-3)  # compiled, bfloat16's roundings fall elsewhere in the fused kernels
    for fn, tolerance in ((model, {}), (torch.compile(model, fullgraph=True), bfloat16)):
        tied = grads(fn)
        assert tied["tok_emb.weight"][7].abs().sum() > 0  # the repeated token's row
        for name in tied:
            torch.testing.assert_close(tied[name], apart[name], **tolerance)


@pytest.mark.parametrize("smear,pooling", [(False, "mean"), (True, "mean"), (False, "first"), (False, "pair"), (True, "pair")])
def test_padding_does_not_change_classification(smear, pooling):
    torch.manual_seed(0)
    clf = SequenceClassifier(CrammedBert(**TINY, dropout=0.1, smear=smear), num_labels=3, pooling=pooling, sep_id=297).eval()
    if smear:  # trained weights: a [PAD] neighbour would leak in
        torch.nn.init.normal_(clf.encoder.smear.weight, std=0.1)
    short = torch.randint(0, 296, (1, 7))
    short[0, [3, 6]] = 297  # [CLS] a a [SEP] b b [SEP]: the pair head's two texts
    alone = clf(short)
    batch = torch.full((3, 20), 296)  # [PAD] id
    batch[0, :7] = short
    batch[1:] = torch.randint(0, 296, (2, 20))
    mask = batch != 296
    mask[1:] = True
    together = clf(batch, mask)
    torch.testing.assert_close(together[0:1], alone, rtol=1e-5, atol=1e-5)


def test_smear_adds_a_map_of_the_neighbours():
    torch.manual_seed(0)
    model = CrammedBert(**TINY, smear=True)
    idx = torch.randint(0, 296, (2, 32))
    plain = CrammedBert(**TINY)
    plain.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(model.encode(idx), plain.encode(idx))  # zero-initialised: starts as without it
    torch.nn.init.normal_(model.smear.weight, std=0.1)
    w_before, w_after = model.smear.weight.split(64, dim=1)  # (d, 2d): the map of token t-1, of token t+1
    emb = model.tok_emb(idx)
    for t in (0, 5, 31):  # the edges see zeros beyond the sequence
        x = emb[:, t].clone()
        if t > 0:
            x += emb[:, t - 1] @ w_before.t()
        if t < 31:
            x += emb[:, t + 1] @ w_after.t()
        expected = model.emb_norm(x + model.pos_scale * model.pos_table[t])
        torch.testing.assert_close(model.embed(idx)[:, t], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.quick
def test_training_reduces_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    model = CrammedBert(**TINY)
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=3e-3)
    idx = torch.randint(0, 296, (16, 32))
    batch = mask_tokens(idx, 0.25, 299, 296, torch.Generator().manual_seed(0))
    first = None
    for _ in range(30):
        loss, _ = model(*batch)
        first = first or loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_a_checkpoint_from_before_a_switch_loads_as_it_trained():
    """model_args saved before smear existed lack it: the model they describe has none."""
    from model import saved_model_args
    old = CrammedBert(**TINY, smear=False)
    saved = {k: v for k, v in vars(old.config).items() if k != "smear"}  # what such a checkpoint holds
    model = CrammedBert(**saved_model_args(saved))
    model.load_state_dict(old.state_dict())  # strict: the same parameters
    assert model.smear is None and CrammedBert(**saved).smear is not None  # today's default would differ


def test_narrowing_nothing_is_todays_model_and_a_narrowed_layer_is_its_explicit_computation():
    """full_layers = 0 or n_layers, or narrowing only the layer right after the full ones (whose
    context is its own input), is the plain model exactly; a later narrowed layer is queries and
    feed-forward at the masked positions over keys and values of the fixed context."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    shape = dict(TINY, n_layers=3)
    plain = CrammedBert(**shape)
    inputs, positions, labels = mask_tokens(torch.randint(0, 296, (3, 32)), 0.25, 299, 296)
    at = positions.unsqueeze(-1).expand(-1, -1, 64)
    x = plain.embed(inputs)
    for block in plain.blocks:
        x = block(x)
    explicit = F.cross_entropy(plain.logits(plain.final_norm(x).gather(1, at)).view(-1, 300), labels.view(-1))
    for full in (0, 2, 3, 7):
        model = CrammedBert(**shape, full_layers=full)
        model.load_state_dict(plain.state_dict())
        assert torch.equal(model(inputs, positions, labels)[0], explicit), full

    narrowed = CrammedBert(**shape, full_layers=1)  # layers 2 and 3 narrowed
    narrowed.load_state_dict(plain.state_dict())
    context = narrowed.blocks[0](narrowed.embed(inputs))  # (B, T, d)
    h = context.gather(1, at)  # (B, k, d)
    for block in narrowed.blocks[1:]:
        W, C, heads = block.attn.qkv.weight, 64, 4
        q = block.norm1(h) @ W[:C].t()  # (B, k, C)
        k, v = (block.norm1(context) @ W[C:].t()).split(C, dim=-1)  # (B, T, C) each
        split = lambda t: t.view(3, -1, heads, C // heads).transpose(1, 2)  # noqa: E731  (B, heads, len, C/heads)
        scores = split(q) @ split(k).transpose(-1, -2) / (C // heads) ** 0.5  # (B, heads, k, T)
        y = (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(3, -1, C)
        h = h + block.attn.proj(y)
        h = h + block.ffn(block.norm2(h))
    expected = F.cross_entropy(narrowed.logits(narrowed.final_norm(h)).view(-1, 300), labels.view(-1))
    assert narrowed(inputs, positions, labels)[0].item() == pytest.approx(expected.item(), abs=1e-5)
    # over every position (fine-tuning, fill-in, the export) the masked rows are the same values
    assert torch.equal(narrowed.encode(inputs).gather(1, at), narrowed.encode(inputs, positions=positions))
    # and the FLOPs count it: about half of the plain model's at the reference shape with 2 full layers
    ratio = CrammedBert(full_layers=2).config.flops_per_token(0.25) / CrammedBert().config.flops_per_token(0.25)
    assert 0.49 < ratio < 0.53


def test_mean_pooling_reads_every_real_token_and_first_only_the_first():
    torch.manual_seed(0)
    encoder = CrammedBert(**TINY).eval()
    idx = torch.randint(0, 296, (1, 9))
    states = encoder.encode(idx)  # (1, 9, d)
    for pooling, pooled in (("mean", states.mean(1)), ("first", states[:, 0])):
        clf = SequenceClassifier(encoder, num_labels=2, pooling=pooling).eval()
        head = clf.head
        expected = head.classifier(torch.tanh(head.pooler(pooled)))
        torch.testing.assert_close(clf(idx), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="pooling"):
        SequenceClassifier(encoder, num_labels=2, pooling="max")


def test_pair_pooling_reads_each_text_apart_through_padding_and_truncation():
    """'pair': [u, v, |u - v|, u * v] of the two texts' means ([CLS] a [SEP] | b [SEP]), padding in neither; one text
    (a single-sentence task) reads as a pair of itself; and what finetune_glue's encoding truncates keeps both [SEP]s."""
    torch.manual_seed(0)
    encoder, sep, pad = CrammedBert(**TINY).eval(), 297, 296
    clf = SequenceClassifier(encoder, num_labels=2, pooling="pair", sep_id=sep).eval()
    head, seen = clf.head, []
    head.pooler.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    idx = torch.tensor([[1, 5, 6, sep, 7, 8, 9, sep, pad, pad],   # a pair, padded
                        [1, 5, 6, 7, 8, sep, pad, pad, pad, pad]])  # one text, padded
    mask = idx != pad
    states = encoder.encode(idx, mask)  # (2, 10, d)
    clf(idx, mask)
    u, v = states[0, :4].mean(0), states[0, 4:8].mean(0)
    torch.testing.assert_close(seen[0][0], torch.cat([u, v, (u - v).abs(), u * v]), rtol=1e-5, atol=1e-6)
    alone = states[1, :6].mean(0)
    torch.testing.assert_close(seen[0][1], torch.cat([alone, alone, alone * 0, alone * alone]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sep_id"):
        SequenceClassifier(encoder, num_labels=2, pooling="pair")
    # truncated to fit: the longer text gives way, each keeps its [SEP], so the head still finds two texts
    from cram.data import make_encoding  # noqa: E402  (finetune_glue's encoding, on a byte-level tokenizer)
    import finetune_glue
    enc = make_encoding({bytes([b]): b for b in range(256)}, {"[CLS]": 256, "[SEP]": sep})
    ids = finetune_glue.encode_examples(enc, [("a much longer first sentence", "short")], 12, {"[CLS]": 256, "[SEP]": sep})[0]
    assert len(ids) == 12 and [i for i, t in enumerate(ids) if t == sep] == [5, 11] and bytes(ids[6:11]) == b"short"



def test_pair_pooling_of_two_texts_is_the_formula_it_always_was():
    """The pair head's features for one or two texts are exactly the two-text head's from before it read more texts,
    bit for bit: the first text's mean ([CLS] through its [SEP]) against the rest of the real tokens up to the second
    [SEP], v = u where there is no second text. So fine-tuned scores and published figures stand, and the pooler has
    the same 4d inputs, so a seed starts the same weights."""
    torch.manual_seed(0)
    encoder, sep, pad = CrammedBert(**TINY).eval(), 297, 296
    idx = torch.tensor([[1, 5, 6, sep, 7, 8, 9, sep, pad, pad],   # a pair, padded
                        [1, 5, 6, 7, 8, sep, pad, pad, pad, pad],  # one text, padded
                        [1, 5, sep, 7, 8, 9, 10, 11, 12, sep]])    # a pair, the longest row
    real = idx != pad
    states = encoder.encode(idx, real)  # (3, 10, d)
    seps = idx == sep
    second = (seps.cumsum(1) - seps.long() == 1) & real  # the old head's: after the first [SEP], through the second
    u, v = mean_over(states, real & ~second), mean_over(states, second)
    v = torch.where(second.any(1, keepdim=True), v, u)
    before = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)  # (3, 4d)
    for texts in (1, 2):
        head = ClassificationHead(64, 2, pooling="pair", sep_id=sep, texts=texts)
        assert head.pooler.in_features == 4 * 64 and torch.equal(head.pairs(states, real, idx), before)


def test_pair_pooling_reads_each_of_three_texts_apart():
    """Three texts, [CLS] a [SEP] b [SEP] c [SEP] (a choice task's premise and two choices), pool as [u, v, |u - v|,
    u * v] of a against b, then of a against c, 8d wide. A change in b's final states changes only the first block's
    parts that hold v, one in c's only the second block's, one in a's every block's u parts, and one in the padding
    nothing: each text is pooled apart."""
    torch.manual_seed(0)
    d, sep, pad = 4, 9, 0
    head = ClassificationHead(d, 2, pooling="pair", sep_id=sep, texts=3)
    assert head.pooler.in_features == 8 * d
    idx = torch.tensor([[1, 2, sep, 3, 4, 5, sep, 6, sep, pad, pad]])
    real = idx != pad
    states = torch.randn(1, 11, d)
    pooled = head.pairs(states, real, idx)  # (1, 8d)
    a, b, c = states[0, :3].mean(0), states[0, 3:7].mean(0), states[0, 7:9].mean(0)
    torch.testing.assert_close(pooled[0], torch.cat([a, b, (a - b).abs(), a * b, a, c, (a - c).abs(), a * c]))
    changed_parts = {}
    for text, positions in (("a", slice(0, 3)), ("b", slice(3, 7)), ("c", slice(7, 9)), ("padding", slice(9, 11))):
        changed = states.clone()
        changed[0, positions] += 1.0
        moved = (head.pairs(changed, real, idx) - pooled)[0].view(2, 4, d).abs().sum(-1) > 0  # (block, part)
        changed_parts[text] = moved.tolist()
    assert changed_parts == {"a": [[True, False, True, True]] * 2, "b": [[False, True, True, True], [False] * 4],
                             "c": [[False] * 4, [False, True, True, True]], "padding": [[False] * 4] * 2}
    # a row whose third text is missing reads it as the first (a pair of itself), as a missing second text always did
    two = torch.tensor([[1, 2, sep, 3, 4, 5, sep, pad, pad, pad, pad]])
    u, v = states[0, :3].mean(0), states[0, 3:7].mean(0)
    torch.testing.assert_close(head.pairs(states, two != pad, two)[0], torch.cat([u, v, (u - v).abs(), u * v, u, u, u * 0, u * u]))
    # through the whole classifier: the encoding finetune_glue makes for three texts, padded or not, reads the same
    clf = SequenceClassifier(CrammedBert(**TINY).eval(), num_labels=2, pooling="pair", sep_id=297, texts=3).eval()
    row = torch.tensor([[1, 5, 297, 6, 7, 297, 8, 297]])
    padded = torch.cat([row, torch.full((1, 4), 296)], 1)
    torch.testing.assert_close(clf(padded, padded != 296), clf(row), rtol=1e-5, atol=1e-6)

def alibi(self, T, padding_mask=None):
    """CrammedBert.attention_mask as a fork's ALiBi makes it: a float bias (1, H, T, S) falling with the distance, at a
    slope per head, padding's keys -inf."""
    slopes = 2.0 ** -torch.arange(1.0, self.config.n_heads + 1)  # (H,)
    bias = -slopes[:, None, None] * (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()  # (H, T, S)
    return bias[None] if padding_mask is None else bias[None].masked_fill(~padding_mask[:, None, None, :], -math.inf)


def test_a_position_bias_built_once_reaches_every_layer_narrowed_ones_too(monkeypatch):
    """A fork's position bias is one method, attention_mask: it changes what every layer computes, and a narrowed layer
    (full_layers), whose queries are the masked positions alone, gets the bias's rows at them (query_rows), so its values
    there are those it computes over every position, as without the bias."""
    torch.manual_seed(0)
    model = CrammedBert(**dict(TINY, n_layers=3), full_layers=1)
    inputs, positions, labels = mask_tokens(torch.randint(0, 296, (3, 32)), 0.25, 299, 296)
    at = positions.unsqueeze(-1).expand(-1, -1, 64)
    plain = model.encode(inputs)
    monkeypatch.setattr(CrammedBert, "attention_mask", alibi)
    biased = model.encode(inputs)
    assert not torch.allclose(biased, plain, atol=1e-3)
    torch.testing.assert_close(model.encode(inputs, positions=positions), biased.gather(1, at), rtol=1e-5, atol=1e-5)


SWITCHES = [{}, dict(glu=False), dict(smear=False), dict(full_layers=1), dict(bias=True), dict(head_transform=True),
            dict(n_heads=2), dict(d_model=96, d_ffn=128), dict(sparse_prediction=False), dict(norm_first=False),
            dict(position_scheme="learned")]


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_the_declared_cost_is_the_counted_cost(switch):
    """ModelConfig's hand-kept cost against the model's real forward and backward, for every switch: a forker's
    new block or attention that the formulas miss fails here, not in a run's budget, MFU or memory check.
    - FLOPs: torch's FlopCounterMode counts every matmul (mm, addmm, bmm) of a step, attention's two products by
      the math kernel (the counter knows no CPU flash kernel; a flash backward recomputes the scores, which the
      convention of 3 x forward leaves out). flops_per_token counts exactly those, so they agree to the FLOP.
    - Parameters: the budget's parameters_at_least is the embedding and every Linear weight.
    - Memory: step_bytes is a lower estimate of the activations a step keeps for its backward, here counted by
      autograd's saved-tensor hooks (each storage once, parameters not); it leaves out the norms' and the
      element-wise ops' inputs, which add a third to a half again at this shape (measured 1.29-1.46 across the
      switches): a new layer that keeps much more than its matmuls' inputs goes past 1.6."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    config = {**TINY, "seq_len": 64, "n_layers": 3, **switch}
    torch.manual_seed(0)
    model = CrammedBert(**config)
    batch = mask_tokens(torch.randint(0, 296, (4, 64)), 0.25, 299, 296)  # (inputs, positions, labels)
    tokens = batch[0].numel()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(*batch)[0].backward()
    assert counter.get_total_flops() / tokens == model.config.flops_per_token(0.25)

    assert model.config.parameters_at_least() == model.num_params(matmul_only=True) + model.tok_emb.weight.numel()
    in_blocks = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, torch.nn.Linear))
    assert model.config.n_layers * model.config.layer_weights() == in_blocks  # the budget's size of a shape

    kept, params = {}, {p.untyped_storage().data_ptr() for p in model.parameters()}
    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(*batch)
    per_sequence, estimate = sum(kept.values()) / len(batch[0]), model.config.step_bytes(0.25, 4)
    assert estimate <= per_sequence <= 1.6 * estimate, per_sequence / estimate


def test_mask_tokens_docstring_example_holds():
    """mask_tokens' docstring shows a row of 30 words masked with the key 0 at the rate 0.25: k = round(7.5) = 8, six
    [MASK], one random word and one kept, at the positions and with the labels it lists."""
    words = ("the old man saw a red house by the river in the morning and then he walked home before the storm came over "
             "the green hill to the sea [SEP]").split()
    vocab = sorted(set(words) - {"[SEP]"})
    sep, mask = len(vocab), len(vocab) + 1  # the special ids come after the regular ones
    idx = torch.tensor([[vocab.index(w) if w in vocab else sep for w in words]])
    inputs, positions, labels = mask_tokens(idx, 0.25, mask, len(vocab), keys=torch.tensor([0]))
    name = {**dict(enumerate(vocab)), sep: "[SEP]", mask: "[MASK]"}
    assert positions[0].tolist() == [15, 4, 11, 17, 16, 7, 13, 14]
    assert [name[i] for i in labels[0].tolist()] == "he a the home walked by and then".split()
    assert " ".join(name[i] for i in inputs[0, :19].tolist()) == ("the old man saw [MASK] red house [MASK] the river in "
                                                                "[MASK] morning storm then [MASK] [MASK] [MASK] before")
    assert torch.equal(inputs[0, 19:], idx[0, 19:])  # "the storm ..." past the masked positions: unchanged
