"""The memory a training step takes beside the lower estimate train.py refuses a step by
(memory.check_memory's memory.least_bytes: 16 bytes a parameter, ModelConfig.step_bytes a sequence).

    python tools/bench_memory.py                                  # the quickstart's shape on this CPU
    python tools/bench_memory.py --micro_batches=64,256 --dtypes=float32,bfloat16 --compiles=False,True
    python tools/bench_memory.py --full_layers=2                  # later layers narrowed

Each case runs in a process of its own (a CPU's peak resident memory only grows): it builds the
model and AdamW, then takes two training steps on random tokens at one micro-batch. A row gives the
memory the steps added (on a CPU the growth of the peak resident set, on a GPU the peak allocated)
beside the estimate; the estimate must stay below it, so that what train.py refuses surely does
not fit.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.process import guarded  # noqa: E402

# -----------------------------------------------------------------------------
shape = "small"           # {small, reference}: model.SHAPES' 4x256 with 8192 tokens, or 16x768 with 32768
seq_len = 128             # >= 2
micro_batches = "64,256"  # comma-separated micro-batch sizes
dtypes = "float32"        # comma-separated: float32, bfloat16, float16
compiles = "False"        # comma-separated: False (eager), True (torch.compile)
full_layers = 0           # >= 0: narrow the layers after this many (model.py's full_layers; 0: none)
device = "cpu"            # cpu, cuda
# -----------------------------------------------------------------------------

CASE = """
import resource, sys, torch
sys.path.insert(0, {root!r})
from cram import memory, runtime
from cram.data import SPECIAL_TOKENS, special_ids
from model import MASK_RATE, SHAPES, CrammedBert, ModelConfig, Trainer, mask_tokens, param_groups
args = dict(SHAPES[{shape!r}], seq_len={seq_len}, full_layers={full_layers})
rt = runtime.setup({device!r}, {dtype!r}, {compile})
config, micro = ModelConfig(**args), {micro}
model = CrammedBert(**args).to(rt.device)
trainer = Trainer(model, rt.optimizer(param_groups(model, 0.01), lr=1e-3), rt.grad_scaler(), rt.compile_model(model),
                  rt.autocast)
n = config.vocab_size - len(SPECIAL_TOKENS)  # the regular tokens
batch = mask_tokens(torch.randint(0, n, (micro, config.seq_len), device=rt.device), MASK_RATE, special_ids(n)["[MASK]"], n)
resident = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
before = 0 if rt.device.type == "cuda" else resident()
for _ in range(2):
    trainer.step([batch], 1e-3, 1.0)
used = torch.cuda.max_memory_allocated(rt.device) if rt.device.type == "cuda" else resident() - before
model_bytes, per_sequence = memory.least_bytes(config, rt, MASK_RATE)  # what train.py's check refuses by
estimate = model_bytes + micro * per_sequence
print(used, estimate)
"""


def main():
    narrowed = f", full_layers={full_layers}" if full_layers else ""
    print(f"| {shape} x seq {seq_len}{narrowed} on {device} | micro-batch | measured GB | estimate GB | estimate / measured |")
    print("|---|---|---|---|---|")
    for dtype in dtypes.split(","):
        for compile in compiles.split(","):
            for micro in micro_batches.split(","):
                code = CASE.format(root=ROOT, shape=shape, seq_len=seq_len, full_layers=full_layers, device=device,
                                   dtype=dtype, compile=compile == "True", micro=int(micro))
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                if proc.returncode:
                    raise SystemExit(f"error: the case {dtype}, compile={compile}, micro-batch {micro} failed: "
                                     f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
                used, estimate = map(int, proc.stdout.split()[-2:])
                print(f"| {dtype}, {'compiled' if compile == 'True' else 'eager'} | {micro} | {used / 1e9:.2f} | "
                      f"{estimate / 1e9:.2f} | {estimate / max(used, 1):.2f} |", flush=True)


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, "nothing to keep: a benchmark only prints")
