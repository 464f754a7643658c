"""One script run in a child forked from a process that has imported torch already (conftest's
run_script): the run a user's `python script.py args` makes, without paying torch's ~2.5 s import
each time. It imports nothing but the standard library, so the script imports cram's own modules
afresh, from wherever the script lives.

The child is made to look like a fresh interpreter: the script's argv, working folder, environment
and sys.path (its own folder first, then a fresh interpreter's path), standard output and error on
files as a pipe would be, unbuffered as PYTHONUNBUFFERED=1 makes them; its exit status as python
gives it (SystemExit's code or message, 1 and a traceback for an error, killed by SIGINT for an
uncaught Ctrl-C); multiprocessing's default start method the platform's; and, before it ends,
what python's own exit does: non-daemon threads joined, objects freed (so files the script left
open are flushed), atexit's functions run, C's stdio flushed. What stays the server's: the string
hash seed (two runs compared byte for byte cannot show an order that depends on it) and the
warnings torch prints as it is imported.
"""
import atexit
import ctypes
import gc
import io
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import traceback


def exit_code(e):
    """The status python exits with for a SystemExit (a message is printed to stderr and gives 1)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def run(script, argv, cwd, env, fresh_path, out_path, err_path):
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    sys.stdin = open(os.devnull)
    sys.argv = argv
    sys.path[:] = [os.path.dirname(os.path.realpath(script)), *fresh_path]
    multiprocessing.set_start_method(None, force=True)  # the platform's default again, not the server's
    code, interrupted = 0, False
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = exit_code(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # as python's exit: wait for the script's non-daemon threads
            gc.collect()  # the script's objects freed: files it left open are flushed
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            ctypes.CDLL(None).fflush(None)  # what C or C++ code wrote through stdio
    if interrupted:  # as python does for an uncaught KeyboardInterrupt: the status of a SIGINT kill
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
