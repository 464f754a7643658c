"""The crammed-BERT encoder (Geiping & Goldstein 2022), its masked-language-model objective, the optimizers and the
training step, and the classification head that GLUE fine-tuning adds.

Every architectural choice is a field of ModelConfig. Its defaults are the crammed recipe; config/bert_original.py
sets the original BERT's. cram's one addition to the recipe's model is `smear`: each position's embedding also sees its two
neighbours' (config/recipe_reference.py turns it off)."""
import collections
import dataclasses
import math
import zlib
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model, n_heads, bias, dropout):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout

    def forward(self, x, attn_mask=None, context=None):
        """Self-attention of x (B, T, C). With `context` (B, S, C), x's queries attend to the context's keys and values
        instead: a narrowed layer's positions read the last full layer (see CrammedBert.encode)."""
        B, T, C = x.shape
        if context is None:
            q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
        else:  # the same weights, split: queries from x, keys and values from the context
            bias = (None, None) if self.qkv.bias is None else self.qkv.bias.split([C, 2 * C])
            q = F.linear(x, self.qkv.weight[:C], bias[0]).view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            kv = F.linear(context, self.qkv.weight[C:], bias[1])  # (B, S, 2C)
            k, v = kv.view(B, context.shape[1], 2, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, S, hd) each
        y = attend(q, k, v, attn_mask, self.dropout if self.training else 0.0)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # heads merged: (B, T, C)


def attend(q, k, v, attn_mask, dropout_p):
    """Scaled dot-product attention of q, k, v (B, H, T, d_head). attn_mask is F.scaled_dot_product_attention's: a
    boolean mask is True where a key takes part. A GPU, and a CPU in float32, run PyTorch's fused kernel (flash
    attention where it applies). A CPU in bfloat16 runs two bfloat16 matmuls around a float32 softmax instead, which
    is faster there than PyTorch's bfloat16 CPU kernel (BENCHMARKS.md, "The CPU's precision by a timing")."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # q scaled rather than the scores: inductor's softmax of scaled scores adds a pass of finiteness checks
        scores = ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).float()  # (B, H, T, S)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
        return F.dropout(scores.softmax(-1), dropout_p).to(v.dtype) @ v  # (B, H, T, d_head)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


class FeedForward(nn.Module):
    """The feed-forward block: up-projection, GELU, down-projection. With glu=True (the recipe's) the up-projection's
    d_ffn outputs are split into a gate half and a value half, gelu(gate) * value, so the hidden width is d_ffn / 2
    and the block has 3/4 of the plain MLP's parameters at the same d_ffn."""

    def __init__(self, d_model, d_ffn, bias, glu):
        super().__init__()
        self.glu = glu
        self.up = nn.Linear(d_model, d_ffn, bias=bias)
        self.down = nn.Linear(d_ffn // 2 if glu else d_ffn, d_model, bias=bias)

    def forward(self, x):
        if self.glu:
            gate, value = self.up(x).chunk(2, dim=-1)
            return self.down(F.gelu(gate) * value)
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """One transformer layer of a ModelConfig `c` (off-load mode builds its templates from it too)."""

    def __init__(self, c):
        super().__init__()
        self.norm_first = c.norm_first
        self.norm1 = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.attn = Attention(c.d_model, c.n_heads, c.bias, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.ffn = FeedForward(c.d_model, c.d_ffn, c.bias, c.glu)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x, attn_mask=None, context=None):
        """context: see Attention (pre-norm normalises it with this layer's norm, as it would x)."""
        if self.norm_first:
            context = None if context is None else self.norm1(context)
            x = x + self.drop(self.attn(self.norm1(x), attn_mask, context))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, attn_mask, context)))
        return self.norm2(x + self.drop(self.ffn(x)))


@dataclasses.dataclass
class ModelConfig:
    """Every model setting, declared once. Each field except vocab_size and seq_len, which come from the data, is
    also a train.py setting (--key=value). A checkpoint saves them all as `model_args`.
    A fork adds a new switch as a field here, and uses it below. If the switch is on by default, also add it to
    MISSING_FIELD_DEFAULTS as off, so that older checkpoints load as they were trained. If it changes the work per
    token, also add it to flops_per_token (the budget's pick, the MFU, the CPU's warning) and step_bytes (the memory
    check). The defaults are the reference crammed BERT's shape (about 120M parameters) and recipe, but for smear, which
    is cram's and on (config/recipe_reference.py turns it off). train.py declares the four shape fields again, with 0
    meaning that the budget picks them."""
    vocab_size: int = 32768    # >= 5: train.py: from the data (prepare.py's meta.json), not a setting
    seq_len: int = 128         # >= 2: train.py: from the data too (prepare.py --seq_len sets it)
    n_layers: int = 16         # >= 1
    d_model: int = 768         # >= 1: a multiple of n_heads
    n_heads: int = 12          # >= 1
    d_ffn: int = 3072          # >= 2: the feed-forward's up-projection width (with glu, halves: a hidden width of d_ffn / 2)
    bias: bool = False         # biases in the blocks' linear layers and on the output layer's logits
    norm_first: bool = True    # pre-LayerNorm (False: the original post-norm)
    glu: bool = True           # gated GELU feed-forward
    position_scheme: str = "sinusoidal"  # {sinusoidal, learned}: scaled sinusoidal, or learned (the original BERT's)
    head_transform: bool = False  # the original BERT's dense + GELU + LayerNorm before the output layer
    norm_eps: float = 1e-12    # > 0
    dropout: float = 0.0       # [0, 1): the reference configures 0.1 but pretrains with the model in eval mode, so in effect with none
    sparse_prediction: bool = True  # only the masked positions reach the output layer
    smear: bool = True         # each position also gets a learned map of its neighbours' embeddings (cram's)
    full_layers: int = 0       # >= 0: if below n_layers, the later layers are narrowed to the masked positions (encode)

    def __post_init__(self):  # what the ranges beside the fields cannot say
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        if self.glu and self.d_ffn % 2:
            raise ValueError(f"d_ffn={self.d_ffn} must be even with glu (its gate and value halves)")

    @classmethod
    def from_settings(cls, settings, **data):
        """The model `settings` (a configured dict) and `data` (vocab_size, seq_len) ask for, or a one-line error."""
        fields = {f.name for f in dataclasses.fields(cls)} - set(data)
        try:
            return cls(**{k: v for k, v in settings.items() if k in fields}, **data)
        except ValueError as e:
            raise SystemExit(f"error: {e}")

    def layer_weights(self):
        """One layer's matmul weights: qkv and out, the feed-forward's up and down."""
        return 4 * self.d_model ** 2 + self.d_model * self.d_ffn + (self.d_ffn // 2 if self.glu else self.d_ffn) * self.d_model

    def full_layer_count(self):
        """How many layers see every position: full_layers where it narrows the later ones, else all."""
        return self.full_layers if 0 < self.full_layers < self.n_layers else self.n_layers

    def parameters_at_least(self):
        """The parameters, slightly undercounted: the tied embedding and every matmul's weights, without norms,
        biases and positions."""
        matmuls = self.n_layers * self.layer_weights() + (2 * self.smear + self.head_transform) * self.d_model ** 2
        return self.vocab_size * self.d_model + matmuls

    def step_bytes(self, mask_rate, value_bytes, training=True, offload=False):
        """A lower estimate of the bytes one sequence adds to a step's memory. In training, each layer keeps at each
        position every matmul's input and q, k and v: 6 x d_model plus 1.5 x d_ffn values of `value_bytes` each. It
        also keeps the float32 residual. Inference keeps only one layer's widest tensors. Both keep the float32 logits
        of the predicted positions, of which there are none at mask_rate 0. Attention scores are not counted, since
        the fused kernels keep none (see attention_mask). A narrowed layer keeps all that at the masked positions only,
        and only its keys and values at the others. Off-load mode keeps each block's input and recomputes one block at
        a time."""
        k = masked_count(mask_rate, self.seq_len) if mask_rate > 0 else 0
        predicted = k if self.sparse_prediction else self.seq_len * (mask_rate > 0)  # positions with logits
        logits = predicted * self.vocab_size * 4
        if not training:
            return int(self.seq_len * ((3 * self.d_model + self.d_ffn) * value_bytes + 4 * self.d_model) + logits)
        per_position = (6 * self.d_model + 1.5 * self.d_ffn) * value_bytes + 4 * self.d_model  # a layer's
        if offload:
            return int(self.seq_len * (self.n_layers * self.d_model * value_bytes + per_position) + logits)
        full = self.full_layer_count()
        kept = predicted if self.sparse_prediction and mask_rate > 0 else self.seq_len  # a narrowed layer's positions
        narrowed = kept * per_position + (self.seq_len - kept) * 2 * self.d_model * value_bytes
        return int(self.seq_len * full * per_position + (self.n_layers - full) * narrowed + logits)

    def flops_per_token(self, mask_rate):
        """Training FLOPs per input token: 3 times the forward's (the backward costs about twice the forward). In the
        forward, a matmul costs 2 FLOPs (a multiply and an add) per weight per position it runs at. It counts the
        blocks' weights, the attention's scores and values, smear's map, and the tied output layer at the predicted
        positions, a share k / T of them (masked_count). Every term below is forward FLOPs per input token. At 16 x 768,
        a vocabulary of 32768 and mask_rate 0.25 they are: the blocks 188.7M, attention 6.3M, the output layer 12.6M and
        smear 2.4M, 210.0M in all, so 0.630 GFLOP per token for training. (Narrowed layers, off by default, compute keys
        and values at every position and the rest at the masked positions only.)"""
        k = masked_count(mask_rate, self.seq_len) if mask_rate > 0 else 0
        predicted = k / self.seq_len if self.sparse_prediction else 1.0  # the share of positions predicted
        full = self.full_layer_count()
        query_layers = full + (self.n_layers - full) * predicted  # full layers' worth of queries
        attention = 2 * 2 * query_layers * self.seq_len * self.d_model  # q.k and the weights times v, over T keys
        output_layer = 2 * self.vocab_size * self.d_model * predicted
        head = 2 * self.d_model ** 2 * predicted if self.head_transform else 0  # its dense layer
        kv_weights, layer_weights = 2 * self.d_model ** 2, self.layer_weights()  # weights (a narrowed layer: kv everywhere)
        narrowed = kv_weights + (layer_weights - kv_weights) * predicted
        blocks = 2 * (full * layer_weights + (self.n_layers - full) * narrowed)
        smear = 2 * 2 * self.d_model ** 2 if self.smear else 0  # a (2d, d) matmul
        return 3 * (blocks + attention + output_layer + head + smear)


DATA_FIELDS = ("vocab_size", "seq_len")  # set by the prepared data, never by a setting
SHAPE_FIELDS = ("n_layers", "d_model", "n_heads", "d_ffn")  # what the budget picks where train.py leaves them 0
MISSING_FIELD_DEFAULTS = {"smear": False}  # missing from a checkpoint's model_args: the switch did not exist yet (off)
REPLACED_FIELDS = {  # an older checkpoint's field that others replaced -> the new fields its value means
    "learned_positions": lambda learned: dict(position_scheme="learned" if learned else "sinusoidal")}
# The values that leave a switch off. A checkpoint's setting or model field that this cram lacks (a fork's, or a newer
# cram's) is dropped where it holds one of them, since the run then ran as this cram runs; where it is on, it is
# refused.
OFF = (None, False, 0, "")


def saved_model_args(model_args):
    """A checkpoint's model_args as this version names them: a switch added since is off, a replaced field becomes the
    new ones, and a field this version lacks is dropped where it is off (files.model_args_problem refuses it on)."""
    args = {**MISSING_FIELD_DEFAULTS, **model_args}
    for old, new in REPLACED_FIELDS.items():
        args.update(new(args.pop(old)) if old in args else {})
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    return dataclasses.asdict(ModelConfig(**{k: v for k, v in args.items() if k in known or v not in OFF}))


SHAPES = {"reference": dict(n_layers=16, d_model=768, n_heads=12, d_ffn=3072, vocab_size=32768),  # the benchmarks'
          "small": dict(n_layers=4, d_model=256, n_heads=4, d_ffn=1024, vocab_size=8192)}  # the CPU quickstart's


def sinusoid_table(seq_len, d_model):
    freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    angles = torch.arange(seq_len).unsqueeze(1) * freq  # (T, d / 2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # sines at even columns, cosines at odd
    return table[:, :d_model]  # (T, d): an odd width drops the last cosine


def keyed_generator(base, name):
    """The generator a weight named `name` is drawn from: seeded by `base` (drawn from the run's seed) and the name. So
    at one seed a weight starts the same whatever other modules the model has (where its shape is the same: glu=False
    gives ffn.down another shape, so other values), and a switch that adds one (smear, say) leaves the rest of an
    ablation's starting point as it was (the masks are keyed by row the same way)."""
    return torch.Generator().manual_seed(base ^ zlib.crc32(name.encode()))


@torch.no_grad()
def draw_normal(weight, generator=None, std=0.02):
    """Fills `weight` from N(0, std). With a `generator` the values are drawn on the CPU in float32, so that every device
    and precision gets the same ones; without one, from torch's generator (nn.init's, which transformers' loading
    guards). A weight on the meta device (shapes only) is left alone."""
    if weight.is_meta:
        return
    if generator is None:
        nn.init.normal_(weight, 0.0, std)
    else:
        weight.copy_(torch.randn(weight.shape, generator=generator, device="cpu", dtype=torch.float32) * std)


class CrammedBert(nn.Module):
    """The encoder and its MLM output layer, which shares the token embedding's weights (tied). Built from any
    ModelConfig fields, CrammedBert(**settings); `model.config` holds them all."""

    def __init__(self, **settings):
        super().__init__()
        # Each weight is drawn from its own generator, keyed by the weight's name and by one number drawn here from
        # torch's generator (keyed_generator). The modules' constructors draw from torch's generator too, so its state
        # after this one draw is put back at the end. What draws from it next (dropout) then depends on the seed alone,
        # not on which modules a variant has. (This is the CPU's generator; a model built on a GPU moves the GPU's.)
        base = int(torch.randint(2 ** 62, (), device="cpu"))
        after_base = torch.get_rng_state()
        self.config = c = ModelConfig(**settings)
        vocab_size, seq_len, d_model, norm_eps = c.vocab_size, c.seq_len, c.d_model, c.norm_eps
        self.sparse_prediction = c.sparse_prediction
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        if c.position_scheme == "learned":
            self.pos_emb = nn.Parameter(torch.zeros(seq_len, d_model))
        else:  # scaled sinusoidal: a fixed table times one learned scalar, which starts at d_model ** -0.5 (the
            # reference's): a position's vector then starts at length 0.71 (d_model / 2 sine-cosine pairs)
            self.register_buffer("pos_table", sinusoid_table(seq_len, d_model), persistent=False)
            self.pos_scale = nn.Parameter(torch.tensor(d_model ** -0.5))
        # smear: each token's embedding also gets a learned linear map of its two neighbours' embeddings, so the first
        # layer already sees local context (a "token shift", as in RWKV and modded-nanogpt, here in both directions)
        self.smear = nn.Linear(2 * d_model, d_model, bias=False) if c.smear else None
        self.emb_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.emb_drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        # pre-norm leaves the residual stream un-normalised, so it needs a final norm
        self.final_norm = nn.LayerNorm(d_model, eps=norm_eps) if c.norm_first else nn.Identity()
        # the original BERT's transform before the output layer (its dense layer has a bias, as BERT's does)
        self.head = (nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(), nn.LayerNorm(d_model, eps=norm_eps))
                     if c.head_transform else nn.Identity())
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size)) if c.bias else None
        for name, module in self.named_modules():
            self._init_weights(module, keyed_generator(base, name))
        if c.position_scheme == "learned":
            draw_normal(self.pos_emb, keyed_generator(base, "pos_emb"))
        if c.smear:
            nn.init.zeros_(self.smear.weight)  # starts as the model without it
        torch.set_rng_state(after_base)

    @staticmethod
    def _init_weights(module, generator=None):
        """BERT's initialisation, applied to every module at construction: each Linear and Embedding weight drawn from
        N(0, 0.02), each bias zero. LayerNorms keep PyTorch's ones and zeros. There is no depth-scaled init of the
        residual branches (GPT-2's), as the reference has none. A fork's new module gets this if it is built in __init__
        before the loop at its end; the exceptions (learned positions, smear at zero) are set after it, and the position
        scale and the decoder bias are parameters it does not touch. The model passes each module its own `generator`
        (keyed_generator); the GLUE head (ClassificationHead) and the exported model's heads draw from torch's."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            draw_normal(module.weight, generator)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed(self, idx, padding_mask=None, tokens=None):
        """What enters the first block (B, T, d): the token embeddings, each plus smear's map of its neighbours, plus
        the position embeddings, then LayerNorm and dropout. `tokens` holds the token embeddings when forward has
        looked them up already (TiedLookup, on a CPU under autocast)."""
        T = idx.shape[1]
        pos = self.pos_emb[:T] if self.config.position_scheme == "learned" else self.pos_scale * self.pos_table[:T]
        x = self.tok_emb(idx) if tokens is None else tokens  # (B, T, d)
        if self.smear is not None:
            n = x if padding_mask is None else x * padding_mask.unsqueeze(-1)  # padding is no neighbour
            before = F.pad(n[:, :-1], (0, 0, 1, 0))  # (B, T, d): token t-1 at t, zeros at the start
            after = F.pad(n[:, 1:], (0, 0, 0, 1))    # token t+1 at t, zeros at the end
            x = x + self.smear(torch.cat([before, after], dim=-1))  # (B, T, 2d) -> (B, T, d)
        return self.emb_drop(self.emb_norm(x + pos))

    def encode(self, idx, padding_mask=None, positions=None, tokens=None):
        """The final hidden states (B, T, d), or only those at `positions` (B, k) as (B, k, d). padding_mask (B, T) is
        True at real tokens (fine-tuning pads; pretraining does not, and passes None).
        With full_layers below n_layers, the later layers are narrowed (NarrowBERT, Li et al. 2023): they update only
        the positions given, which attend to the last full layer's output. A position's result then does not depend on
        which others are updated, so pretraining updates the masked positions alone and fine-tuning updates all."""
        x = self.embed(idx, padding_mask, tokens)
        attn_mask, full = self.attention_mask(idx.shape[1], padding_mask), self.config.full_layer_count()
        for block in self.blocks[:full]:
            x = block(x, attn_mask)
        context = x
        x = x if positions is None else at_positions(x, positions)  # (B, k, d) with positions
        for block in self.blocks[full:]:
            x = block(x, query_rows(attn_mask, positions), context)
        return self.final_norm(x)

    def attention_mask(self, T, padding_mask=None):
        """The attention mask every layer uses, built once a forward. Pretraining has no padding, so this is None and
        attention runs unmasked. Fine-tuning's padded batches get (B, 1, 1, T), True at real keys.
        A fork's position bias, such as ALiBi, would go here as a float mask. Give it a 2-D shape (T, S) or a 4-D
        shape (B or 1, H or 1, T or 1, S). PyTorch's fused kernels take those and keep no (B, H, T, S) scores, as
        step_bytes assumes. A 3-D mask falls back to the unfused kernel, which keeps the scores and uses 1.7x the
        memory. test_model checks this cost."""
        return None if padding_mask is None else padding_mask[:, None, None, :]

    def logits(self, hidden, weight=None):
        """The scores over the vocabulary for hidden states (..., d): the output layer is the token embedding's weight,
        transposed (tied). `weight` is that same weight when forward has already cast it (TiedLookup)."""
        logits = self.head(hidden) @ (self.tok_emb.weight if weight is None else weight).t()
        return logits if self.decoder_bias is None else logits + self.decoder_bias

    def forward(self, inputs, positions, labels):
        """The MLM loss at the masked positions, and in eval mode how many of them the model predicts right (None in
        training mode). With sparse prediction only the masked positions go through the output layer; without it
        every position does and the others are ignored, as in the original BERT. A change to the loss belongs in
        mlm_loss, which off-load mode calls too; a change to which tokens are predicted belongs in mask_tokens."""
        tokens = weight = None
        # On a CPU under autocast, one autograd function (TiedLookup) serves both uses of the tied weight, the lookup
        # and the output layer. That only makes the step faster: the result is the same up to rounding (its backward
        # adds the two gradients in another order).
        if inputs.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            tokens, weight = TiedLookup.apply(self.tok_emb.weight, inputs, torch.get_autocast_dtype("cpu"))
        hidden = self.encode(inputs, positions=positions if self.sparse_prediction else None, tokens=tokens)
        return self.mlm_loss(hidden, inputs, positions, labels, weight)

    def mlm_loss(self, hidden, inputs, positions, labels, weight=None):
        """forward's loss and correct count, computed from the final hidden states. These are (B, k, d) at the masked
        positions with sparse prediction, else (B, T, d). The loss is the mean of -log p(the original token) over the
        B x k masked positions, each weighted the same, whatever it became (an untrained model's is a little under
        ln(vocab_size): 8.8 against ln 8,192 = 9.0 in the README's quickstart). Every loss the run reports or checks
        comes from here:
        training's (which the spike and divergence checks read), validation's and the check before a save. So a term a
        fork adds here moves the validation loss too, and recipes with and without it no longer compare by that loss; a
        term for training alone can be guarded by self.training, since validation runs in eval mode."""
        targets = labels if self.sparse_prediction else torch.full_like(inputs, -100).scatter(1, positions, labels)
        logits = self.logits(hidden, weight).float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        correct = None if self.training else (logits.argmax(-1) == targets).sum()  # an argmax: a pass over V
        return loss, correct

    def num_params(self, matmul_only=False):
        """All parameters, or only the weights of the Linear layers (the blocks, the head and smear)."""
        params = (m.weight for m in self.modules() if isinstance(m, nn.Linear)) if matmul_only else self.parameters()
        return sum(p.numel() for p in params)


class TiedLookup(torch.autograd.Function):
    """The tied weight's two uses on a CPU under autocast, as one autograd node: the embedding lookup weight[idx] and
    the output layer's copy of the weight in `dtype`. Its backward adds the lookup's gradient into the output layer's
    in place, where autograd would sum two (V, d) gradients in two more passes over them."""

    @staticmethod
    def forward(ctx, weight, idx, dtype):
        ctx.save_for_backward(idx)
        return F.embedding(idx, weight), weight.to(dtype)  # (B, T, d), (V, d)

    @staticmethod
    def backward(ctx, grad_tokens, grad_weight):
        idx, = ctx.saved_tensors
        tokens = grad_tokens.reshape(-1, grad_tokens.shape[-1]).float()  # (B * T, d)
        return grad_weight.float().index_add_(0, idx.reshape(-1), tokens), None, None


# -----------------------------------------------------------------------------
# The objective, in the order a step runs it: Masking (its settings), masked_count (how many positions a row masks),
# mask_tokens (which, and what they become; row_noise and mix32 draw them), then at_positions and query_rows, which the
# forward uses to read the masked positions. mlm_loss, in CrammedBert, is the cross-entropy at those positions, and
# Trainer.backward (below) weights the micro-batches into the step's loss. What a fork's change to the step touches
# besides the line it changes is listed at the end of this section.


MASK_RATE = 0.25  # the crammed recipe's share of each row's tokens to predict: train.py's default, what benchmarks time


@dataclasses.dataclass(frozen=True)
class Masking:
    """The objective's settings. There is one, the masking rate; the 80/10/10 rule is fixed in mask_tokens.
    from_settings reads them from train.py's settings of the same names. A fork's new one (a span length, say) is a
    field here, its use in mask_tokens and a global in train.py. Validation, the memory probe and bench.py pass
    mask_tokens only a rate, so a fork's new field keeps its default there."""
    mask_rate: float = MASK_RATE  # (0, 1): share of each row's tokens to predict (train.py's schedule sets it each step)

    @classmethod
    def from_settings(cls, settings):
        return cls(**{f.name: settings[f.name] for f in dataclasses.fields(cls) if f.name in settings})


def masked_count(mask_rate, seq_len):
    """How many positions of a row of seq_len tokens mask_tokens masks at mask_rate: mask_rate x seq_len rounded by
    Python's round (a half goes to the even number), and at least one. The memory estimate and the FLOP count use it
    too, so at the same rate all three agree."""
    return max(1, round(mask_rate * seq_len))


def mask_tokens(idx, masking, mask_id, n_regular, generator=None, keys=None):
    """BERT's corruption of each row of idx (B, T). Returns (inputs, positions, labels): the corrupted rows (B, T), the
    k masked positions of each row (B, k), and the original tokens at those positions (B, k).

    Every row has exactly k = masked_count(mask_rate, T) masked positions, so at a given rate every micro-batch of a
    given size has the same shape and torch.compile builds one graph for it. The positions are a random subset of the
    row, in random order, and any position may be masked, a [SEP] included. As in the reference code (Geiping and
    Goldstein's), the first 80% of them become [MASK], the next 10% a random regular token (which may be the original),
    and the rest keep their token: by count, where BERT and RoBERTa draw each position's fate at random. Of 32 that is
    26, 3 and 3; a small k splits coarsely (5 gives 4, 0 and 1, since Python's round takes 4.5 to 4). Regular tokens are
    the ids below n_regular, and the special ones come after them (the reference draws from the whole vocabulary); a
    random id is the row's noise modulo n_regular, uniform but for a bias of n_regular / 2**32. The k predictions of a
    row share its context, so a step's rows x k predictions come from `rows` independent rows.

    For example, a row of 30 words, each one token, with the key 0 at the rate 0.25 (tests/test_model.py checks it):
        row:     the old man saw a red house by the river in the morning and then he walked home before the storm ...
        inputs:  the old man saw [MASK] red house [MASK] the river in [MASK] morning storm then [MASK] [MASK] [MASK]
                 before the storm ...
        positions (in the order drawn): 15, 4, 11, 17, 16, 7, 13, 14; labels: he a the home walked by and then
    k = round(0.25 x 30) = round(7.5) = 8. The first 6 become [MASK], the 7th ("and") a random word ("storm"), and the
    8th ("then") stays as it is. The loss asks for the 8 labels at the 8 positions.

    Training and validation pass `keys`, one int64 key per row (B,). A row's random values then come from its key alone
    (row_noise), so the row is masked the same way in any batch and on any device. Without keys, the values are drawn
    batch by batch from `generator`, or from torch's own if it is None. `masking` is a Masking or just its rate."""
    masking = masking if isinstance(masking, Masking) else Masking(mask_rate=masking)
    B, T = idx.shape
    k = masked_count(masking.mask_rate, T)
    if keys is None:
        scores = torch.rand(B, T, device=idx.device, generator=generator)
        random_ids = torch.randint(0, n_regular, (B, k), device=idx.device, generator=generator)
    else:
        noise = row_noise(keys.to(idx.device), T + k)  # (B, T + k)
        # (B, T): each position's score is its noise times T plus its index. The noise is an integer, so this orders
        # positions by their noise, and two positions whose noise is equal by their index: no two scores in a row tie.
        scores = noise[:, :T] * T + torch.arange(T, device=idx.device)  # int64: 2**32 x T fits
        random_ids = noise[:, T:] % n_regular  # (B, k)
    positions = scores.topk(k, dim=1).indices  # (B, k): the k highest scores, highest first (the draw's order)
    labels = idx.gather(1, positions)
    # The draw's order is random, so which masked positions get [MASK], a random token or their own is random too.
    slot = torch.arange(k, device=idx.device)  # (k,): each masked position's place in the draw's order
    replacement = torch.where(slot < round(0.8 * k), mask_id,
                              torch.where(slot < round(0.9 * k), random_ids, labels))  # (B, k)
    return idx.scatter(1, positions, replacement), positions, labels


MASK32, GOLDEN = 0xFFFFFFFF, 0x9E3779B9  # 32 bits, and 2**32 over the golden ratio (an arbitrary odd constant)


def mix32(h):
    """Thomas Mueller's 32-bit integer hash (a multiply-xorshift mix like murmur3's finalizer): a bijection of
    [0, 2**32) in which each input bit flips each output bit about half the time. For an int or an int64 tensor; the
    products stay below 2**59, so int64 never overflows and every device computes the same bits. A port needs the
    same widths: 64-bit integers, or unsigned 32-bit ones whose products wrap (signed int32, JAX's default, shifts in
    the sign bit and gives other bits)."""
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & MASK32
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & MASK32
    return h ^ (h >> 16)


def row_noise(keys, n):
    """n pseudo-random integers in [0, 2**32) for each row, as a (B, n) tensor. `keys` (B,) holds one int64 key per
    row. Each value depends only on its row's key and its column, as in a counter-based generator. Only integer
    operations are used, so any device and any batch give a row the same values. A row's hash applies mix32 to the
    high 32 bits of its key, then again after mixing in the low 32 bits. Each value mixes that hash with a hash of
    the column index. mask_tokens reads the first T columns to rank a row's positions and the next k as its random
    ids (uniform to within n_regular / 2**32); a fork that needs more random values per row asks for more columns."""
    h = mix32(mix32(((keys >> 32) & MASK32) ^ GOLDEN) ^ (keys & MASK32))  # (B,)
    return mix32(h[:, None] ^ mix32(torch.arange(n, device=keys.device) + GOLDEN))  # (B, n)


def query_rows(mask, positions):
    """A 4-D attn_mask for queries at `positions` (B, k) alone, a narrowed layer's: its rows there, where it has a row
    per query (a position bias); else the mask itself."""
    if mask is None or positions is None or mask.shape[-2] == 1:
        return mask
    rows = positions[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[-1])  # (B, H or 1, k, S)
    return mask.expand(len(positions), -1, -1, -1).gather(2, rows)


def at_positions(hidden, positions):
    """The rows of hidden (B, T, d) at positions (B, k): (B, k, d)."""
    return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


# What a fork's change to the objective or the step touches besides the line it changes:
# - A batch is (inputs, positions, labels) with the same count k of masked positions in every row. Batches,
#   Validation, micro_batch_weights, step_bytes, flops_per_token, narrowed layers and off-load mode
#   all rely on that fixed k.
# - The forward and mlm_loss run compiled as one graph of fixed shapes, so a change there may not read a value on
#   the host (.item()) or make a shape that depends on the data.
# - Every check reads the same loss: the spike check, diverged (ln(vocab_size) + 1), the check before a save (an
#   error at the end of a run), validation and the log line.
# - Off-load mode runs its own copy of the step: cram/offload.py's OffloadTrainer.backward (its call of mlm_loss; the
#   weights are micro_batch_weights') and update. Its blocks' weights live in host memory, so a loss term that reads
#   them does not work there.
# - A new random draw in the step comes from more row_noise columns (mask_tokens), never from torch's generator,
#   whose draws a resume or another number of processes would not repeat. Noise that the loss needs travels with
#   the batch: from Batches.micro_batch through Trainer.backward to forward, and in OffloadTrainer and Validation too.
# - A new train.py setting that changes the step should default to off: a resume of an older checkpoint, which does
#   not hold it, runs with its current default.
# - Outside the step, three places describe the objective: cram/data.py's fill_in masks one word of a validation row
#   its own way for the end's examples, tools/export.py's model card states the masking rate and the 80/10/10 split,
#   and tools/modeling_cram.py (the exported model for transformers) has its own MLM head and loss. An objective that
#   changes them changes those too. Whatever ranks runs by the validation loss (tools/compare.py, the final line)
#   then ranks them by the new one, and diverged's ceiling of ln(vocab_size) + 1 assumes a cross-entropy's scale.


# -----------------------------------------------------------------------------
# The optimizer. param_groups says which parameters decay, and OPTIMIZERS[optim].build makes the optimizer over those
# groups (train.py's make_trainer). nanoGPT's configure_optimizers does the same in one function.
def param_groups(module, weight_decay, optim="adamw"):
    """The optimizer's parameter groups: weight decay on the matrices (the embeddings too), none on biases, norms and
    scalars. With optim='muon' the blocks' matrices come first, in a group of their own that Muon updates;
    AdamW updates the rest."""
    params = [p for p in module.parameters() if p.requires_grad]
    hidden = {id(p) for p in module.blocks.parameters() if p.dim() == 2} if optim == "muon" else set()
    groups = [{"params": [p for p in params if p.dim() >= 2 and id(p) not in hidden], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if optim != "muon":
        return groups
    return [{"params": [p for p in params if id(p) in hidden], "weight_decay": weight_decay, "muon": True},
            *(dict(g, muon=False) for g in groups)]


# The optimizers that train.py's --optim names. A fork's new optimizer is one row of OPTIMIZERS, with four fields:
# - build(groups, lr, betas, eps) makes it over param_groups's groups. Each group carries its own weight decay.
# - state_bytes is the least memory its state takes per parameter. The memory check counts it.
# - width_lr says whether the width's rule for the peak rate suits it (lr_for_width below, which was tuned for
#   AdamW). Where it does not, train.py asks for --lr.
# - fits(state, param) says whether a resumed state tensor fits its parameter (files.optimizer_problem). By default
#   it must have the parameter's shape, or a shape that factors it (Adafactor keeps a row's and a column's statistics).
# An optimizer that takes settings beyond lr, betas and eps also needs them passed in make_trainer. One that updates
# some parameters apart from the rest, as Muon does, needs its group in param_groups. Where a row is built: train.py's
# make_trainer and the memory probe (cram/memory.py, through Runtime.optimizer, with its own rate, betas and eps) build
# --optim's row (the probe takes one real step at a rate of 0, which the optimizer must survive); bench.py and
# finetune_glue.py build "adamw"'s (Runtime's default, which only training's set-up changes), so a change to that row
# changes them too; off-load mode runs an AdamW of its own and refuses another.
# What the update costs: it is on the training clock. flops_per_token does not count it, and the budget's share of the
# matmul (budget.STEP_EFFICIENCY) includes it only as AdamW's, in the whole steps it was measured on. So under a budget
# of hours a cheaper update trains more tokens, and under a budget of tokens it changes nothing but the time.
def factored(state, param):
    return state.dim() == 0 or state.dim() == param.dim() and all(n in (1, m) for n, m in zip(state.shape, param.shape))


def same_shape(state, param):
    return state.dim() == 0 or state.shape == param.shape


# Unless given, width_lr is False and fits is factored.
Optimizer = collections.namedtuple("Optimizer", "build state_bytes width_lr fits", defaults=(False, factored))
OPTIMIZERS = {
    # Two moments in float32. fused=True updates many parameters per kernel launch on a GPU, and vectorises on a CPU.
    "adamw": Optimizer(lambda groups, lr, betas, eps: torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True),
                       8, True, same_shape),
    # The Muon class below keeps one momentum on the first group of param_groups(..., optim="muon"), and AdamW's
    # two moments on the rest.
    "muon": Optimizer(lambda groups, lr, betas, eps: Muon(groups, lr=lr, betas=betas, eps=eps), 4, True, same_shape),
    # A fork's row, for example Lion (Chen et al. 2023: one moment, no eps; a class the fork brings):
    #     "lion": Optimizer(lambda groups, lr, betas, eps: Lion(groups, lr=lr, betas=betas), 4),
    # Its width_lr is then False, so a run needs --lr. Compare it with AdamW under --budget_tokens (what the update
    # costs, above).
}


# The peak learning rate where --lr is not given: 1e-3 at width 768 (the paper's 16 x 768, and budget recipes of
# BERT-Base's width; original BERT's was 1e-4, config/bert_original.py), scaled as width ** -0.5 (nanochat's AdamW
# rule). That gives 2e-3 at width 192, 1.7e-3 at 256 (the quickstart's hand-tuned 2e-3) and 8.7e-4 at 1024 (published
# large-over-base ratios are 0.63-0.75: RoBERTa, ModernBERT, Ettin).
LR_AT_768, LR_WIDTH_EXPONENT = 1e-3, -0.5


def lr_for_width(d_model):
    """The peak learning rate by the width's rule, for an optimizer whose row says width_lr."""
    return LR_AT_768 * (d_model / 768) ** LR_WIDTH_EXPONENT


# Muon (Keller Jordan 2024) on the blocks' matrices, AdamW on the rest, as one optimizer: momentum made the nearest
# semi-orthogonal matrix, scaled to AdamW's update RMS (Moonshot AI 2025), so one lr serves both.
def orthogonalize(g, steps=5):
    """The semi-orthogonal matrix nearest to g (U V^T of its SVD), approximately: a quintic Newton-Schulz iteration
    (Jordan's coefficients) puts every singular value in about [0.7, 1.2] in five steps, as good for an update."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.bfloat16() if g.is_cuda else g.float()  # bfloat16 is fast on a GPU and slow on a CPU
    x = x / (x.norm() + 1e-7)  # singular values into [0, 1]
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x  # iterate on the smaller Gram matrix
    for _ in range(steps):
        gram = x @ x.T                             # (r, r), r = min(rows, cols)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Groups with muon=True: Nesterov momentum, orthogonalized, RMS-matched to AdamW; the others AdamW's update."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-12, weight_decay=0.01, momentum=0.95, ns_steps=5):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      ns_steps=ns_steps, muon=False))

    @torch.no_grad()
    def step(self, closure=None):
        loss = torch.enable_grad()(closure)() if closure else None
        for group in self.param_groups:
            lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["muon"]:
                    if not state:
                        state["momentum"] = torch.zeros_like(p)
                    buf = state["momentum"].lerp_(p.grad, 1 - group["momentum"])
                    update = p.grad.lerp(buf, group["momentum"])  # Nesterov: look ahead along the momentum
                    update = orthogonalize(update, group["ns_steps"]) * (0.2 * math.sqrt(max(p.shape)))
                    p.mul_(1 - lr * wd).add_(update, alpha=-lr)
                else:
                    if not state:
                        state.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                    state["step"] += 1
                    t = state["step"].item()
                    state["exp_avg"].lerp_(p.grad, 1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                    p.mul_(1 - lr * wd).addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))
        return loss


def mean_over_processes(value):
    """A tensor's mean over the processes of a DDP run (each gets the mean); the tensor itself in a run of one."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    value = value.clone()
    torch.distributed.all_reduce(value)  # the sum, in place
    return value / torch.distributed.get_world_size()


def set_rate(optimizer, lr):
    """Gives every parameter group of `optimizer` the learning rate `lr`. It is the one place a step's rate reaches an
    optimizer, in both modes (Trainer, and off-load mode's stem and blocks). A fork that wants a rate per group keeps
    a multiplier in each group and applies it here."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def micro_batch_weights(micro_batches):
    """Each micro-batch's weight in the step's loss: its share of this process's rows in the step. Every row has the
    same number of masked positions, so this weights every masked token alike. An objective whose count varies by row
    pads its labels (with -100, say) and weights each micro-batch by its count of real labels, (labels != -100).sum(),
    here instead (normal and off-load mode both call this)."""
    rows = sum(len(batch[0]) for batch in micro_batches)
    return [len(batch[0]) / rows for batch in micro_batches]


class Trainer:
    """A model's training step, in two calls. backward runs forward and backward over the micro-batches, and update
    takes the clipped optimizer step. train.py calls them separately so that it can check the loss in between. step
    calls both, for a caller that checks nothing in between (bench.py, the memory probe). The Trainer also holds the
    training state that a checkpoint keeps.

    `model` is the plain module that checkpoints hold and evaluation runs. `step_model` is the same module in the form
    the step runs: compiled by torch.compile, and wrapped by DDP when several processes train. The model stays in
    training mode; only evaluation (train.py's Validation) and the fill-in examples switch it to eval mode, and back.
    `scaler` is float16's loss scaler, which does nothing in other precisions. offload.OffloadTrainer has the same
    methods but runs the step its own way, streaming the blocks from host memory; a change to backward, update or the
    model's forward must be made there too."""

    def __init__(self, model, optimizer, scaler, step_model=None, autocast=nullcontext):
        self.model, self.optimizer, self.scaler, self.autocast = model, optimizer, scaler, autocast
        self.step_model = model if step_model is None else step_model

    def backward(self, micro_batches):
        """Runs the forward and backward pass of each micro-batch (inputs, positions, labels). Returns the step's loss
        as a float, the mean over every masked token of the step on every process. Each micro-batch's loss is weighted
        by its share of this process's rows in the step (micro_batch_weights), so the summed gradients are those of one
        large batch. The loop then checks this loss (train.py's bad steps). The host waits for the device twice a step:
        for this loss here and for the gradients' norm in update (under float16 the loss scaler also reads its overflow
        check). Under DDP the processes also wait for each other: for the clock at the step's start, the gradients after
        the last micro-batch and this loss's mean."""
        total, n = 0.0, len(micro_batches)
        for i, ((inputs, positions, labels), weight) in enumerate(zip(micro_batches, micro_batch_weights(micro_batches))):
            # under DDP the gradients are averaged over processes once, after the last micro-batch
            with self.step_model.no_sync() if hasattr(self.step_model, "no_sync") and i < n - 1 else nullcontext():
                with self.autocast():  # the compiled part of the step: the forward and its loss
                    loss, _ = self.step_model(inputs, positions, labels)
                self.scaler.scale(loss * weight).backward()
            total = total + loss.detach() * weight
        return mean_over_processes(total).item()  # the host waits for the device here (and in update, for the norm)

    def update(self, lr, clip, skip=False):
        """Clips the gradients' norm to `clip` (0: no clipping) and applies one update at learning rate `lr`, unless
        `skip` is set or the norm is not finite. Returns whether the update was applied. The gradients are then
        cleared either way. Every process sees the same averaged gradients, so all of them decide alike.
        What the update sees: the gradients of the mean loss over every masked token of the step, on all processes,
        unscaled (float16's loss scale taken off) and clipped; `lr`, the schedule's rate for this step (train.lr_at).
        Its state lives in self.optimizer.state, whose step count (AdamW's; Muon's matrices keep none) counts the
        applied updates only."""
        set_rate(self.optimizer, lr)
        self.scaler.unscale_(self.optimizer)  # the true gradients for the norm and clipping (a no-op unless float16)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip or math.inf)
        applied = not skip and math.isfinite(norm.item())
        if applied:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return applied

    def step(self, micro_batches, lr, clip):
        """backward, then update: (the step's loss, whether the update was applied)."""
        loss = self.backward(micro_batches)
        return loss, self.update(lr, clip)

    def state_dict(self):
        return {name: getattr(self, name).state_dict() for name in ("model", "optimizer", "scaler")}

    def load_state_dict(self, checkpoint):
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint.get("scaler"):  # float16's loss scale; empty when the run used another dtype
            self.scaler.load_state_dict(checkpoint["scaler"])


class ClassificationHead(nn.Module):
    """The GLUE head: pooled states -> dense 1024 -> Tanh -> dropout -> classes (num_labels=1: regression, STS-B). pooling
    'first' reads the first token, as BERT's [CLS] (fine-tuning makes its summary), 'mean' the real tokens' mean, and
    'pair' each text of `[CLS] a [SEP] b [SEP]` apart, found by `sep_id`. The pair head averages each text's final states
    and sets the first text's mean u against the second's v as [u, v, |u - v|, u * v] (InferSent's features, GLUE's own
    pair baselines'), so what two texts share is in its input, not left to one token (docs/glue.md). A row of `texts`
    texts, more than two, sets the first against each later one in turn and puts those blocks side by side, 4 x
    (texts - 1) x d wide: a choice task's premise against choice 1, then against choice 2. One text reads as a pair of
    itself, and so does a row whose later text is missing."""

    def __init__(self, d_model, num_labels, hidden=1024, dropout=0.1, pooling="first", sep_id=None, texts=2):
        super().__init__()
        if pooling not in ("mean", "first", "pair") or (pooling == "pair" and sep_id is None):
            raise ValueError(f"pooling must be 'mean', 'first' or 'pair' (with sep_id), got {pooling!r}")
        self.pooling, self.sep_id, self.texts = pooling, sep_id, max(2, texts)  # one text: a pair of itself
        self.pooler = nn.Linear(4 * (self.texts - 1) * d_model if pooling == "pair" else d_model, hidden)
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)
        self.apply(CrammedBert._init_weights)  # the pooler's, then the classifier's

    def forward(self, states, padding_mask=None, idx=None):
        """states (B, T, d); padding_mask (B, T) True at real tokens; idx (B, T), by which 'pair' finds the texts ->
        (B, num_labels)."""
        real = torch.ones_like(states[..., 0], dtype=torch.bool) if padding_mask is None else padding_mask  # (B, T)
        pooled = (states[:, 0] if self.pooling == "first" else mean_over(states, real) if self.pooling == "mean"
                  else self.pairs(states, real, idx))  # (B, d); a pair's (B, 4 (texts - 1) d)
        return self.classifier(self.drop(torch.tanh(self.pooler(pooled))))

    def pairs(self, states, real, idx):
        """[u, v, |u - v|, u * v] for the first text's mean u and each later text's mean v in turn, side by side:
        (B, 4 (texts - 1) d). A text runs from the token after a [SEP] (the first from [CLS]) through its own [SEP]."""
        seps = idx == self.sep_id
        text = seps.cumsum(1) - seps.long()  # (B, T): how many texts end before each token
        u, blocks = mean_over(states, (text == 0) & real), []  # (B, d)
        for i in range(1, self.texts):
            here = (text == i) & real  # (B, T)
            v = torch.where(here.any(1, keepdim=True), mean_over(states, here), u)  # (B, d); none there: u itself
            blocks += [u, v, (u - v).abs(), u * v]
        return torch.cat(blocks, dim=-1)


def mean_over(states, where):
    """The mean of states (B, T, d) over the positions where `where` (B, T) is True: (B, d); zeros where none is."""
    where = where[..., None].to(states.dtype)  # (B, T, 1)
    return (states * where).sum(1) / where.sum(1).clamp(min=1)


class SequenceClassifier(nn.Module):
    """Encoder + ClassificationHead (head_args: its settings), fine-tuned on GLUE."""

    def __init__(self, encoder, num_labels, **head_args):
        super().__init__()
        self.encoder = encoder
        self.head = ClassificationHead(encoder.config.d_model, num_labels, **head_args)  # hidden, dropout, pooling, sep_id, texts

    def forward(self, idx, padding_mask=None):
        return self.head(self.encoder.encode(idx, padding_mask), padding_mask, idx)
