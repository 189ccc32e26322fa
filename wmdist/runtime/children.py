"""A rank's own child processes (a DataLoader's workers, a multiprocessing.Pool, os.fork): allowed, and
ended with the call that started them.

Ranks are daemonic processes in the parent (so an exiting parent ends them rather than waiting for
them), and multiprocessing refuses to start children from a daemonic process ("daemonic processes
are not allowed to have children"), which broke `DataLoader(num_workers=2)` in a rank function.
`allow_children` clears the flag inside the rank only: the parent's view is unchanged. Whatever a
call starts must then not outlive it, nor the rank:

- every process forked in a rank (os.fork, multiprocessing's fork, a DataLoader worker) asks the
  kernel to kill it when its parent ends (PR_SET_PDEATHSIG, set in the child by an at-fork hook,
  inherited further down), so a rank that is killed takes its children with it;
- at the end of each call the rank kills what the call left running (`end_children`), and
- the pool, when it closes, kills the ranks' descendants too (`descendants`), which also reaches
  processes started by exec (subprocess, multiprocessing's spawn) that no fork hook sees.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import multiprocessing as mp
import os
import signal
import sys
from multiprocessing import forkserver
from typing import Any, Iterator

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(*, parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends; end now if `parent` has already gone."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def allow_children() -> None:
    """Let this rank start child processes, each of which dies with its parent (once per rank process).

    A rank inherits the forkserver start method it was started with, so a DataLoader in it would
    start a forkserver of its own (importing torch again, seconds); it starts its children by fork,
    as a Linux script does, with torch already loaded.
    """
    mp.current_process().daemon = False
    if "fork" in mp.get_all_start_methods():
        mp.set_start_method("fork", force=True)
    parent = [os.getpid()]
    os.register_at_fork(before=lambda: parent.__setitem__(0, os.getpid()),
                        after_in_child=lambda: die_with_parent(parent=parent[0]))


@contextlib.contextmanager
def main_names(fn: Any) -> Iterator[None]:
    """Let child processes find by name what `fn`, shipped by value from the parent's __main__, refers to.

    multiprocessing pickles a task's function by reference (`__main__.square`), and a notebook's
    functions exist in a rank only inside the shipped function's globals, not in the rank's own
    __main__; a multiprocessing.Pool then failed with "attribute lookup square on __main__ failed".
    Those names are put into the rank's __main__ for the call (forked children see them), then removed.
    """
    main = sys.modules.get("__main__")
    names = getattr(fn, "__globals__", {}) if getattr(fn, "__module__", None) == "__main__" else {}
    added = [k for k in names if main is not None and not hasattr(main, k)]
    for key in added:
        setattr(main, key, names[key])
    try:
        yield
    finally:
        for key in added:
            with contextlib.suppress(AttributeError):
                delattr(main, key)


def _children() -> list[int]:
    """This process's own children, from /proc (psutil where the kernel does not list them there).

    Asked after every call, so the usual answer, none, comes from one system call (waitid, which
    reaps nothing) instead of reading a file per thread (a rank has dozens: 0.1-0.2 ms per call).
    """
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return []
    files = glob.glob(f"/proc/{os.getpid()}/task/*/children")
    if not files:
        return [p.pid for p in psutil.Process().children()]
    pids: set[int] = set()
    for path in files:
        with contextlib.suppress(OSError), open(path) as f:
            pids.update(map(int, f.read().split()))
    return sorted(pids)


def descendants(pids: list[int]) -> list[psutil.Process]:
    """Every live process below the processes `pids` (found before they are killed: orphans lose their parent)."""
    below: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):       # one pass over /proc for all of them
        below.setdefault(proc.info["ppid"], []).append(proc.pid)
    found, todo = [], list(pids)
    while todo:
        for pid in below.get(todo.pop(), []):
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
                todo.append(pid)
    return found


def kill(procs: list[psutil.Process]) -> None:
    """SIGKILL each of `procs` that is still the process it was (psutil checks its start time)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def end_children() -> None:
    """Kill every process this rank's call left running, and their own children; reap this rank's."""
    children = _children()
    if not children:
        return
    procs = descendants(children)            # found while their parents still live
    for pid in children:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    kill(procs)
    server = forkserver._forkserver          # a forkserver the call started: reaped and forgotten (next use restarts)
    for pid in children:
        with contextlib.suppress(Exception):
            server._stop() if pid == server._forkserver_pid else os.waitpid(pid, 0)
