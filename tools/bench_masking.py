"""What drawing each row's mask from its own key costs, beside drawing a batch's masks from one generator.

    python tools/bench_masking.py                       # a micro-batch of 128 rows of 128 tokens, on the CPU
    python tools/bench_masking.py --micro_batch=32

train.py masks each training and validation row from a key made of the seed and the row's place in the run
(model.mask_tokens with keys=), so that a row is masked alike at any micro-batch, process count and device. The way
before drew a batch's masks from one torch generator, so they depended on how the rows were batched. Both ways run
here on the same rows, interleaved round by round; a row of the output is ms per micro-batch, the fastest, median and
slowest of `rounds` rounds (each the mean of `repeats` calls).
"""
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up; first, for torch's temporary folder)
import torch  # noqa: E402
from model import MASK_RATE, mask_tokens  # noqa: E402

# -----------------------------------------------------------------------------
micro_batch = 128         # [1, 65536]: rows a micro-batch
seq_len = 128             # [2, 65536]
vocab_size = 32768        # [5, 4294967295]
mask_rate = MASK_RATE     # (0, 1)
threads = 1               # [1, 1024]: torch's CPU threads (a training step's masking runs beside the step's own work)
repeats = 20              # [1, 100000]: calls a round
rounds = 7                # [1, 10000]
# -----------------------------------------------------------------------------


def per_call_ms(draw, repeats):
    """The mean milliseconds of `repeats` calls of draw()."""
    started = time.perf_counter()
    for _ in range(repeats):
        draw()
    return (time.perf_counter() - started) / repeats * 1e3


def main():
    torch.set_num_threads(threads)
    n_regular, mask_id = vocab_size - 5, vocab_size - 4
    print(f"ms per micro-batch of {micro_batch} x {seq_len} tokens, mask rate {mask_rate}, {threads} thread(s): "
          f"fastest, median, slowest of {rounds} rounds")
    idx = torch.randint(0, n_regular, (micro_batch, seq_len))
    keys, generator = torch.arange(micro_batch, dtype=torch.int64) * 7919 + 12345, torch.Generator().manual_seed(0)
    ways = {"one generator per batch (before)": lambda: mask_tokens(idx, mask_rate, mask_id, n_regular, generator),
            "a key per row (train.py)": lambda: mask_tokens(idx, mask_rate, mask_id, n_regular, keys=keys)}
    times = {name: [] for name in ways}
    for _ in range(rounds):  # interleaved, so that the machine's noise falls on both alike
        for name, draw in ways.items():
            times[name].append(per_call_ms(draw, repeats))
    for name, ms in times.items():
        print(f"  {name:<34} {min(ms):.3f} {statistics.median(ms):.3f} {max(ms):.3f}")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    main()
