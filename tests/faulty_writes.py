"""`python tests/faulty_writes.py PATTERN HOW SKIP SCRIPT ARGS...`: SCRIPT run as `python SCRIPT ARGS...`, except that
its writes of a file whose name matches PATTERN (fnmatch, on the name alone: 'ckpt.pt*' takes its temporary names too)
fail midway, after the first SKIP such files were written whole: half of the bytes written, then HOW: 'full' an OSError
(a full disk), 'stop' a stop (SIGTERM, as process.take_signals turns one into KeyboardInterrupt). 'nolink' instead
makes every hard link fail (a file system without them) and the writes of PATTERN fail as 'full' does.

The writers are those the project calls: Python's open (and pathlib's, shutil's copies), torch.save and safetensors'
save_file, the last two cut to half their file after writing it (their C++ and Rust write it themselves)."""
import builtins
import errno
import fnmatch
import io
import os
import runpy
import shutil
import signal
import sys

pattern, how, skip, script = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.argv = sys.argv[4:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
seen = []


def matches(file):
    return isinstance(file, (str, bytes, os.PathLike)) and fnmatch.fnmatch(os.path.basename(os.fsdecode(file)), pattern)


def failing():
    """Whether the write that starts now (a matching file's first bytes) is the one to fail."""
    seen.append(1)
    return len(seen) > skip


def fault():
    if how == "stop":
        raise KeyboardInterrupt(signal.SIGTERM)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Cut:
    """A matching file opened for writing: its first write decides (failing) whether it writes half of its bytes and
    fails; opened and closed without a write (a check that it can be written), it counts for nothing."""

    def __init__(self, f):
        self.f, self.fails = f, None

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.fails = failing() if self.fails is None else self.fails
        if not self.fails:
            return self.f.write(data)
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        fault()


real_open = io.open


def faulty_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    return Cut(f) if any(c in mode for c in "wax+") and matches(file) else f


def cut_after(save):
    def faulty_save(obj, file, *args, **kwargs):
        save(obj, file, *args, **kwargs)
        if matches(file) and failing():
            os.truncate(file, os.path.getsize(file) // 2)
            fault()
    return faulty_save


builtins.open = io.open = faulty_open
shutil._USE_CP_SENDFILE = False  # copies through write(), which fails
import torch  # noqa: E402
torch.save = cut_after(torch.save)
try:
    import safetensors.torch
    safetensors.torch.save_file = cut_after(safetensors.torch.save_file)
except ImportError:
    pass
if how == "nolink":
    how = "full"

    def no_link(*args, **kwargs):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))
    os.link = no_link
runpy.run_path(script, run_name="__main__")
