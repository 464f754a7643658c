"""What the tools share: alternating rounds and median (min-max) figures; whether a run's folder is in use; a picture
written whole."""
import os
import statistics

from cram.files import HELD_ERRNOS, LOCK_FILE, write_atomically  # the core: each tool puts the repository's folder on sys.path first


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
            with open(os.path.join(path, LOCK_FILE), encoding="utf-8") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused while claim_folder's LOCK_EX is held
                except OSError as e:  # held, or a file system that cannot lock (then nothing holds it)
                    if e.errno in HELD_ERRNOS:
                        return path, lock.read().strip() or "?"
        except OSError:  # gone meanwhile
            continue
    return None


def save_figure(fig, path, dpi):
    """A matplotlib figure written to `path` whole or not at all (write_atomically: a full disk or a stop leaves the
    picture that was there), in the format its suffix names (.png, .svg, .pdf; none: PNG) as savefig would pick it:
    the temporary name's own suffix (.tmp) names none."""
    suffix = os.path.splitext(path)[1][1:].lower()
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=suffix or "png"))
