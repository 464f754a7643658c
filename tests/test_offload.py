"""Off-load mode (cram/offload.py): the same training as normal mode, and checkpoints either mode resumes."""
import math
import re

import pytest
import torch

from conftest import TINY_MODEL, assert_one_line_error, run_script, weights_atol
from cram import runtime
from cram.offload import OffloadTrainer
from model import CrammedBert, Trainer, mask_tokens, param_groups

VOCAB, SEQ = 300, 32
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # on a GPU: real streams and pinned copies


def batches(n, size=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [mask_tokens(torch.randint(0, VOCAB - 4, (size, SEQ), generator=g), 0.25, VOCAB - 1, VOCAB - 4, g)
            for _ in range(n)]


def train_both(model_args, n_steps, accum, clip, lr=1e-2, dtype="float32", device="cpu"):
    """The same steps in normal mode (Trainer, torch's fused AdamW) and off-load mode, from the
    same initialisation and RNG: (normal losses, off-load losses, normal model, optimizer, trainer)."""
    rt = runtime.setup(device, dtype, compile=False)
    torch.backends.cuda.matmul.allow_tf32 = False  # setup() turns TF32 on; compare exact float32 here
    data = [tuple(t.to(rt.device) for t in batch) for batch in batches(n_steps * accum)]
    torch.manual_seed(0)
    model = CrammedBert(vocab_size=VOCAB, seq_len=SEQ, **model_args).to(rt.device)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.98), eps=1e-12, fused=True)
    torch.manual_seed(0)
    trainer = OffloadTrainer(CrammedBert(vocab_size=VOCAB, seq_len=SEQ, **model_args), rt, lr, (0.9, 0.98), 1e-12, 0.01)
    torch.manual_seed(1)  # dropout draws from here in both modes
    trainer_normal = Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast)
    normal = [trainer_normal.step(data[s * accum:(s + 1) * accum], lr, clip)
              for s in range(n_steps)]
    torch.manual_seed(1)
    offloaded = [trainer.step(data[s * accum:(s + 1) * accum], lr, clip) for s in range(n_steps)]
    return normal, offloaded, model, optimizer, trainer


def assert_same_training(normal, offloaded, model, optimizer, trainer, lr, n_steps):
    """The same arithmetic in another order, so equal up to float32 rounding, which differs by
    kernel (AVX2, AVX512, a GPU): the weights within conftest.weights_atol, the AdamW moments
    (averages of gradients and their squares) relative to each tensor's largest value."""
    for (loss_a, applied_a), (loss_b, applied_b) in zip(normal, offloaded):
        assert applied_a and applied_b
        assert math.isclose(loss_b, loss_a, rel_tol=1e-5, abs_tol=1e-6)
    state = trainer.state_dict()
    assert list(state["model"]) == list(model.state_dict())  # same keys, same order
    for name, value in model.state_dict().items():
        torch.testing.assert_close(state["model"][name].cpu(), value.cpu(), rtol=0, atol=weights_atol(lr, n_steps))
    expected = optimizer.state_dict()
    assert state["optimizer"]["param_groups"] == expected["param_groups"]
    for index, moments in expected["state"].items():
        for key, value in moments.items():
            scale = value.abs().max().item()
            torch.testing.assert_close(state["optimizer"]["state"][index][key].cpu(), value.cpu(), rtol=0,
                                       atol=1e-5 * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_offload_trains_like_normal_mode(dropout, device):
    """3 steps of 2 micro-batches with the clipping active; dropout 0.1 checks that the recompute
    replays the forward's masks."""
    tiny = dict(n_layers=2, d_model=32, n_heads=2, d_ffn=128, dropout=dropout)
    normal, offloaded, model, optimizer, trainer = train_both(tiny, n_steps=3, accum=2, clip=0.05, device=device)
    assert_same_training(normal, offloaded, model, optimizer, trainer, lr=1e-2, n_steps=3)
    torch.manual_seed(0)
    fresh = CrammedBert(vocab_size=VOCAB, seq_len=SEQ, **tiny)
    fresh(*batches(1)[0])[0].backward()
    assert torch.stack([p.grad.norm() for p in fresh.parameters()]).norm() > 10 * 0.05  # the clipping was active


@pytest.mark.parametrize("device", DEVICES)
def test_offload_trains_like_normal_mode_with_blocks_of_several_mib(device):
    """d_model 512, d_ffn 2048: a block holds 2.6M parameters, 10.5 MB of float32."""
    wide = dict(n_layers=2, d_model=512, n_heads=8, d_ffn=2048)
    normal, offloaded, model, optimizer, trainer = train_both(wide, n_steps=1, accum=2, clip=0.5, lr=1e-3, device=device)
    assert sum(p.numel() for p in model.blocks[0].parameters()) * 4 > 10e6
    assert_same_training(normal, offloaded, model, optimizer, trainer, lr=1e-3, n_steps=1)


@pytest.mark.parametrize("device", DEVICES)
def test_offload_under_bfloat16_sends_bfloat16_weights_and_trains_close_to_normal_mode(device):
    """Under autocast the blocks' matrices cross the bus as bfloat16 copies of the float32 masters
    (the vectors as float32); normal mode's matmuls round them to bfloat16 too, so the two stay
    close (not equal: normal mode keeps float32 matrices for the weight gradients)."""
    tiny = dict(n_layers=2, d_model=32, n_heads=2, d_ffn=128)
    normal, offloaded, model, _, trainer = train_both(tiny, n_steps=2, accum=2, clip=0.5, lr=1e-3, dtype="bfloat16",
                                                        device=device)
    assert [t.dtype for t in trainer.host.send[0]] == [torch.bfloat16 if p.dim() >= 2 else torch.float32
                                                       for p in trainer.host.masters[0]]
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trainer.host.masters[0])
    for (loss_a, _), (loss_b, applied) in zip(normal, offloaded):
        assert applied
        assert math.isclose(loss_b, loss_a, rel_tol=2e-2, abs_tol=2e-2)
    state = trainer.state_dict()["model"]
    for name, value in model.state_dict().items():
        assert state[name].dtype == torch.float32
        torch.testing.assert_close(state[name].cpu(), value.cpu(), rtol=0, atol=2e-3)  # 2 steps of lr 1e-3 move weights ~2e-3
    for send, master in zip(trainer.host.send[0], trainer.host.masters[0]):  # refreshed after the update
        assert send.equal(master.detach().to(send.dtype))


def test_a_non_finite_gradient_skips_the_update_in_offload_mode():
    rt = runtime.setup("cpu", "float32", compile=False)
    torch.manual_seed(0)
    trainer = OffloadTrainer(CrammedBert(vocab_size=VOCAB, seq_len=SEQ, n_layers=2, d_model=32, n_heads=2, d_ffn=128),
                             rt, 1e-3, (0.9, 0.98), 1e-12, 0.01)
    data = batches(1)[0]
    assert trainer.step([data], 1e-3, 0.5)[1]
    before = trainer.state_dict()
    before = {"model": {k: v.clone() for k, v in before["model"].items()}, "steps": before["optimizer"]["state"]}
    steps_before = {i: s["step"].item() for i, s in before["steps"].items()}
    loss_of = trainer.stem.mlm_loss
    trainer.stem.mlm_loss = lambda *args: (loss_of(*args)[0] * float("nan"), None)
    loss, applied = trainer.step([data, data], 1e-3, 0.5)
    assert not applied and not math.isfinite(loss)
    after = trainer.state_dict()
    for name, value in after["model"].items():
        assert torch.equal(value, before["model"][name]), name  # weights untouched
    assert {i: s["step"].item() for i, s in after["optimizer"]["state"].items()} == steps_before  # moments untouched
    assert all(p.grad is None for p in trainer.stem.parameters())
    assert all(not p.grad.any() for params in trainer.host.masters for p in params)  # accumulators emptied
    trainer.stem.mlm_loss = loss_of
    assert trainer.step([data], 1e-3, 0.5)[1]


def step_losses(stdout):
    return dict(re.findall(r"^step (\d+) \| loss ([\d.]+) \|", stdout, re.M))


@pytest.mark.parametrize("first, then", [("--offload=True", "--offload=False"), ("--offload=False", "--offload=True")])
def test_either_mode_resumes_the_others_checkpoint(prepared, tmp_path, first, then):
    """A run stopped after 8 steps in one mode and resumed in the other ends as an uninterrupted
    run of the second mode: the same losses from step 10 on, the same final weights."""
    common = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--budget_tokens=20000", "--device=cpu"]  # exact float32
    whole = run_script(*common, f"--out_dir={tmp_path / 'whole'}", then).stdout
    run_script(*common, f"--out_dir={tmp_path / 'switched'}", first, "--max_steps=8")
    resumed = run_script(*common, f"--out_dir={tmp_path / 'switched'}", then, "--resume=True").stdout
    assert "at step 8," in resumed and "final: step" in resumed
    assert ("off-load mode" in resumed) == (then == "--offload=True")
    expected, got = step_losses(whole), step_losses(resumed)
    assert min(map(int, got)) == 10 and got.keys() == {s for s in expected if int(s) >= 10}
    for s in got:  # printed to 4 decimals; the modes differ in rounding only
        assert float(got[s]) == pytest.approx(float(expected[s]), abs=2e-4), s
    a, b = torch.load(tmp_path / "whole" / "ckpt.pt"), torch.load(tmp_path / "switched" / "ckpt.pt")
    assert a["step"] == b["step"] and list(a["model"]) == list(b["model"])
    for name in a["model"]:  # TINY_MODEL's lr
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=0, atol=weights_atol(3e-3, a["step"]))


def test_offload_refuses_what_it_does_not_support(prepared, tmp_path, monkeypatch):
    train = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--offload=True"]
    assert_one_line_error(run_script(*train, "--optim=muon", check=False), "--offload=True", "--optim=muon")
    assert_one_line_error(run_script(*train, "--dtype=float16", check=False), "--offload=True", "bfloat16")
    assert_one_line_error(run_script(*train, "--full_layers=1", check=False), "--offload=True", "narrowed layers")
    for name, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)  # as torchrun sets them: refused before joining the others
    assert_one_line_error(run_script(*train, check=False), "--offload=True", "torchrun")


def test_a_block_that_takes_more_than_its_input_is_refused_by_the_general_rule(monkeypatch):
    """A fork's Block.forward with an input of its own (rotary tables, say), which off-load's streamer does not give:
    one line naming it, found from the signature, with no list of switches to edit."""
    from cram import offload
    from model import Block, ModelConfig

    def forward(self, x, attn_mask=None, context=None, rotary=None):
        return x
    monkeypatch.setattr(Block, "forward", forward)
    with pytest.raises(SystemExit, match=r"^error: --offload=True streams blocks given their input and attention "
                                         r"mask: model\.py's Block\.forward also takes rotary$"):
        offload.check_settings(1, ModelConfig(n_layers=2, d_model=64, n_heads=2, d_ffn=128), "adamw", torch.float32)



def test_a_block_s_buffer_reaches_off_load_s_templates(monkeypatch):
    """A fork's block that keeps a table in a buffer (rotary's cos and sin, say; here a scale): off-load streams the
    parameters, and its templates (built on the meta device) get the blocks' buffers, so it trains as normal mode does;
    a buffer that differs between blocks, which streaming cannot follow, is one line."""
    import model as model_py
    init, forward = model_py.Block.__init__, model_py.Block.forward

    def scaled_init(self, config):
        init(self, config)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, config.d_model), persistent=False)
    monkeypatch.setattr(model_py.Block, "__init__", scaled_init)
    monkeypatch.setattr(model_py.Block, "forward", lambda self, x, *rest: forward(self, x, *rest) * self.scale)
    tiny = dict(n_layers=2, d_model=32, n_heads=2, d_ffn=128)
    assert_same_training(*train_both(tiny, n_steps=2, accum=1, clip=0.5), lr=1e-2, n_steps=2)
    model = CrammedBert(vocab_size=VOCAB, seq_len=SEQ, **tiny)
    model.blocks[1].scale.mul_(2)
    with pytest.raises(SystemExit, match="^error: --offload=True streams a block's parameters, not its buffers: scale "
                                         "differs between the blocks$"):
        OffloadTrainer(model, runtime.setup("cpu", "float32", compile=False), 1e-2, (0.9, 0.98), 1e-12, 0.01)


def test_a_position_bias_is_streamed_to_every_block_in_off_load_mode(monkeypatch):
    """A fork's position bias (ALiBi, built by CrammedBert.attention_mask, test_model's) reaches the streamed blocks, in
    the forward, the recompute and evaluation's encode, so off-load trains and evaluates as normal mode; a learned one
    (its gradient would have to come back through the streamed blocks) is one line."""
    from test_model import alibi
    monkeypatch.setattr(CrammedBert, "attention_mask", alibi)
    tiny = dict(n_layers=2, d_model=32, n_heads=2, d_ffn=128, dropout=0.1)
    normal, offloaded, model, optimizer, trainer = train_both(tiny, n_steps=2, accum=2, clip=0.5)
    assert_same_training(normal, offloaded, model, optimizer, trainer, lr=1e-2, n_steps=2)
    batch = batches(1, seed=1)[0]
    model.eval(), trainer.model.eval()
    torch.testing.assert_close(trainer.model(*batch)[0], model(*batch)[0], rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(CrammedBert, "attention_mask", lambda self, T, padding_mask=None: torch.zeros(T, T, requires_grad=True))
    with pytest.raises(SystemExit, match="^error: --offload=True streams a fixed attention mask to the blocks, not a learned one$"):
        trainer.step([batch], 1e-2, 0.5)
