"""The GPU's code path, run on the CPU: compile, autocast, loss scaling, fused AdamW and the
micro-batch search (and on a GPU too, where one is present)."""
import dataclasses
import re

import pytest
import torch

from conftest import TINY_MODEL, assert_one_line_error, run_script, weights_atol
from cram import memory, runtime
from cram.runtime import cpu_warning
from model import OPTIMIZERS, CrammedBert, ModelConfig, Optimizer, Trainer, mask_tokens, param_groups

TINY = dict(vocab_size=300, seq_len=32, n_layers=2, d_model=64, n_heads=4, d_ffn=256)
ORIGINAL_BERT = dict(bias=True, norm_first=False, glu=False, position_scheme="learned", head_transform=True,
                     sparse_prediction=False)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def masked_batch(device, seed=0, rows=8, mask_rate=0.25):
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 296, (rows, 32), generator=generator)
    return [t.to(device) for t in mask_tokens(idx, mask_rate, 299, 296, generator)]


# the crammed model in every compile mode the device can run (on a CPU, those without CUDA
# graphs), the original BERT in the default one
COMPILED = [("crammed", device, mode) for device in DEVICES for mode in runtime.COMPILE_MODES
            if device == "cuda" or mode not in runtime.CUDA_GRAPH_MODES] + \
           [("original BERT", device, "default") for device in DEVICES]


@pytest.mark.parametrize("recipe,device,mode", COMPILED)
def test_compiled_step_matches_eager(recipe, device, mode):
    """fullgraph=True: any graph break is an error. Same loss and gradients as eager, in each mode."""
    torch.manual_seed(0)
    options = ORIGINAL_BERT if recipe == "original BERT" else {}
    eager = CrammedBert(**TINY, **options).to(device)  # dropout is 0 in the tiny model: deterministic
    compiled = runtime.setup(device, "float32", compile=True, compile_mode=mode).compile_model(eager)
    torch.backends.cuda.matmul.allow_tf32 = False  # setup() turns TF32 on; compare exact float32 here
    batch = masked_batch(device, mask_rate=0.15 if options else 0.25)
    loss_eager, correct_eager = eager(*batch)
    loss_eager.backward()
    grads_eager = [p.grad.clone() for p in eager.parameters()]
    eager.zero_grad(set_to_none=True)
    loss_compiled, correct_compiled = compiled(*batch)
    loss_compiled.backward()
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-5)
    assert correct_compiled is correct_eager is None  # training mode skips the count (eager tests it in eval)
    for p, g in zip(eager.parameters(), grads_eager):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", runtime.CUDA_GRAPH_MODES)
def test_cuda_graph_modes_accumulate_like_eager(mode):
    """Two optimizer steps of two micro-batches each: a recorded graph's outputs are overwritten by
    its next run, so the gradients must accumulate in buffers of their own (runtime.CudaGraphRuns' care)."""
    batches = [masked_batch("cuda", seed) for seed in range(4)]
    params = []
    for compiled in (False, True):
        torch.manual_seed(0)
        rt = runtime.setup("cuda", "float32", compile=compiled, compile_mode=mode)
        torch.backends.cuda.matmul.allow_tf32 = False
        model = CrammedBert(**TINY).cuda()
        optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-3)
        trainer = Trainer(model, optimizer, rt.grad_scaler(), rt.compile_model(model), rt.autocast)
        for step in range(2):
            trainer.step(batches[2 * step:2 * step + 2], 1e-3, 1.0)
        params.append([p.detach().clone() for p in model.parameters()])
    for compiled, eager in zip(params[1], params[0]):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=weights_atol(1e-3, 2))


def test_cuda_graph_wrapper_accumulates_in_its_own_buffers_on_a_cpu():
    """runtime.CudaGraphRuns' part that runs anywhere: gradient buffers made before each call, so
    accumulation adds into them; two steps of two micro-batches give eager's weights (the CPU twin
    of the GPU test above, around an eager model instead of recorded graphs)."""
    batches = [masked_batch("cpu", seed) for seed in range(4)]
    params = []
    for wrapped in (False, True):
        torch.manual_seed(0)
        rt = runtime.setup("cpu", "float32", compile=False)
        model = CrammedBert(**TINY)
        optimizer = rt.optimizer(param_groups(model, 0.01), lr=1e-3)
        step_model = runtime.CudaGraphRuns(model) if wrapped else model
        trainer = Trainer(model, optimizer, rt.grad_scaler(), step_model, rt.autocast)
        for step in range(2):
            trainer.step(batches[2 * step:2 * step + 2], 1e-3, 1.0)
        if wrapped:  # the wrapper gave every parameter its buffer before the first micro-batch
            step_model(*batches[0])
            assert all(p.grad is not None for p in model.parameters())
        params.append([p.detach().clone() for p in model.parameters()])
    for wrapped, eager in zip(params[1], params[0]):
        torch.testing.assert_close(wrapped, eager, rtol=0, atol=weights_atol(1e-3, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_autocast_tracks_float32(device):
    """A few training steps under bfloat16 autocast stay finite and within a few percent of float32."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        rt = runtime.setup(device, dtype, compile=False)
        torch.manual_seed(0)
        model = CrammedBert(**TINY).to(device)
        optimizer = rt.optimizer(param_groups(model, 0.01), lr=3e-3)
        batches = [masked_batch(device, seed) for seed in range(2)]
        trainer = Trainer(model, optimizer, rt.grad_scaler(), autocast=rt.autocast)
        losses[dtype] = [trainer.step(batches, 3e-3, 0.5)[0] for _ in range(4)]
    assert all(map(torch.isfinite, torch.tensor(losses["bfloat16"])))
    assert losses["float32"][-1] < losses["float32"][0]  # it trains
    torch.testing.assert_close(torch.tensor(losses["bfloat16"]), torch.tensor(losses["float32"]), rtol=0.03, atol=0)


def test_float16_loss_scaling_trains():
    """float16 goes through the grad scaler (unscaled before clipping); the loss still falls."""
    rt = runtime.setup("cpu", "float16", compile=False)
    scaler = rt.grad_scaler()
    assert scaler.is_enabled() and not runtime.setup("cpu", "bfloat16", False).grad_scaler().is_enabled()
    torch.manual_seed(0)
    model = CrammedBert(**TINY)
    optimizer = rt.optimizer(param_groups(model, 0.01), lr=3e-3)
    batch = masked_batch("cpu")
    trainer = Trainer(model, optimizer, scaler, autocast=rt.autocast)
    losses = [trainer.step([batch], 3e-3, 0.5)[0] for _ in range(8)]
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < 0.9 * losses[0]
    assert scaler.get_scale() > 1  # scaling was on


@pytest.mark.parametrize("device", DEVICES)
def test_fused_adamw_matches_plain(device):
    torch.backends.cuda.matmul.allow_tf32 = False  # other tests' setup() turned it on; compare exact float32
    torch.manual_seed(0)
    model = CrammedBert(**TINY).to(device)
    params = {}
    for fused in (True, False):
        copy = CrammedBert(**TINY).to(device)
        copy.load_state_dict(model.state_dict())
        optimizer = torch.optim.AdamW(param_groups(copy, 0.01), lr=1e-3, betas=(0.9, 0.98), eps=1e-12,
                                      fused=fused, foreach=None if fused else False)
        for seed in range(3):
            loss, _ = copy(*masked_batch(device, seed))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        params[fused] = [p.detach() for p in copy.parameters()]
    assert runtime.setup(device, "float32", False).optimizer(model.parameters()).defaults["fused"]
    for fused, plain in zip(params[True], params[False]):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_largest_micro_batch_respects_the_memory_limit():
    """A simulated GPU: 1 GiB fixed plus 40 MiB per sequence, out of memory above 16 GiB."""
    gib = 2 ** 30
    asked = []

    def peak_bytes(size):
        asked.append(size)
        need = gib + size * 40 * 2 ** 20
        if need > 16 * gib:
            raise torch.cuda.OutOfMemoryError("simulated")
        return need

    size, tried = memory.largest_micro_batch(peak_bytes, 16 * gib, largest=8192)
    assert size == 256 and asked == [8, 16, 32, 64, 128, 256, 512] and tried[512] is None  # 512 needs 21 GiB
    # the margin: 256 needs 11 GiB, over 90% of a 12 GiB card, so 128 is chosen
    assert memory.largest_micro_batch(peak_bytes, 12 * gib, largest=8192)[0] == 128
    assert memory.largest_micro_batch(peak_bytes, 16 * gib, largest=64)[0] == 64  # never above the batch
    assert memory.largest_micro_batch(peak_bytes, 16 * gib, largest=6)[0] == 4  # a batch of a few sequences
    with pytest.raises(SystemExit, match="not even a micro-batch of 8"):
        memory.largest_micro_batch(peak_bytes, gib, largest=8192)


def test_setup_errors():
    with pytest.raises(SystemExit, match="unknown dtype 'float8'"):
        runtime.setup("cpu", "float8")
    with pytest.raises(SystemExit, match="unknown device 'gpu0'"):
        runtime.setup("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="torch sees no CUDA GPU"):
            runtime.setup("cuda")
    rt = runtime.setup("auto", "auto")
    assert rt.dtype_name() == runtime.auto_dtype(rt.device, speedup=rt.bf16_speedup)[0]


def test_auto_picks_bfloat16_on_a_cpu_where_its_matmuls_are_faster_and_keeps_a_checkpoint_s_precision(monkeypatch):
    cpu = torch.device("cpu")
    assert runtime.auto_dtype(cpu, speedup=2.2) == ("bfloat16", "auto: bfloat16 matmuls 2.2x float32's here, at least "
                                                                "1.5x", 2.2)
    assert runtime.auto_dtype(cpu, speedup=1.5)[0] == "bfloat16"
    assert runtime.auto_dtype(cpu, speedup=1.49)[0] == "float32"  # a Xeon's avx512_bf16 (0.5x), AVX2's (0.01x)
    assert runtime.auto_dtype(cpu, speedup=0.0037) == ("float32", "auto: bfloat16 matmuls 0.0037x float32's here, "
                                                                 "under 1.5x", 0.0037)
    # setup times this CPU once, and says the ratio and the pick
    for measured, picked in ((9.8, torch.bfloat16), (0.5, torch.float32)):
        monkeypatch.setattr(runtime, "bf16_speedup", lambda measured=measured: measured)
        rt = runtime.setup("cpu", "auto", compile=False)
        assert (rt.dtype, rt.bf16_speedup) == (picked, measured) and f"{measured:.2g}x float32's here" in rt.describe()

    def untimed():
        raise AssertionError("timed where the precision was already decided")
    monkeypatch.setattr(runtime, "bf16_speedup", untimed)
    # a resumed run trains on in its checkpoint's precision where the device is of the same type, untimed
    for trained in ("float32", "bfloat16", "float16"):
        assert runtime.auto_dtype(cpu, continues=("cpu", trained)) == (trained, "auto: as the run it continues", 0.0)
        assert runtime.setup("cpu", "auto", compile=False, continues=("cpu", trained)).dtype_name() == trained
    # a setting that names a precision wins over both, untimed
    assert runtime.setup("cpu", "float32", compile=False, continues=("cpu", "bfloat16")).dtype == torch.float32
    assert runtime.setup("cpu", "bfloat16", compile=False).bf16_speedup == 0.0
    # another device's precision, an older checkpoint's "auto" or none: this device's own rule
    for trained in (("cuda", "bfloat16"), ("cpu", "auto"), (None, None), None):
        assert runtime.auto_dtype(cpu, continues=trained, speedup=0.5)[0] == "float32"
    said = runtime.Runtime(cpu, torch.float32, False, why="auto: bfloat16 matmuls 0.5x float32's here, under 1.5x")
    assert said.describe() == "cpu, float32 (auto: bfloat16 matmuls 0.5x float32's here, under 1.5x)"


def test_the_bf16_timing_measures_this_cpu():
    """bf16_speedup's contract on any host: a ratio of two real timings (0.01x on AVX2 hosts, up to
    ~10x with AMX), which setup's pick follows."""
    speedup = runtime.bf16_speedup(size=64, rounds=1, seconds=0.01)
    assert 1e-4 < speedup < 100
    assert runtime.auto_dtype(torch.device("cpu"), speedup=speedup)[0] == ("bfloat16" if speedup >= 1.5 else "float32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_budget_s_matmul_times_the_product_alone(monkeypatch, dtype):
    """The budget's device measure multiplies operands already in the run's precision: autocast
    converting float32 operands inside the timed loop halved an H100's figure at 2048^3."""
    seen = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append((a.dtype, b.dtype)) or mm(a, b))
    rt = runtime.Runtime(torch.device("cpu"), dtype, False)
    assert runtime.matmul_speed(rt, size=32) > 0
    assert seen and set(seen) == {(dtype, dtype)}


def _rank_precision(rank, port, dtypes, results):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mine = runtime.Runtime(torch.device("cpu"), dtypes[rank], False, why=f"auto: rank {rank}'s timing",
                           bf16_speedup=2.0 - rank)
    agreed = runtime.rank0_precision(mine)
    results[rank] = (agreed.dtype_name(), agreed.bf16_speedup, agreed.why)
    dist.destroy_process_group()


def test_under_ddp_rank0_s_precision_is_every_rank_s():
    """dtype=auto times the CPU in each process: two that time either side of the threshold train in
    rank 0's precision."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_rank_precision, args=(port, (torch.bfloat16, torch.float32), results), nprocs=2)
    assert results[0] == ("bfloat16", 2.0, "auto: rank 0's timing")
    assert results[1] == ("bfloat16", 2.0, "auto: rank 0's")


def test_cpu_warning_for_a_gpu_sized_run():
    reference = CrammedBert().config.flops_per_token(0.25) * 8192 * 128  # one full reference step
    assert "about 73 minutes" in cpu_warning(reference, threads=2)
    assert "config/train_quickstart.py" in cpu_warning(reference, threads=2)
    assert cpu_warning(0.02e9 * 64 * 128, threads=2) is None  # the quickstart: about a second


@pytest.mark.parametrize("micro,graphs", [(16, 1), (32, 2)])
def test_compiled_run_compiles_once(micro, graphs, prepared, tmp_path):
    """A whole short run with compile on (batch ramp, evaluations, checkpoints, resume) builds one graph per
    process, or two where the micro-batch is larger than the ramp's start (its steps then split, 48 as 32 + 16):
    no recompilation from the growing batch, evaluation or resuming."""
    args = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--compile=True",
            f"--micro_batch={micro}", "--batch_size=64", "--batch_ramp_start=16", "--budget_tokens=7808",
            "--log_interval=1", "--eval_interval_minutes=0.002", "--ckpt_interval_minutes=0.002"]
    first = run_script(*args, "--max_steps=6").stdout
    # 244 sequences of 32 tokens, ramped over 60% of them: 16 four times, then 32, 32 | 48, 64, 64 after the resume
    assert re.findall(r"\| batch (\d+) \|", first) == ["16"] * 4 + ["32"] * 2, first
    assert len(re.findall(r"^eval ", first, re.M)) >= 3, first
    assert f"torch.compile built {graphs} graph(s)" in first, first
    second = run_script(*args, "--resume=True").stdout
    assert re.findall(r"\| batch (\d+) \|", second) == ["48", "64", "64"], second
    assert "resuming" in second and f"torch.compile built {graphs} graph(s)" in second, second
    assert re.search(r"final: step 9 \|", second)


def test_bad_device_settings_are_one_line_errors(prepared, tmp_path):
    args = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL]
    assert_one_line_error(run_script(*args, "--dtype=no_such_dtype", check=False), "dtype must be one of auto")
    assert_one_line_error(run_script(*args, "--compile_mode=no_such_mode", check=False), "unknown compile mode 'no_such_mode' (default,")
    if not torch.cuda.is_available():
        assert_one_line_error(run_script(*args, "--device=cuda", check=False), "no CUDA GPU")
        for mode in runtime.CUDA_GRAPH_MODES:  # CUDA graphs: refused on a CPU, before any work
            assert_one_line_error(run_script(*args, f"--compile_mode={mode}", check=False),
                                  f"compile mode '{mode}' records CUDA graphs, which need a GPU")
        assert not any(tmp_path.iterdir())


def test_without_a_cpp_compiler_a_run_says_so_once_and_trains_eager(prepared, tmp_path, monkeypatch):
    """A machine with Python but no C++ compiler (slim containers, many Windows set-ups, a Mac without
    its command-line tools): inductor cannot build, so train.py says so in one line, with how to install
    one, and trains eager, to the weights --compile=False gives. The compiler is hidden for real: CXX
    names a missing one, and a fresh kernel cache holds nothing built with a working one."""
    args = ["train.py", f"--data_dir={prepared}", *TINY_MODEL, "--max_steps=6", "--fill_in_examples=0"]
    eager = run_script(*args, f"--out_dir={tmp_path / 'eager'}", "--compile=False")
    monkeypatch.setenv("CXX", str(tmp_path / "missing" / "g++"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    hidden = run_script(*args, f"--out_dir={tmp_path / 'hidden'}", "--compile=True")
    warnings = [line for line in hidden.stdout.splitlines() if "torch.compile cannot build" in line]
    assert len(warnings) == 1 and "C++ compiler" in warnings[0] and "apt install g++" in warnings[0], hidden.stdout
    assert "Traceback" not in hidden.stderr and re.search(r"^final: step 6 \|", hidden.stdout, re.M)
    assert "compiled" not in re.search(r"^model: .*$", hidden.stdout, re.M).group(0)  # the device line: eager
    a, b = (torch.load(tmp_path / run / "ckpt.pt", weights_only=True)["model"] for run in ("eager", "hidden"))
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=weights_atol(3e-3, 6)) for k in a)
    bench = run_script("bench.py", "--steps=1", "--warmup_steps=1", "--sweep=False", "--baselines=False",
                       "--micro_batch=2", "--accum_steps=1", "--device=cpu")
    assert bench.stdout.count("torch.compile cannot build") == 1 and "Traceback" not in bench.stderr


def test_an_optimizer_is_one_row_which_builds_it_and_sizes_its_state_for_the_memory_check(monkeypatch):
    """model.OPTIMIZERS: a fork's optimizer (here SGD, which takes no betas or eps and keeps no state) is a row; the
    run's optimizer is built from it and the memory check counts its state, not AdamW's, for any optimizer."""
    config, rt = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_ffn=128, vocab_size=512), runtime.setup("cpu", "float32", False)
    model = CrammedBert(**dataclasses.asdict(config))
    adamw = memory.least_bytes(config, rt, 0.15)[0]
    assert isinstance(rt.optimizer(param_groups(model, 0.01)), torch.optim.AdamW)
    assert adamw == 16 * config.parameters_at_least()  # float32 weights and gradients, and two moments
    monkeypatch.setitem(OPTIMIZERS, "sgd", Optimizer(lambda groups, lr, betas, eps: torch.optim.SGD(groups, lr=lr), 0))
    rt.optim = "sgd"
    assert isinstance(rt.optimizer(param_groups(model, 0.01), lr=0.1), torch.optim.SGD)
    assert memory.least_bytes(config, rt, 0.15)[0] == adamw // 2
    rt.optim = "muon"
    assert memory.least_bytes(config, rt, 0.15)[0] == adamw * 3 // 4  # its momentum on every parameter at least


# train.py with a torch optimizer added as a row of model.OPTIMIZERS, as a fork adds one: Adafactor keeps factored
# state (a row's and a column's statistics of each matrix) and has no rule by the width (width_lr's default, False)
ADAFACTOR = """import os, runpy, sys
sys.path.insert(0, {root!r})
import torch
from model import OPTIMIZERS, Optimizer
OPTIMIZERS["adafactor"] = Optimizer(lambda groups, lr, betas, eps: torch.optim.Adafactor(groups, lr=lr), 4)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


@pytest.mark.parametrize("optim", [*OPTIMIZERS, "adafactor"])
def test_each_optimizer_in_the_table_and_one_added_as_a_row_resumes_as_the_run_not_stopped(optim, prepared, tmp_path):
    """Every row of model.OPTIMIZERS, and Adafactor added as a row: a run stopped at step 4 and resumed ends as the
    run that was not stopped, to the weights (its optimizer state saved, checked by its row's `fits`, and loaded; its
    rate the run's own); a row without the width's lr rule asks for --lr in one line, and takes a config file's only
    where that file chooses the optimizer (the others' rates are AdamW's)."""
    from conftest import ROOT
    script = tmp_path / "train_with_adafactor.py"
    script.write_text(ADAFACTOR.format(root=ROOT))
    common = [str(script) if optim == "adafactor" else "train.py", f"--data_dir={prepared}", *TINY_MODEL,
              f"--optim={optim}", "--budget_tokens=8192", "--fill_in_examples=0"]
    run_script(*common, f"--out_dir={tmp_path / 'whole'}")
    run_script(*common, f"--out_dir={tmp_path / 'stopped'}", "--max_steps=4")
    fresh = [arg for arg in common if not arg.startswith("--lr=")]
    run_script(*fresh, f"--out_dir={tmp_path / 'stopped'}", "--resume=True")  # at the run's own rate
    a, b = (torch.load(tmp_path / run / "ckpt.pt", weights_only=True) for run in ("whole", "stopped"))
    assert a["step"] == b["step"] == 8 and a["config"]["optim"] == optim
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=0, atol=weights_atol(3e-3, 8))
    factored = [v for state in b["optimizer"]["state"].values() for v in state.values() if v.dim() == 2 and 1 in v.shape]
    assert bool(factored) == (optim == "adafactor")
    if not OPTIMIZERS.get(optim, Optimizer(None, 0)).width_lr:
        assert_one_line_error(run_script(*fresh, f"--out_dir={tmp_path / 'fresh'}", check=False),
                              "--optim=adafactor needs --lr")
        # a config file's rate was tuned for the optimizer it runs with, AdamW unless it says another
        adamw_config, own_config = tmp_path / "adamw_tuned.py", tmp_path / "adafactor_tuned.py"
        adamw_config.write_text("lr = 2e-3\n")
        own_config.write_text('optim = "adafactor"\nlr = 1e-2\n')
        assert_one_line_error(run_script(fresh[0], str(adamw_config), *fresh[1:], f"--out_dir={tmp_path / 'a'}",
                                         check=False), f"--optim=adafactor needs --lr: {adamw_config}'s lr=0.002 is AdamW's")
        run_script(fresh[0], str(own_config), *[a for a in fresh[1:] if not a.startswith("--optim=")],
                   f"--out_dir={tmp_path / 'own'}", "--max_steps=1")


def test_a_run_may_compile_more_shapes_than_torch_s_default_limit(monkeypatch):
    """A run compiles a graph for each masking level and micro-batch size: 8 levels x 2 sizes is 16 graphs, past
    torch's default limit of 8 a function, where a fullgraph model fails mid-run. compile_model raises the limit.
    (The eager backend traces as inductor's does, without its compile time.)"""
    import torch._dynamo
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compile(model, backend="eager", **{
        k: v for k, v in kwargs.items() if k != "mode"}))
    torch._dynamo.reset()
    model = CrammedBert(**TINY)
    compiled = runtime.setup("cpu", "float32", compile=True).compile_model(model)
    for masked in range(4, 12):  # 8 levels: 4 to 11 of a row's 32 tokens masked
        for rows in (4, 2):
            loss, _ = compiled(*masked_batch("cpu", mask_rate=masked / 32, rows=rows))
            assert torch.isfinite(loss)
