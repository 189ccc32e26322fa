"""Nothing left behind: temporary directories, helper processes, exit signals, kernel restarts.

A pool's rendezvous directory (`wmdist-*`) and multiprocessing's own
(`pymp-*`, where the forkserver listens) carry an owner file naming the
process that made them. They go when the pool closes or the process exits
normally, and also when it is ended by SIGTERM or SIGHUP: where those would
end the process with nothing cleaned (their default action), a handler cleans
up first and then lets the signal end the process as before. A process killed
outright (SIGKILL, a kernel restart that timed out) cannot clean up, so every
pool start removes the directories whose owner is gone.

In a Jupyter kernel, the pools and multiprocessing's helper processes are
stopped when the kernel is asked to shut down or restart. Otherwise the
kernel spends its shutdown signalling leftover children and is killed by the
frontend before its exit handlers run.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import multiprocessing.process
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any, Callable, Iterator

import psutil

OWNER_FILE = "wmdist-owner"
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def heap_trimmer() -> Callable[[], object]:
    """glibc's malloc_trim(0) as a call of no arguments (a no-op without glibc): it hands the heap's free pages
    back to the system. For a process that idles between pieces of work and should hold what it keeps, not what
    its last piece once used: a kernel between cells, a warm rank between calls."""
    import ctypes
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


def _identity(pid: int) -> str:
    """A process id with its start time, so that a recycled pid is not taken for the owner.

    On Linux the start time is the kernel's own record (clock ticks since boot,
    with the boot's id): fixed for the life of the process. psutil's
    create_time() is not: it adds the boot time in wall-clock seconds, which
    Linux recomputes on every read, so two processes reading it a moment apart
    under NTP disagree by a second, and a live owner was taken for gone (its
    forkserver's socket removed mid-run). Elsewhere, psutil's value to the second.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rsplit(")", 1)[1].split()[19]          # field 22: starttime
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{pid} boot {f.read().strip()} ticks {ticks}"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise psutil.NoSuchProcess(pid) from None                # Linux, and the process is gone
    return f"{pid} {round(psutil.Process(pid).create_time())}"


def mark(path: str) -> str:
    """Write this process's identity into `path`'s owner file, all at once; return `path`.

    Written aside and renamed into place: a pool starting in another thread
    must never read a half-written mark, which it would take for a dead owner.
    """
    aside = os.path.join(path, f".{OWNER_FILE}.{os.getpid()}.{threading.get_ident()}")
    with open(aside, "w") as f:
        f.write(_identity(os.getpid()))
    os.replace(aside, os.path.join(path, OWNER_FILE))
    return path


def make_run_dir() -> str:
    """A fresh `wmdist-*` temporary directory owned by this process."""
    return mark(tempfile.mkdtemp(prefix="wmdist-"))


def _owner_gone(path: str) -> bool:
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            owner = f.read()
        return _identity(int(owner.split(" ", 1)[0])) != owner
    except OSError:
        return False                    # not marked (or not readable): not ours to judge
    except (ValueError, psutil.Error):
        return True                     # the owner no longer exists, or the mark is garbled


def remove_stale(*, tmp: str | None = None) -> list[str]:
    """Remove marked `wmdist-*` and `pymp-*` directories whose owner process is gone; return them."""
    removed = []
    for pattern in ("wmdist-*", "pymp-*"):
        for path in glob.glob(os.path.join(tmp or tempfile.gettempdir(), pattern)):
            if os.path.isfile(os.path.join(path, OWNER_FILE)) and _owner_gone(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def inductor_dirs(*, tmp: str | None = None) -> set[str]:
    """The inductor cache directories (torchinductor_<user>) in the temporary directory now."""
    return set(glob.glob(os.path.join(tmp or tempfile.gettempdir(), "torchinductor_*")))


def remove_empty_inductor_dirs(before: set[str]) -> None:
    """Remove the inductor cache directories made since `before` that are still empty.

    torch.optim imports torch._dynamo on the first optimizer a process builds
    (a demo's single-device reference does), and that import makes an empty
    torchinductor_<user> directory in $TMPDIR; nothing in wmdist compiles, so
    one left empty at exit was made for nothing. One with files is kept.
    """
    for path in inductor_dirs() - before:
        with contextlib.suppress(OSError):
            os.rmdir(path)               # only if still empty


SOCKET_PATH_MAX = 107     # bytes in a Unix socket's path on Linux (sun_path holds 108 with its NUL)
FORKSERVER_SUFFIX = len("/pymp-12345678/listener-12345678")   # what multiprocessing adds under the temp dir


def require_short_temp_dir() -> None:
    """Refuse, before any process starts, a temporary directory too deep for the forkserver's socket.

    The ranks start from multiprocessing's forkserver, which listens on a Unix socket at
    TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX; past 107 bytes the start fails deep inside with
    "AF_UNIX path too long" (a test's tmp_path as TMPDIR did, once pytest's run counter grew a digit).
    """
    made = multiprocessing.process.current_process()._config.get("tempdir")
    path = os.path.join(made, "listener-12345678") if made else tempfile.gettempdir() + "x" * FORKSERVER_SUFFIX
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        top = tempfile.gettempdir()
        raise ValueError(f"the temporary directory {top!r} is {len(os.fsencode(top))} bytes long: the ranks' "
                         f"forkserver listens on a Unix socket under it, whose path may be at most "
                         f"{SOCKET_PATH_MAX} bytes, so it must be at most {SOCKET_PATH_MAX - FORKSERVER_SUFFIX}; "
                         f"set TMPDIR to a shorter directory (e.g. /tmp)")


def mark_multiprocessing_dir() -> None:
    """Mark multiprocessing's temporary directory of this process (the forkserver's socket) as ours."""
    path = multiprocessing.util.get_temp_dir()
    if not os.path.exists(os.path.join(path, OWNER_FILE)):
        mark(path)


def remove_multiprocessing_dir() -> None:
    """Remove this process's multiprocessing temporary directory now (a normal exit removes it too)."""
    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


def recover_removed_multiprocessing_dir() -> bool:
    """Make this process's multiprocessing directory again if something removed it; True if it had to.

    The forkserver listens on a socket in that directory, and multiprocessing
    neither notices nor recovers when it goes (a temp cleaner, a learner's
    `rm -rf /tmp/*`): every later start fails with FileNotFoundError. So the
    directory is made again and the deaf forkserver stopped; the next start
    brings up a new one there.
    """
    path = multiprocessing.process.current_process()._config.get("tempdir")
    if path is None or os.path.isdir(path):
        return False
    os.makedirs(path, mode=0o700, exist_ok=True)        # the mode mkdtemp gives it
    stop_helpers()
    return True


def stop_helpers() -> None:
    """Stop (and reap) multiprocessing's forkserver and resource tracker, if this process started them.

    Uses their private `_stop()` methods (what CPython's own tests call): there
    is no public way, and a kernel shutting down waits for every child. The
    forkserver is killed first: it holds nothing once the ranks are gone, and
    its own exit would spend a second tearing down the torch it preloaded.
    """
    from multiprocessing import forkserver, resource_tracker

    server = getattr(forkserver, "_forkserver", None)
    with contextlib.suppress(Exception):
        os.kill(server._forkserver_pid, signal.SIGKILL)
    for helper in (server, getattr(resource_tracker, "_resource_tracker", None)):
        with contextlib.suppress(Exception):
            helper._stop()


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then deliver it: for work that must finish (killing ranks).

    Only the main thread receives KeyboardInterrupt, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, sys._getframe())


def _exit_on_signal(cleanup: Callable[[], None], signum: int, frame: Any) -> None:
    with contextlib.suppress(BaseException):
        cleanup()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)        # end the process by the same signal, as it would have been


def clean_up_on_exit_signals(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` before SIGTERM/SIGHUP end this process, where their action is still the default."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in EXIT_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, functools.partial(_exit_on_signal, cleanup))


def clean_up_on_kernel_shutdown(cleanup: Callable[[], None]) -> None:
    """Inside a Jupyter (ipykernel) kernel, run `cleanup` when the kernel is asked to shut down or restart."""
    ipython = sys.modules.get("IPython")
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython is not None else None
    original = getattr(kernel, "do_shutdown", None)
    if original is None or getattr(original, "wmdist_cleanup", False):
        return

    def do_shutdown(restart: bool) -> Any:
        with contextlib.suppress(Exception):
            cleanup()
        return original(restart)

    do_shutdown.wmdist_cleanup = True   # type: ignore[attr-defined]
    kernel.do_shutdown = do_shutdown
