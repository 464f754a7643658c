"""The process around a script's work: the signals that ask it to stop, its faults made one line, the scripts a tool
starts (they end with it), progress lines, and what the machine has (an optional module, the hub). Every script's main
runs inside guarded(); train.py's loop takes the signals over; the configurator keeps the output streams."""
import contextlib
import errno
import importlib
import os
import re
import signal
import socket
import sys
import time

from configurator import printable


def progress(total=None, desc="", unit="it", initial=0, leave=True, every=60.0):
    """A progress bar with its ETA on a terminal (tqdm); elsewhere (a log file: `nohup ... > log`),
    where tqdm's carriage returns pile up into one endless line, a plain line every `every` seconds."""
    if sys.stderr.isatty():
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave)
    return LogProgress(total, desc, unit, initial, every)


class LogProgress:
    """tqdm's n, update(), set_postfix() and close() as a line on stderr every `every` seconds:
    'encoding: 1,024/4,096 docs (25%), 12.3/s, about 4.2 min left, train_tokens=...'."""

    def __init__(self, total, desc, unit, initial, every):
        self.total, self.desc, self.unit, self.n, self.every, self.start_n, self.postfix = total, desc, unit.strip(), initial, every, initial, ""
        self.start = self.last = time.monotonic()

    def update(self, n=1):
        self.n += n
        if time.monotonic() - self.last >= self.every:
            self.write()

    def set_postfix(self, **values):
        self.postfix = "".join(f", {k}={v}" for k, v in values.items())

    def write(self):
        self.last = time.monotonic()
        rate = (self.n - self.start_n) / max(self.last - self.start, 1e-9)
        done = f"{self.n:,}/{self.total:,} {self.unit} ({100 * self.n / self.total:.0f}%)" if self.total else \
            f"{self.n:,} {self.unit}"
        left = f", about {(self.total - self.n) / rate / 60:.1f} min left" if self.total and rate > 0 else ""
        print(f"{self.desc}: {done}, {rate:,.1f}/s{left}{self.postfix}", file=sys.stderr, flush=True)

    def close(self):
        pass


def hub_reachable(timeout=3.0):
    """Whether the Hugging Face hub answers; False at once when the offline switches are set."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    with contextlib.suppress(OSError):
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    return False


def installed(module):
    """Whether an optional dependency can be imported: asked before the work that needs it."""
    with contextlib.suppress(ImportError):
        importlib.import_module(module)
        return True
    return False


# The signals that end a run from outside, each taken as Ctrl-C is (train.py finishes the step, saves
# and exits 128 + n): SIGINT (Ctrl-C); SIGTERM (schedulers, pre-emption; PBS and SLURM at the time
# limit); SIGHUP (a closed terminal, a dropped ssh session); SIGUSR1 and SIGUSR2 (sent ahead of the kill
# by SLURM's --signal, SGE's -notify and LSF); SIGXCPU (a CPU-time limit: ulimit -t, a batch system's).
# SIGKILL and SIGSTOP cannot be caught (the last periodic checkpoint is what a kill leaves). Those a
# platform lacks are left out (Windows has SIGINT and SIGTERM of them, and SIGBREAK: Ctrl-Break).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGXCPU",
                                                        "SIGBREAK") if hasattr(signal, name))
PARENT_VAR = "CRAM_PARENT_PID"  # set by child_env for a cram script a tool starts; read by its guarded()
INTERRUPTS = [0]  # Ctrl-Cs since a stop began (held)


def child_env(env=None):
    """The environment for a cram script this process starts: with this pid, which the child follows (follow_parent)."""
    return dict(os.environ if env is None else env, **{PARENT_VAR: str(os.getpid())})


def follow_parent():
    """In a cram script a tool started (child_env): SIGTERM when that tool ends, however it ends (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing), at once if it has ended already, so a train.py stops and saves instead of
    training on into the tool's rerun; a process this one starts follows it only if given child_env too."""
    parent = os.environ.pop(PARENT_VAR, None)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # it ended before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def take_signals(handler):
    """`handler` for each of STOP_SIGNALS, except those the parent set to be ignored: a run under
    nohup keeps ignoring SIGHUP, a shell script's background job SIGINT, as they ask."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


def interrupt(signum, frame):
    """Before the loop, turns a stop signal into a KeyboardInterrupt, as Ctrl-C's, so the work unwinds through its
    finally blocks. Repeats after the first are handled by held."""
    take_signals(lambda repeat, _: held(repeat))
    held(signum)
    raise KeyboardInterrupt(signum)


def exit_stopped(signum):
    """Exit with a stop signal's status, 128 + n, its repeats ignored (not Ctrl-C's): Python's exit restores default
    handlers, and a soft CPU limit's next SIGXCPU would end the process by the signal, not with the status."""
    for other in set(STOP_SIGNALS) - {signal.SIGINT}:
        signal.signal(other, signal.SIG_IGN)
    sys.exit(128 + signum)


def held(signum):
    """Handles a stop signal that arrives once a stop is under way. A repeat is the same request, so it leaves the save
    alone: schedulers and terminals often send one signal twice (scancel signals torchrun's workers and torchrun
    forwards it again; a soft CPU limit repeats SIGXCPU every CPU-second; a closed terminal's SIGHUP comes twice).
    A second Ctrl-C is the exception: it kills the process at once, as a user pressing it twice means."""
    INTERRUPTS[0] += signum == signal.SIGINT
    if INTERRUPTS[0] and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def guarded(main, kept, *args):
    """A script's main(*args), the faults that can come at any moment made one line on stderr saying what was kept and
    how to continue (`kept`, or kept() if known only then): Ctrl-C or another of STOP_SIGNALS ('stopped by SIGHUP:
    <kept>', status 128 + n; train.py's loop installs its TrainingClock over this, which finishes its step and saves),
    and the machine's OSError (a full disk: 'error: ...', status 1); output whose reader is gone the configurator
    drops."""
    told = kept if callable(kept) else lambda: kept
    take_signals(interrupt)
    follow_parent()
    with contextlib.suppress(ImportError):  # a CPU-time limit whose soft value is its hard one (ulimit -t) kills at once:
        import resource  # POSIX's. The soft one lowered by 5%, at least a minute, at most a quarter: SIGXCPU stops first
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if soft == hard != resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_CPU, (hard - min(max(60, hard // 20), hard // 4), hard))
    if hasattr(sys.stdout, "reconfigure"):  # a log file (nohup ... > log) gets each line as it is printed
        sys.stdout.reconfigure(line_buffering=True, errors="replace")  # and a character it cannot encode is a ?
    try:
        return main(*args)
    except SystemExit as e:  # its line quotes names and values as given: a newline in one is shown as \n, one line
        e.code = printable(e.code + (f"; {told()}" if getattr(e, "kept", False) else "")) if isinstance(e.code, str) else e.code
        raise
    except (KeyboardInterrupt, RuntimeError) as e:  # a stop inside a lock's wait (a thread pool's) can end as RuntimeError
        stop = e if isinstance(e, KeyboardInterrupt) else e.__context__
        if isinstance(e, RuntimeError) and re.search(r"^Dist|by peer", f"{type(e).__name__} {e}"):  # gloo, NCCL
            sys.stdout.flush()
            print(printable(f"error: another process of this run ended (killed? out of memory?), and this one cannot go "
                            f"on alone ({str(e).split(' This is')[0][-120:]}); {told()}"), file=sys.stderr, flush=True)
            os._exit(1)  # no teardown: a group whose peer is gone can abort the interpreter's ("terminate called ...")
        if not isinstance(stop, KeyboardInterrupt):
            raise
        signum = stop.args[0] if stop.args and stop.args[0] in STOP_SIGNALS else signal.SIGINT
        e.__traceback__ = stop.__traceback__ = None  # frees the stopped frames: their progress bars close before the line
        sys.stdout.flush()
        print(f"stopped by {signal.Signals(signum).name}: {told()}", file=sys.stderr, flush=True)
        exit_stopped(signum)
    except OSError as e:
        full = " (free space on that disk)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        where = f" on {e.filename}" if e.filename else ""
        sys.stdout.flush()
        raise SystemExit(f"error: a file operation{where} failed: {e.strerror or e}{full}; {told()}")
