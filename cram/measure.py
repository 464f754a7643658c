"""What the tools share: the benchmarks' tokens, alternating rounds and median (min-max) figures; whether a run's
folder is in use."""
import os
import statistics

from .data import load_tokens, random_tokens  # the core: each tool puts its folder on sys.path first
from .files import LOCK_FILE, load_meta


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


def held_below(folder):
    """(a folder, the pid its lock file names) of a live process holding a folder at or below `folder`
    (claim_folder), or None: checked before a tool removes a run's folder, whose train.py may outlive
    the tool that started it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no locks to find
        return None
    for path, _, names in os.walk(folder):
        if LOCK_FILE not in names:
            continue
        try:
            with open(os.path.join(path, LOCK_FILE)) as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused while claim_folder's LOCK_EX is held
                except OSError:
                    return path, lock.read().strip() or "?"
        except OSError:  # gone meanwhile
            continue
    return None
