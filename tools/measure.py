"""What the benchmark tools share: their tokens, alternating rounds and a median (min-max) figure."""
import statistics

from data import load_tokens, random_tokens  # the core: each tool puts its folder on sys.path first
from files import load_meta


def benchmark_tokens(data_dir, vocab_size, seq_len, seed):
    """(tokens, where from): data_dir's prepared sequences when they match the shape, else random
    regular tokens."""
    try:
        meta = load_meta(data_dir)
        if meta["vocab_size"] == vocab_size and meta["seq_len"] == seq_len:
            return load_tokens(data_dir, "train", meta), data_dir
    except SystemExit:
        pass
    return random_tokens(vocab_size, seq_len, seed), "random tokens"


def alternate(timers, n_repeats):
    """{name: [seconds per call, one per round]}, the timers called in turn each round (A B A B),
    so that a drifting machine slows all of them alike."""
    times = {name: [] for name in timers}
    for _ in range(n_repeats):
        for name, timer in timers.items():
            times[name].append(timer())
    return times


def spread(values, fmt="{:,.0f}"):
    """median (min-max)"""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def gib(n_bytes):
    """Bytes in GiB for a table, or '-' when there is no figure (a CPU has no device peak)."""
    return f"{n_bytes / 2 ** 30:.1f}" if n_bytes is not None else "-"
