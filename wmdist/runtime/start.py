"""How rank processes are started: from multiprocessing's forkserver with torch preloaded, deaf to
Ctrl-C while it imports (a Ctrl-C meant for the parent is held, never dropped), waited for in a way
Ctrl-C and the call's timeout can end, replaced the moment it has been killed, and never re-running the
parent's __main__ (pool.py starts them)."""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import signal
import threading

import psutil

_INSTALL = threading.Lock()    # guards the one-time, process-wide hooks (never_reimport_main_in_ranks, spawn)
_READY: set[int] = set()       # forkservers (by pid) that have forked once: their preload is imported

# Preloaded in the forkserver, so every rank forks with them already imported and shares their
# pages. Heavier, rarely used imports are left to the demos that need them, because every
# preloaded module costs memory in the whole tree (measured: torch.distributed.checkpoint
# +30 to 50 MB, torch.distributed.optim +80 MB over 8 ranks). `frozen` comes last: it adds
# torch._dynamo, which every torch optimizer imports, and freezes the garbage collector (why: its docstring).
_PRELOAD = ["torch", "torch.distributed", "cloudpickle", "wmdist.comm", "wmdist.runtime.rank", "wmdist.models.world",
            "wmdist.runtime.frozen"]


def mp_context() -> mp.context.BaseContext:
    """The forkserver context with torch preloaded, its server started (spawn where forkserver does not exist)."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _start_forkserver_deaf_to_ctrl_c()
        return ctx
    return mp.get_context("spawn")


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start multiprocessing's forkserver (if not running) deaf to Ctrl-C, without losing a Ctrl-C meant for us.

    Jupyter's Stop sends SIGINT to the kernel's whole process group. The
    forkserver ignores SIGINT only once it has imported its preload (torch:
    seconds), so Stop during the first pool start killed it mid-import, with a
    traceback on the kernel's stderr and a zombie left until the kernel exits.
    So the forkserver is started ignoring SIGINT from its first instruction:
    `_spawn_deaf_forkserver` blocks SIGINT in the starting thread for the
    fork and exec (the child inherits the mask, not a pending signal), and the
    child's command first ignores SIGINT, then unblocks it.

    The parent's own handler is never changed, so a Ctrl-C during the start
    waits, blocked, and is raised here the moment the fork is done. (Ignoring
    SIGINT in the parent for the fork, as before, dropped it: a few
    milliseconds on a quiet machine, but at load 10 to 23 the window was wide
    enough that a Ctrl-C a second into the call was lost and the call returned
    53 s later.) It works from any thread: only the starting thread blocks it.
    """
    from multiprocessing import forkserver

    _install_deaf_forkserver_spawn()
    drop_killed_forkserver()
    forkserver.ensure_running()


_PF_EXITING = 0x4                                   # the kernel's "this task is exiting" flag (/proc/<pid>/stat)
_SIGKILL_PENDING = 1 << (signal.SIGKILL - 1)        # its bit in /proc/<pid>/status's pending-signal masks


def ending(pid: int | None) -> bool:
    """Whether process `pid` has been killed: gone, a zombie, exiting, or with a SIGKILL pending (False for None).

    A killed forkserver with torch loaded takes a while to die (tens of ms; more on a busy machine), and
    until it is a zombie multiprocessing takes it for alive: a pool started then connected to its socket
    and read end-of-file (EOFError), and a warm pool's ranks, which die with it a moment later, took the
    next call down with them. Linux shows the kill at once: the signal is pending from the `kill()` on,
    and the exiting flag is set as soon as the process acts on it.
    """
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()          # field 3 (state) on; field 9 is the flags word
        if fields[0] in "ZXx" or int(fields[6]) & _PF_EXITING:
            return True
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & _SIGKILL_PENDING
                       for line in f)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return True                                          # Linux, and the process is gone
    except (OSError, ValueError, IndexError):
        pass
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def drop_killed_forkserver() -> bool:
    """Reap and forget multiprocessing's forkserver if it has been killed, so the next start makes a new one
    (True if it had to); a pool's ranks die with it, so a pool from it is not used either (Pool.alive)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    with server._lock:                   # looked at and dropped in one step: another thread may have started anew
        if not ending(server._forkserver_pid):
            return False
        try:
            server._stop_unlocked()                              # waits out its dying (it was killed)
        except ChildProcessError:                                # reaped by someone else: forget it by hand
            with contextlib.suppress(OSError, TypeError):
                os.unlink(server._forkserver_address)
            server._forkserver_pid = server._forkserver_address = None
    return True


_FORKSERVER_COMMAND = "from multiprocessing.forkserver import main"
_DEAF = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); ")


def _install_deaf_forkserver_spawn() -> None:
    """Wrap multiprocessing's `util.spawnv_passfds` (once, process-wide) so the forkserver starts deaf to SIGINT.

    Only the forkserver's command (`python ... -c "from multiprocessing.forkserver import main; ..."`) is
    changed; every other spawn (the resource tracker's) passes through as it was.
    """
    from multiprocessing import util

    with _INSTALL:
        original = util.spawnv_passfds
        if getattr(original, "wmdist_deaf_forkserver", False):
            return

        def spawnv_passfds(path: str, args: list[str], passfds: object) -> int:
            if len(args) < 2 or args[-2] != "-c" or not args[-1].startswith(_FORKSERVER_COMMAND):
                return original(path, args, passfds)
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
            try:
                return original(path, [*args[:-1], _DEAF + args[-1]], passfds)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)    # a Ctrl-C held meanwhile arrives now

        spawnv_passfds.wmdist_deaf_forkserver = True   # type: ignore[attr-defined]
        util.spawnv_passfds = spawnv_passfds


def forkserver_pid(ctx: mp.context.BaseContext) -> int | None:
    """The process id of the forkserver that `ctx` starts processes from (None under spawn)."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None) if ctx.get_start_method() == "forkserver" else None


def _nothing() -> None:
    """The probe's whole life (see forkserver_ready)."""


def forkserver_ready(ctx: mp.context.BaseContext, *, within: float) -> bool:
    """Wait up to `within` seconds for the forkserver to have imported its preload; False if it has not.

    The forkserver forks only once its preload (torch: seconds, more on a busy machine) is imported,
    and starting a process waits for that fork without a timeout. Started while Ctrl-C was held back
    (pool.py tracks every rank it starts), a first pool start took seconds to act on Ctrl-C and
    ignored the call's timeout. So a probe process that does nothing is started first, in a thread,
    and waited for here, where Ctrl-C and the deadline both end the wait; a probe abandoned that
    way still starts and ends by itself. Once it has started, the ranks start in milliseconds, and
    that forkserver is not probed again.
    """
    server = forkserver_pid(ctx)
    if server is None or server in _READY:
        return True
    started = threading.Event()

    def probe() -> None:
        proc = ctx.Process(target=_nothing, name="wmdist-rank-probe", daemon=True)
        try:
            proc.start()
        finally:
            started.set()
        proc.join()

    threading.Thread(target=probe, name="wmdist-forkserver-probe", daemon=True).start()
    if not started.wait(max(within, 0.0)):
        return False
    _READY.add(server)
    return True


def never_reimport_main_in_ranks() -> None:
    """Start ranks without re-running the parent's __main__ in them (installed once, process-wide).

    multiprocessing normally re-imports the parent's main script in every
    child, so that functions defined there can be found. Ranks never need it
    (functions travel by value), and re-running it breaks when the main
    program is stdin or a script without an `if __name__ == "__main__"` guard
    (and runs a guarded script's top level again). multiprocessing asks
    `spawn.get_preparation_data(name)` what a child should prepare, with the
    child's name, so a wrapper drops the main module for processes named
    "wmdist-rank*" only. It stays installed: swapping it in and out around a
    start raced with a second thread starting its own pool.
    """
    with _INSTALL:
        original = mp_spawn.get_preparation_data
        if getattr(original, "wmdist_ranks_skip_main", False):
            return

        def preparation_data(name: str) -> dict:
            data = original(name)
            if name.startswith("wmdist-rank"):
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
            return data

        preparation_data.wmdist_ranks_skip_main = True   # type: ignore[attr-defined]
        mp_spawn.get_preparation_data = preparation_data
