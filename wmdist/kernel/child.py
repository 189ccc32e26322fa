"""The forked kernel's side of the zygote: made to look fresh, then ipykernel, then an interpreter's exit.

What zygote.py's `_become_kernel` calls in the child after the fork (why each: its docstring).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import sys
import threading
import time


def look_fresh(*, threads: int) -> None:
    """Random states from fresh entropy (`random` reseeds at fork) and torch's threads, as a new process has them
    (the zygote's own count: it serves only kernels with its THREAD_VARIABLES)."""
    import torch

    torch.seed()
    torch.set_num_threads(threads)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def give_back_freed_memory_after_cells(app: object) -> None:
    """After each cell, return the heap's free pages to the system (glibc's malloc_trim), so a kernel left open
    holds what its notebook keeps, not what a cell once used: measured 230 -> 96 MB USS after chapter 06."""
    from wmdist.runtime.cleanup import heap_trimmer

    trim = heap_trimmer()
    app.shell.events.register("post_execute", trim)   # type: ignore[attr-defined]


def register_widget_targets() -> None:
    """Register ipywidgets' comm targets ("jupyter.widget", "jupyter.widget.control") with this kernel.

    ipywidgets registers them when it is imported inside a running kernel (its `_handle_ipython`). The zygote
    imported it with no kernel, so here a notebook's `import ipywidgets` is a no-op and the targets would never
    be registered: the page's widget manager probes the kernel with a "jupyter.widget.control" comm at every
    connection, the kernel answers a comm_close, and that comm_close reaches every page on the kernel, which
    log "Comm not found for comm id ..." when they hold no such comm (a second window, a reload, a reconnect).
    Called once the kernel exists (after `IPKernelApp.initialize`), as the import would in a fresh kernel."""
    widgets = sys.modules.get("ipywidgets")
    if widgets is not None:
        widgets.register_comm_target()


def end_with_launcher(launcher: int) -> None:
    """End this kernel when its launcher ends (Jupyter killed it): SIGTERM first, as Jupyter would send."""
    try:
        fd = os.pidfd_open(launcher)
    except OSError:
        os.kill(os.getpid(), signal.SIGTERM)
        return

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        os._exit(1)

    threading.Thread(target=watch, name="wmdist-launcher-watch", daemon=True).start()


def take_own_command_line(argv: list[str]) -> None:
    """Give this forked kernel its own command line: `sys.orig_argv`, the title `ps` shows (/proc/self/cmdline)
    and the name (/proc/self/comm, "wmdist-kernel"), which it would otherwise share with the zygote.

    The title is written over the zygote's argument strings, as setproctitle does (no library needed on Linux):
    one string, `argv` joined by spaces, or `wmdist kernel -f <connection file's name>` where that does not fit
    in the space the zygote's arguments had; the last byte left non-zero tells Linux to read it up to its end."""
    sys.orig_argv = list(argv)
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as comm:
            comm.write("wmdist-kernel")
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()     # fields 3 onwards; arg_start and arg_end are 48, 49
        start, end = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return                                                # not Linux: sys.orig_argv is what can be given
    size = end - start
    title = " ".join(argv).encode()
    if len(title) > size - 2:
        title = " ".join(["wmdist kernel", *(os.path.basename(a) for a in argv[-2:])]).encode()[:max(0, size - 2)]
    if size >= 2:
        import ctypes

        ctypes.memmove(start, title + b"\0" + b" " * (size - len(title) - 1), size)


def exit_like_an_interpreter(code: int) -> None:
    """Join threads, run exit handlers, flush, exit: what returning from a script does (never returns)."""
    with contextlib.suppress(BaseException):
        threading._shutdown()                 # type: ignore[attr-defined]  (what the interpreter calls at exit)
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)
