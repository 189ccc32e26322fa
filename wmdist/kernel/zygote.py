"""The zygote: imports what every course kernel imports, once, then forks a kernel per request.

Its children share every page it imported (copy-on-write), so a kernel costs
only what its own notebook computes (why: the package docstring). It is a
single-threaded loop, because only a process with one thread can fork safely:
it never runs torch code, starts no thread, and refuses a request if a thread
appeared anyway, or if the kernel's thread settings differ from its own (the
launcher then starts a plain kernel).

A forked kernel must look like a freshly started one: it gets the launcher's
arguments, environment, working directory and standard streams, default
signal handlers, torch's thread count, torch and numpy seeded from fresh entropy as a new process
seeds them (Python's `random` reseeds itself after a fork), a new multiprocessing
authkey, and a process group of its own. What it cannot renew it shares with the
zygote: the str hash seed, sys.path as the zygote started (a .pth file installed
later is not read until the server restarts), the atexit handlers the preload
registered. It ends when its launcher ends (SIGTERM from its own watcher, SIGKILL
from the zygote KILL_GRACE_S later if it is stuck in C code), and not when the
zygote ends. Its exit status goes back to the launcher. The
kernels of one zygote are neighbours (`WMDIST_NEIGHBOURHOOD`): a kernel
starting ranks asks the others to close their idle ones (runtime/pool_budget.py).

The zygote lives as long as the Jupyter server it serves (`--home`), and after
that until its last kernel has exited. If a module it imported has changed on
disk since (a course file edited, a package upgraded), it answers "stale",
stops listening and leaves the next kernel to a fresh zygote, so a restarted
kernel never runs old code.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from wmdist.kernel import child
from wmdist.runtime.pool_budget import NEIGHBOURHOOD_VARIABLE

# Imported in this order; missing optional ones are skipped. `wmdist.runtime.frozen` comes last: it
# imports torch._dynamo (which torch.optim imports on first use) and freezes the garbage collector.
# Not matplotlib_inline.backend_inline: importing it is what hooks a kernel's shell up to show figures as
# images, and the zygote has no shell, so each kernel imports it (small) with its first figure.
PRELOAD = ["numpy", "torch", "torch.distributed", "torch.nn.functional", "torch.optim", "matplotlib",
           "matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.Image",
           "ipykernel.kernelapp", "ipykernel.ipkernel", "ipywidgets", "cloudpickle", "psutil", "wmdist",
           "wmdist.registry.demos", "wmdist.ui", "wmdist.runtime.frozen"]
# Read once, when torch starts (OpenMP and MKL cap and combine them their own way): a kernel whose values differ
# from the zygote's cannot be given a fresh process's thread count, so it is refused (it gets a kernel of its own).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
KILL_GRACE_S = 5.0             # after its launcher ends, a kernel has this long to end itself before SIGKILL


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wmdist.kernel zygote")
    parser.add_argument("--home", type=int, required=True, help="the Jupyter server's pid: serve while it lives")
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    args = parser.parse_args(argv)
    started = time.monotonic()
    threads = _preload()
    print(f"wmdist zygote {os.getpid()}: preloaded {len(sys.modules)} modules in "
          f"{time.monotonic() - started:.1f} s; serving {args.home}", flush=True)
    Zygote(args.socket, home=args.home, threads=threads).serve()
    return 0


def _preload() -> int:
    """Import PRELOAD as the kernel will use it, with torch on one thread; return the threads torch would use."""
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]                      # as ipykernel_launcher does; IPython puts '' back in the kernel
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")   # what ipykernel sets
    import torch

    threads = torch.get_num_threads()         # what a fresh process would use (reading it starts no thread)
    torch.set_num_threads(1)                  # an import that runs a torch op must not start OpenMP's threads:
    for name in PRELOAD:                      # a fork keeps none of them, and the kernel's first op would hang
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    from wmdist.registry import demos

    demos.registry()                         # every chapter's modules, as a notebook's imports bring them
    gc.collect()                             # and out of the collector's reach, as frozen.py did for the rest:
    gc.freeze()                              # a kernel's collections would copy the pages they walk
    return threads


def _module_mtimes() -> dict[str, int]:
    stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            with contextlib.suppress(OSError):
                stamps[path] = os.stat(path).st_mtime_ns
    return stamps


class Zygote:
    """The serving loop: accept a request, fork a kernel, reap kernels and report their exit status."""

    def __init__(self, path: str, *, home: int, threads: int):
        self.path = path
        self.threads = threads
        self.home_pid = home
        self.stamps = _module_mtimes()
        self.thread_settings = {name: os.environ.get(name) for name in THREAD_VARIABLES}
        self.kernels: dict[int, socket.socket] = {}        # kernel pid -> its launcher's connection
        self.launchers: dict[int, int] = {}                # kernel pid -> a pidfd of its launcher
        self.orphaned: dict[int, float] = {}               # kernel pid -> when to SIGKILL it (launcher gone)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(16)
        try:
            self.home: int | None = os.pidfd_open(home)
        except OSError:
            self.home = None                  # the server is already gone: serve nobody new

    def serve(self) -> None:
        while True:
            self._reap()
            if self.listener is None and not self.kernels:
                return
            waiting = [s for s in (self.listener, self.home, *self.launchers.values()) if s is not None]
            ready = select.select(waiting, [], [], 0.5)[0] if waiting else time.sleep(0.5) or []
            self._end_orphans(ready)
            if self.home is not None and self.home in ready:
                os.close(self.home)
                self.home = None
                self._stop_listening()        # the server ended: no new kernels; wait for the last ones
            elif self.listener is not None and self.listener in ready:
                conn, _ = self.listener.accept()
                try:
                    self._answer(conn)
                except Exception as exc:                 # a bad request, a failed fork: say so, serve on
                    traceback.print_exc()
                    self._reply(conn, {"error": f"{type(exc).__name__}: {exc}"})

    def _end_orphans(self, ready: list) -> None:
        """A kernel whose launcher ended (Jupyter killed it) gets SIGTERM from its own watcher; one still alive
        KILL_GRACE_S later (stuck in C code holding the GIL) is killed with its process group, as Jupyter would."""
        for pid, fd in list(self.launchers.items()):
            if fd in ready:
                os.close(self.launchers.pop(pid))
                self.orphaned[pid] = time.monotonic() + KILL_GRACE_S
        for pid, deadline in list(self.orphaned.items()):
            if time.monotonic() >= deadline:
                del self.orphaned[pid]
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def _stop_listening(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def _stale(self) -> bool:
        for path, stamp in self.stamps.items():
            try:
                if os.stat(path).st_mtime_ns != stamp:
                    return True
            except OSError:
                return True
        return False

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the launcher closed the connection mid-request")
            data += chunk
        request = json.loads(data)
        try:
            if len(fds) != 3:
                return self._reply(conn, {"error": f"expected 3 standard streams, got {len(fds)}"})
            if self._stale():
                self._stop_listening()
                return self._reply(conn, {"stale": True})
            asked = {name: request["env"].get(name) for name in THREAD_VARIABLES}
            if asked != self.thread_settings:
                return self._reply(conn, {"error": f"the kernel's thread settings {asked} are not the zygote's "
                                                   f"{self.thread_settings}"})
            if threading.active_count() != 1:
                return self._reply(conn, {"error": "the zygote has a thread; forking it would be unsafe"})
            sys.stdout.flush()
            sys.stderr.flush()
            launcher = os.pidfd_open(int(request["launcher"]))
            try:
                pid = os.fork()
            except OSError:
                os.close(launcher)
                raise
            if pid == 0:
                self._become_kernel(conn, request, fds)      # never returns
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)                         # also done in the child: whichever runs first
            self.kernels[pid] = conn
            self.launchers[pid] = launcher
            conn.settimeout(None)
            self._reply(conn, {"pid": pid}, close=False)
        finally:
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _reply(conn: socket.socket, message: dict, *, close: bool = True) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(message).encode() + b"\n")
        if close:
            conn.close()

    def _reap(self) -> None:
        while self.kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.kernels.pop(pid, None)
            self.orphaned.pop(pid, None)
            if pid in self.launchers:
                os.close(self.launchers.pop(pid))
            if conn is not None:
                self._reply(conn, {"exit": os.waitstatus_to_exitcode(status)})

    def _become_kernel(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """In the forked child: turn into a fresh kernel, run ipykernel, exit (never returns)."""
        code = 1
        try:
            os.setpgid(0, 0)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
            for sock in [self.listener, conn, *self.kernels.values()]:
                if sock is not None:
                    sock.close()
            for fd in [self.home, *self.launchers.values()]:
                if fd is not None:
                    os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            os.environ.pop("JPY_PARENT_PID", None)   # ipykernel would end the kernel if the zygote died; it ends
                                                     # with its launcher instead (below)
            import multiprocessing

            multiprocessing.current_process().authkey = os.urandom(32)   # a fresh process draws its own
            os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
            os.environ.setdefault(NEIGHBOURHOOD_VARIABLE, f"jupyter-{self.home_pid}")   # see runtime/pool_budget.py
            child.look_fresh(threads=self.threads)
            child.end_with_launcher(int(request["launcher"]))
            child.take_own_command_line([sys.executable, "-m", "wmdist.kernel", *request["argv"]])   # its launcher's
            sys.argv = ["ipykernel_launcher", *request["argv"]]
            from ipykernel import kernelapp

            app = kernelapp.IPKernelApp.instance()            # what launch_new_instance does, with one hook
            app.parent_handle = 1     # ipykernel's "no parent to poll": its poller would end the kernel when the
                                      # zygote dies; it ends with its launcher instead (the default came from the
                                      # zygote's JPY_PARENT_PID, read at import; 0 would print connection info)
            app.initialize(request["argv"])
            child.register_widget_targets()                  # the preloaded import could not (no kernel then)
            child.give_back_freed_memory_after_cells(app)
            app.start()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            child.exit_like_an_interpreter(code)
