"""A pool of N warm gloo ranks on this machine, serving function calls over pipes.

The ranks are forked from a forkserver that has torch preloaded (spawn where
forkserver does not exist), join one gloo group through a FileStore in a
fresh temporary directory (no port is ever chosen), and then loop: receive a
cloudpickled (fn, args, kwargs), call fn with a fresh Context, send back the
result or the traceback. The parent waits on every rank's pipe and process
sentinel with a deadline, so a rank that raises, exits, is killed or hangs
ends the call with one RankFailure; the pool is then killed.
`wmdist.runtime.launch` keeps pools warm and is the public entry point.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import shutil
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Callable

import cloudpickle
import torch
import torch.distributed as dist

from wmdist.comm import COMPLETED, Context, Ledger, RankResources

DEFAULT_TIMEOUT_S = 300.0      # generous: Binder CPUs are slow and shared
START_TIMEOUT_S = 120.0
_STATUS_BYTES = 512            # shared buffer per rank: the last communication entered
# Preloaded in the forkserver, so every rank forks with them already imported and shares their
# pages. Heavier, rarely used imports are left to the demos that need them, because every
# preloaded module costs memory in the whole tree (measured: torch.distributed.checkpoint
# +30 to 50 MB, torch.distributed.optim +80 MB over 8 ranks; DDP's first construction pulls
# in torch._dynamo, 2 s).
_PRELOAD = ["torch", "torch.distributed", "cloudpickle", "wmdist.comm", "wmdist.runtime.pool", "wmdist.models"]


class RankFailure(RuntimeError):
    """A rank raised, died or hung. `reason` is raised|exited|signal|timeout|start."""

    def __init__(self, rank: int, reason: str, detail: str, last_comm: str = "", ranks: tuple[int, ...] = ()):
        self.rank, self.reason, self.detail, self.last_comm = rank, reason, detail, last_comm
        self.ranks = ranks or (rank,)
        where = f"\nlast communication entered by rank {rank}: {last_comm}" if last_comm else \
            f"\nrank {rank} had not entered any communication"
        super().__init__(f"rank {rank} {detail}{where}")


# --- rank side --------------------------------------------------------------------

def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if its parent goes away (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _worker_main(rank: int, world_size: int, store_path: str, conn: Any, status: Any) -> None:
    """Rank process: join the group, then serve calls until told to close.

    Ends with os._exit: with torch 2.13 on CPU, interpreter teardown after
    destroy_process_group() can SIGABRT now and then, which would look like a
    failure although the work finished.
    """
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent handles Ctrl-C by killing us
    torch.set_num_threads(1)

    def publish(text: str) -> None:
        status.value = text.encode()[: _STATUS_BYTES - 1]

    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(hours=2))
        conn.send_bytes(cloudpickle.dumps(("ready", os.getpid())))
    except BaseException:
        conn.send_bytes(cloudpickle.dumps(("error", traceback.format_exc(), "")))
        os._exit(1)
    resources = RankResources()      # process groups and buffers: kept across calls, never demo state
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        if message == b"close":
            os._exit(0)
        ledger = Ledger(rank, on_enter=publish)
        publish("")
        try:
            fn, args, kwargs = cloudpickle.loads(message)
            result = fn(Context(rank, world_size, ledger, resources=resources), *args, **kwargs)
            reply = cloudpickle.dumps(("ok", result))
        except BaseException:
            reply = cloudpickle.dumps(("error", traceback.format_exc(), ledger.last_status()))
        conn.send_bytes(reply)


# --- parent side ------------------------------------------------------------------

def _mp_context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


@contextlib.contextmanager
def _without_main_reimport():
    """Start processes without re-running the parent's __main__ in them.

    multiprocessing normally re-imports the parent's main script in every
    child, so that functions defined there can be found. Ranks never need it
    (functions travel by value), and re-running it breaks when the main
    program is stdin or a script without an `if __name__ == "__main__"` guard.
    """
    original = mp_spawn.get_preparation_data

    def preparation_data(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = original


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(code).name
    return f"signal {code}"


class Pool:
    """N warm gloo ranks serving calls over pipes. Use via `run`, or directly.

    Not thread-safe: one call at a time, from the process that created it.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._status: list[Any] = []
        self._tmpdir: str | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self, timeout: float = START_TIMEOUT_S) -> Pool:
        ctx = _mp_context()
        self._tmpdir = tempfile.mkdtemp(prefix="wmdist-")
        store = os.path.join(self._tmpdir, "rendezvous")
        try:
            with _without_main_reimport():
                self._spawn_ranks(ctx, store)
            self._collect(time.monotonic() + timeout, starting=True)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn_ranks(self, ctx: mp.context.BaseContext, store: str) -> None:
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            status = ctx.RawArray(ctypes.c_char, _STATUS_BYTES)
            proc = ctx.Process(target=_worker_main, name=f"wmdist-rank{rank}", daemon=True,
                               args=(rank, self.world_size, store, child_end, status))
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._status.append(status)

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> list[Any]:
        """Run fn(ctx, *args, **kwargs) on every rank; results in rank order."""
        payload = cloudpickle.dumps((fn, args, kwargs or {}))
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
            return self._collect(time.monotonic() + timeout)
        except BaseException:
            self.close(grace=0.2)   # ranks may be stuck in a collective: do not wait long
            raise

    def _last_comm(self, rank: int) -> str:
        return self._status[rank].value.decode(errors="replace")

    def _timeout_failure(self, pending: list[int], starting: bool) -> RankFailure:
        """Name the likeliest culprit: a pending rank that is not waiting inside a communication.

        Ranks blocked in a collective are usually waiting for the one that is
        still computing (or stuck in user code), so that one is named first.
        """
        def waiting(r: int) -> bool:
            last = self._last_comm(r)
            return bool(last) and not last.endswith(COMPLETED)
        culprit = next((r for r in pending if not waiting(r)), pending[0])
        lines = [f"  rank {r}: " + (f"waiting in {self._last_comm(r)}" if waiting(r) else
                                    f"not in a communication (last: {self._last_comm(r) or 'none'})")
                 for r in pending]
        what = "did not finish starting" if starting else "did not finish"
        return RankFailure(culprit, "start" if starting else "timeout",
                           f"{what} within the timeout; pending ranks:\n" + "\n".join(lines),
                           self._last_comm(culprit), tuple(pending))

    def _collect(self, deadline: float, starting: bool = False) -> list[Any]:
        """Wait for one reply per rank; turn the first failure into RankFailure."""
        results: list[Any] = [None] * self.world_size
        pending = set(range(self.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_failure(sorted(pending), starting)
            waitables = {self._conns[r]: r for r in pending}
            waitables.update({self._procs[r].sentinel: r for r in pending})
            ready = wait(list(waitables), timeout=remaining)
            # Replies first: a rank may send its result and exit in the same instant.
            for rank in sorted({waitables[w] for w in ready}):
                conn = self._conns[rank]
                if conn.poll():
                    try:
                        reply = cloudpickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        reply = None
                    if reply is not None:
                        if reply[0] == "error":
                            raise RankFailure(rank, "start" if starting else "raised",
                                              f"raised an exception:\n{reply[1]}", reply[2])
                        results[rank] = reply[1]
                        pending.discard(rank)
                        continue
                proc = self._procs[rank]
                proc.join(timeout=1.0)
                code = proc.exitcode
                if code is not None and code < 0:
                    raise RankFailure(rank, "signal", f"was killed by {_signal_name(-code)}", self._last_comm(rank))
                raise RankFailure(rank, "exited", f"exited with code {code} before replying", self._last_comm(rank))
        return results

    def close(self, grace: float = 2.0) -> list[int | None]:
        """Stop every rank (politely, then by force), remove the rendezvous files.

        Returns the ranks' exit codes: 0 for a clean exit, -signal if it had to be killed.
        """
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send_bytes(b"close")
        deadline = time.monotonic() + grace
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        codes = [proc.exitcode for proc in self._procs]
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.close()
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.close()
        self._procs, self._conns, self._status = [], [], []
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        return codes
