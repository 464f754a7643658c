"""Off-load mode (train.py --offload=True): an encoder whose training state is larger than the GPU. The blocks' float32
masters, AdamW moments and gradient accumulators live in host memory; the device holds the stem (embeddings, final
norm, MLM head) and two template blocks each block's weights stream through, forward keeping each block's input,
backward recomputing it with its forward's RNG state: float32 trains as normal mode does (docs/offload.md). On a CPU
the streams are HostStream, doing nothing. The parts: HostBlocks, BlockStreamer (the device side), StreamedBlocks (the
blocks' place in the model) and OffloadTrainer, which composes them with the stem."""
import inspect
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch
import torch.nn as nn

from model import Block, Trainer, at_positions, micro_batch_weights, param_groups, set_rate

STREAMED_INPUTS = ("self", "x", "attn_mask", "context")  # Block.forward's that off-load judges: the input and the
# model's attention_mask (a position bias too), streamed to every block; context, narrowed layers', is refused below


def check_settings(world, config, optim, dtype):
    """One-line errors for what off-load mode does not run with (config: the model, a ModelConfig)."""
    if world > 1:
        raise SystemExit("error: --offload=True runs in one process: start it with python, not torchrun")
    if config.full_layer_count() < config.n_layers:
        raise SystemExit("error: --offload=True streams whole layers: it does not combine with narrowed layers "
                         "(--full_layers)")
    extra = [name for name in inspect.signature(Block.forward).parameters if name not in STREAMED_INPUTS]
    if extra:  # a fork's block that takes more (rotary tables, say) than the streamer gives it
        raise SystemExit(f"error: --offload=True streams blocks given their input and attention mask: model.py's "
                         f"Block.forward also takes {', '.join(extra)}")
    if optim != "adamw":
        raise SystemExit(f"error: --offload=True steps AdamW on the host: it does not combine with --optim={optim}")
    if dtype == torch.float16:
        raise SystemExit("error: --offload=True needs --dtype=bfloat16 or float32 (float16's loss scaling is not "
                         "built for it)")


def adamw_order(module):
    """Parameter names in the order of param_groups(module): torch.optim.AdamW's state indices."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [names[id(p)] for group in param_groups(module, 0.0) for p in group["params"]]


def wire_dtype(p, dtype):
    """The dtype a block parameter crosses the bus and computes in: matrices in autocast's `dtype`, vectors float32."""
    return dtype if p.dim() >= 2 else torch.float32


def device_generator(device):
    """The generator dropout draws from on `device` (a GPU's once CUDA is initialised): its get_state(), set_state()."""
    return torch.cuda.default_generators[device.index] if device.type == "cuda" else torch.default_generator


class HostStream:
    """Stands in for torch.cuda.Stream and its events on a CPU, where work runs in program order."""

    def record_event(self):
        return self

    def wait_event(self, event=None):
        pass

    synchronize = wait_event


class HostBlocks:
    """The host side, per block i: masters[i] (its float32 parameters; their .grad the accumulators), send[i] (what
    crosses the bus: pinned copies in the wire dtype, or the masters), optimizers[i] (a fused CPU AdamW over
    param_groups') and updates[i] (its step in flight, or None). One updater thread steps them in forward order."""

    def __init__(self, blocks, rt, lr, betas, eps, weight_decay):
        self.blocks = blocks  # the nn.ModuleList the masters belong to (checkpoints load into it)
        self.dtype, cuda = rt.dtype, rt.device.type == "cuda"
        for p in blocks.parameters():
            if cuda and rt.dtype == torch.float32:  # the masters themselves cross the bus
                p.data = p.data.pin_memory()
            p.grad = torch.zeros_like(p)  # the float32 accumulator; AdamW reads it as the gradient
        self.masters = [list(block.parameters()) for block in blocks]
        self.optimizers = [torch.optim.AdamW(param_groups(block, weight_decay), lr=lr, betas=betas, eps=eps,
                                             fused=True) for block in blocks]
        self.send = [[torch.empty(p.shape, dtype=wire_dtype(p, rt.dtype), pin_memory=cuda) for p in params]
                     if rt.dtype != torch.float32 else params for params in self.masters]  # pinned: they cross the bus
        for i in range(len(self)):
            self.refresh_send(i)
        self.updater, self.updates = ThreadPoolExecutor(max_workers=1), [None] * len(self)

    def __len__(self):
        return len(self.masters)

    @torch.no_grad()
    def refresh_send(self, i):
        """Bring block i's transfer copies up to its masters (under float32 they are the masters)."""
        if self.dtype != torch.float32:
            torch._foreach_copy_(self.send[i], self.masters[i])

    def accumulate(self, i, grads, landed, last):
        """Add block i's gradients to its accumulators once `landed` (their copy's event) has passed; returns, when last
        (the step's last micro-step), their squared norm (block i's share of the global one), else 0.0."""
        landed.synchronize()
        accumulators = [p.grad for p in self.masters[i]]
        torch._foreach_add_(accumulators, grads)
        return torch.stack(torch._foreach_norm(accumulators)).square().sum().item() if last else 0.0

    def start_updates(self, lr, scale):
        """Queue every block's update in forward order; the next forward waits (wait(i)) for the block it sends."""
        self.updates = [self.updater.submit(self._update, i, lr, scale) for i in range(len(self))]

    @torch.no_grad()
    def _update(self, i, lr, scale):
        """Block i's clipping, AdamW step and fresh transfer copy; runs on the updater thread."""
        grads = [p.grad for p in self.masters[i]]
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        set_rate(self.optimizers[i], lr)
        self.optimizers[i].step()
        torch._foreach_zero_(grads)
        self.refresh_send(i)

    def wait(self, i):
        if self.updates[i] is not None:
            self.updates[i].result()  # raises here what failed on the updater thread
            self.updates[i] = None


class BlockStreamer:
    """The device side: `host`'s block i runs in template i % 2 (Blocks of `config`); streams compute, h2d and d2h (through
    pinned staging); resident[s]: the block template s holds, slot_free[s]: the last compute that read it."""

    def __init__(self, host, config, rt):
        self.host, self.rt, self.cuda = host, rt, rt.device.type == "cuda"
        with torch.device("meta"):  # shapes only: building the templates draws nothing from the RNG
            templates = [Block(config) for _ in range(2)]
        self.templates = [t.to_empty(device=rt.device) for t in templates]
        for p in (p for t in self.templates for p in t.parameters()):
            p.data = p.data.to(wire_dtype(p, rt.dtype))
        for name, buffer in host.blocks[0].named_buffers():  # a block's tables (a fork's rotary, say): not streamed,
            if any(not torch.equal(buffer, block.get_buffer(name)) for block in host.blocks):  # so one for all blocks
                raise SystemExit(f"error: --offload=True streams a block's parameters, not its buffers: {name} differs "
                                 f"between the blocks")
            for t in self.templates:
                t.get_buffer(name).copy_(buffer)
        self.staging = [[torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in self.templates[0].parameters()]
                        if self.cuda else None for _ in range(2)]
        self.resident = [None, None]  # which block's current weights each template holds
        if self.cuda:
            self.compute, self.h2d, self.d2h = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()
        else:
            self.compute = self.h2d = self.d2h = HostStream()
        self.slot_free = [self.compute.record_event() for _ in range(2)]

    def invalidate(self):
        """The masters changed (an update, a loaded checkpoint): no template holds current weights."""
        self.resident = [None, None]

    @torch.no_grad()
    def _fetch(self, i):
        """Start copying block i's weights into template i % 2; returns the event to wait on (None: already there)."""
        self.host.wait(i)  # its masters and transfer copy are being updated
        slot = i % 2
        if self.resident[slot] == i:
            return None
        self.h2d.wait_event(self.slot_free[slot])  # the compute that last read this template is done
        with torch.cuda.stream(self.h2d) if self.cuda else nullcontext():
            for p, src in zip(self.templates[slot].parameters(), self.host.send[i]):
                p.copy_(src, non_blocking=True)
        self.resident[slot] = i
        return self.h2d.record_event()

    def forward(self, h, inputs=None, rng=None, mask=None):
        """Run h through every block under no_grad, each given `mask` (CrammedBert.attention_mask's); inputs and rng
        (lists), when given, collect each block's input and the device RNG state it started from, for the recompute."""
        n, ready = len(self.host), self._fetch(0)  # block 0's weights on their way
        for i in range(n):
            if ready is not None:
                self.compute.wait_event(ready)
            if inputs is not None:
                inputs.append(h)
                rng.append(device_generator(self.rt.device).get_state())
            with torch.no_grad(), self.rt.autocast():
                h = self.templates[i % 2](h, mask)  # (B, T, d)
            self.slot_free[i % 2] = self.compute.record_event()
            # block i queued before the host waits for block i+1's update: the device computes meanwhile
            ready = self._fetch(i + 1) if i + 1 < n else None
        return h

    def backward(self, grad, inputs, rng, last, mask=None):
        """Each block recomputed and run backward from grad (B, T, d), its gradients added to the host's; returns the
        first block's input gradient and, when last, their squared norms."""
        n, pending, squares = len(self.host), None, [0.0] * len(self.host)
        ready = self._fetch(n - 1)
        for i in reversed(range(n)):
            upcoming = self._fetch(i - 1) if i > 0 else None
            if ready is not None:
                self.compute.wait_event(ready)
            grad, grads = self._recompute(i % 2, grad, inputs[i], rng[i], mask)
            sources = self._send_back(i % 2, grads)
            if pending is not None:  # the host adds block i+1's gradients while the device runs block i
                squares[pending[0]] = self.host.accumulate(*pending, last)
            pending = (i, sources, self.d2h.record_event())
            ready = upcoming
        squares[pending[0]] = self.host.accumulate(*pending, last)
        return grad, squares

    def _recompute(self, slot, grad, x, rng, mask):
        """The block in `slot` rerun from x with its forward's RNG state (the same dropout), then backward from grad:
        (x's gradient, the template's weight gradients, taken off it)."""
        device_generator(self.rt.device).set_state(rng)
        x = x.requires_grad_()
        with self.rt.autocast():
            y = self.templates[slot](x, mask)  # (B, T, d)
        y.backward(grad)
        grads = [p.grad for p in self.templates[slot].parameters()]
        self.templates[slot].zero_grad(set_to_none=True)
        return x.grad, grads

    def _send_back(self, slot, grads):
        """Template `slot` marked free after its backward, its gradients copied out (a GPU's: to the slot's staging
        buffers on d2h); returns what the host adds."""
        done = self.compute.record_event()
        self.slot_free[slot] = done
        if not self.cuda:
            return grads
        self.d2h.wait_event(done)
        with torch.cuda.stream(self.d2h):
            for s, g in zip(self.staging[slot], grads):
                s.copy_(g, non_blocking=True)
                g.record_stream(self.d2h)  # keep the allocator off g until the copy is done
        return self.staging[slot]


class StreamedBlocks(nn.Module):
    """The blocks' place in the model: streams them all under no_grad, so encode, forward and logits serve evaluation
    and fill-in unchanged (training's OffloadTrainer.step recomputes them for their gradients)."""

    def __init__(self, streamer):
        super().__init__()
        self.streamer = streamer  # not a module: the templates hold no weights of the model's own

    def forward(self, x, attn_mask=None, context=None):  # context: none, narrowed layers being refused
        return self.streamer.forward(x, mask=attn_mask)

    def train(self, mode=True):
        for module in self.streamer.templates:
            module.train(mode)
        return super().train(mode)


class OffloadTrainer:
    """model.Trainer's methods (normal mode's checkpoint format) for off-load mode, owning `model` (on the host): its
    blocks become HostBlocks' masters, the stem moves to the device; `self.model`: the stem with StreamedBlocks."""

    def __init__(self, model, rt, lr, betas, eps, weight_decay):
        self.rt, self.scaler = rt, rt.grad_scaler()  # disabled: bfloat16 and float32 need no loss scaling
        # the plain model's parameter order: checkpoints and AdamW state indices follow it
        self.names = [name for name, _ in model.named_parameters()]
        self.adamw_order, self.n_decay = adamw_order(model), len(param_groups(model, 0.0)[0]["params"])
        host_blocks, model.blocks = model.blocks, nn.ModuleList()
        self.stem = model.to(rt.device)
        self.optimizer = rt.optimizer(param_groups(self.stem, weight_decay), lr=lr, betas=betas, eps=eps)
        self.host = HostBlocks(host_blocks, rt, lr, betas, eps, weight_decay)
        self.streamer = BlockStreamer(self.host, model.config, rt)
        self.stem.blocks.append(StreamedBlocks(self.streamer))
        self.model = self.stem

    def synchronize(self):
        """Wait for the blocks' updates in flight (before reading the masters, or to time a step)."""
        for i in range(len(self.host)):
            self.host.wait(i)

    def _micro_step(self, inputs, positions, labels, weight, last):
        with self.rt.autocast():
            x = self.stem.embed(inputs)  # (B, T, d), its graph kept for the stem's backward at the end
        mask, block_inputs, rng = self.stem.attention_mask(inputs.shape[1]), [], []
        if mask is not None and mask.requires_grad:  # its gradient would have to come back through every block
            raise SystemExit("error: --offload=True streams a fixed attention mask to the blocks, not a learned one")
        top = self.streamer.forward(x.detach(), block_inputs, rng, mask)
        rng_after = device_generator(self.rt.device).get_state()
        top.requires_grad_()
        with self.rt.autocast():
            hidden = self.stem.final_norm(top)
            hidden = at_positions(hidden, positions) if self.stem.sparse_prediction else hidden
            loss, _ = self.stem.mlm_loss(hidden, inputs, positions, labels)
        (loss * weight).backward()
        grad, squares = self.streamer.backward(top.grad, block_inputs, rng, last, mask)
        x.backward(grad)
        device_generator(self.rt.device).set_state(rng_after)  # the recompute replayed the RNG: on from the forward
        return loss.detach(), squares

    def backward(self, micro_batches):
        """model.Trainer.backward's contract. The blocks' gradients go to their host accumulators as they stream."""
        total, n = 0.0, len(micro_batches)
        for i, (batch, weight) in enumerate(zip(micro_batches, micro_batch_weights(micro_batches))):
            loss, squares = self._micro_step(*batch, weight, i == n - 1)
            total = total + loss * weight
        self.squares = squares  # the last micro-batch's: each block's squared gradient norm, for update's clipping
        return total.item()

    def update(self, lr, clip, skip=False):
        """model.Trainer.update's contract. The stem steps here; the blocks' updates are queued on the updater thread."""
        stem_grads = [p.grad for p in self.stem.parameters() if p.grad is not None]
        stem_norm = torch.stack(torch._foreach_norm(stem_grads)).square().sum().item() if stem_grads else 0.0
        norm = (stem_norm + sum(self.squares)) ** 0.5
        applied = not skip and math.isfinite(norm)
        if applied:
            scale = min(1.0, clip / (norm + 1e-6)) if clip else 1.0  # as clip_grad_norm_
            if scale != 1.0:
                torch._foreach_mul_(stem_grads, scale)
            set_rate(self.optimizer, lr)
            self.optimizer.step()
            self.streamer.invalidate()
            self.host.start_updates(lr, scale)
        else:  # no update (skipped, or a non-finite norm): the accumulators emptied
            torch._foreach_zero_([p.grad for params in self.host.masters for p in params])
        self.optimizer.zero_grad(set_to_none=True)
        return applied

    step = Trainer.step  # backward, then update, as model.Trainer's

    def _locate(self):
        """name -> (optimizer, its index of the parameter), for every parameter of the plain model."""
        parts = [("", self.stem, self.optimizer)] + [(f"blocks.{i}.", block, optimizer) for i, (block, optimizer) in
                                                     enumerate(zip(self.host.blocks, self.host.optimizers))]
        return {prefix + name: (optimizer, index) for prefix, module, optimizer in parts
                for index, name in enumerate(adamw_order(module))}

    def state_dict(self):
        """Normal mode's: the CrammedBert's, AdamW's over param_groups(model) and the (disabled) scaler's."""
        self.synchronize()
        tensors = {**self.stem.state_dict(), **{f"blocks.{k}": v for k, v in self.host.blocks.state_dict().items()}}
        states = {o: o.state_dict()["state"] for o in [self.optimizer, *self.host.optimizers]}
        held = {name: states[o].get(local) for name, (o, local) in self._locate().items()}  # None: no state yet
        state = {index: held[name] for index, name in enumerate(self.adamw_order) if held[name] is not None}
        groups = [dict(g, params=params) for g, params in  # param_groups': the decayed parameters, then the rest
                  zip(self.optimizer.state_dict()["param_groups"],
                      (list(range(self.n_decay)), list(range(self.n_decay, len(self.adamw_order)))))]
        return dict(model={name: tensors[name] for name in self.names}, scaler=self.scaler.state_dict(),
                    optimizer=dict(state=state, param_groups=groups))

    def load_state_dict(self, checkpoint):
        self.synchronize()
        model = checkpoint["model"]
        self.stem.load_state_dict({k: v for k, v in model.items() if not k.startswith("blocks.")})
        self.host.blocks.load_state_dict({k[len("blocks."):]: v for k, v in model.items() if k.startswith("blocks.")})
        where, saved = self._locate(), checkpoint["optimizer"]
        for optimizer in [self.optimizer, *self.host.optimizers]:
            own = optimizer.state_dict()
            state = {where[name][1]: saved["state"][index] for index, name in enumerate(self.adamw_order)
                     if where[name][0] is optimizer and index in saved["state"]}
            groups = [dict(g, **{k: v for k, v in s.items() if k != "params"})
                      for g, s in zip(own["param_groups"], saved["param_groups"])]
            optimizer.load_state_dict(dict(state=state, param_groups=groups))
        for i in range(len(self.host)):
            self.host.refresh_send(i)
        self.streamer.invalidate()
