"""Timing helpers the benchmark tools share: alternating rounds and a median (min-max) figure."""
import statistics


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
