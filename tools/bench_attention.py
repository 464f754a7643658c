"""Attention's forward and backward at a model's shape, timed alone in each way a CPU can run it,
beside the attention the model runs (model.attend).

    python tools/bench_attention.py                     # the quickstart's shape: micro-batch 32, 4 heads of 64
    python tools/bench_attention.py --dtype=float32

Under bfloat16 autocast model.attend runs two bfloat16 products around a float32 softmax, because
torch's CPU flash attention runs a bfloat16 backward as small products it does not pack for the
matrix units. The rows: that (`model.attend`), the flash kernel on the values widened to float32
(model.attend's way before), the flash kernel on the bfloat16 values, and two batched products
around a softmax all in the autocast precision. Each is checked against float32 attention of the
same values first (each rounds its output to the autocast precision). A row is ms per layer's attention (forward +
backward), the fastest of `rounds`.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up; first, for torch's temporary folder)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cram import process, runtime  # noqa: E402
from model import attend  # noqa: E402

# -----------------------------------------------------------------------------
micro_batch = 32        # >= 1
seq_len = 128           # >= 2
n_heads = 4             # >= 1
head_dim = 64           # >= 1
dtype = "bfloat16"      # {float32, bfloat16}: the autocast precision
compile = True          # torch.compile each way (train.py compiles the model)
repeats = 5             # >= 1: forward + backward passes a round
rounds = 3              # >= 1
seed = 0                # [0, 4294967295]
# -----------------------------------------------------------------------------


def model_attend(q, k, v):
    return attend(q, k, v, None, 0.0)


def flash_float32(q, k, v):
    """torch's flash kernel on q, k, v widened to float32, rounded back once (model.attend's way on a
    CPU before 2026-11-26)."""
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)


def flash(q, k, v):
    """torch's flash kernel on q, k, v as autocast gives them."""
    return F.scaled_dot_product_attention(q, k, v)


def matmuls(q, k, v):
    """Attention as two batched products around a softmax."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, T, T)
    return scores.softmax(-1) @ v  # (B, H, T, d_head)


WAYS = {"model.attend": model_attend, "flash in float32": flash_float32, "flash in the autocast dtype": flash,
        "matmuls in the autocast dtype": matmuls}


def time_way(fn, q, k, v, grad, rt):
    """Seconds of one forward + backward, the fastest round's mean."""
    def once():
        with rt.autocast():
            y = fn(q, k, v)
        y.backward(grad.to(y.dtype))
        q.grad = k.grad = v.grad = None  # each pass writes its gradients afresh, as training's do
    once()  # warm-up: compilation, the library's kernel choice
    return runtime.best_seconds(once, rt, repeats, rounds)


def main():
    rt = runtime.setup("cpu", dtype, compile)
    torch.manual_seed(seed)
    # q, k, v as the qkv projection leaves them: in the autocast precision
    q, k, v = (torch.randn(micro_batch, n_heads, seq_len, head_dim, dtype=rt.dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(micro_batch, n_heads, seq_len, head_dim)
    with torch.no_grad():
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    print(f"# attention of {micro_batch} x {n_heads} heads x {seq_len} positions x {head_dim} | {rt.describe()} | "
          f"torch {torch.__version__} | {torch.get_num_threads()} CPU threads | {time.strftime('%Y-%m-%d')}\n")
    print("| way | ms per layer (forward + backward) | largest difference from float32 |\n|---|---|---|")
    for name, way in WAYS.items():
        fn = torch.compile(way, fullgraph=True) if rt.compile else way
        with torch.no_grad(), rt.autocast():
            error = (fn(q, k, v).float() - reference).abs().max().item()
        seconds = time_way(fn, q, k, v, grad, rt)
        print(f"| {name} | {1e3 * seconds:.1f} | {error:.1e} |", flush=True)


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    process.guarded(main, "nothing to keep: a benchmark only prints")
