"""A pool of N warm gloo ranks on this machine, serving function calls over pipes (the parent side).

The ranks (rank.py) are forked from a forkserver that has torch preloaded
(spawn where forkserver does not exist), join one gloo group through a
FileStore in a fresh temporary directory (no port is ever chosen), and then
serve calls: receive a cloudpickled (fn, args, kwargs), call fn with a fresh
Context, put back what the call changed, check its messages, reply. The
parent waits on every rank's pipe and process sentinel with a deadline, so a
rank that raises, exits, is killed, hangs or leaves a message unmatched ends
the call with one RankFailure; the pool is then killed, in a way a second
Ctrl-C cannot interrupt. `wmdist.runtime.launch` keeps pools warm and is the
public entry point.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import shutil
import threading
import time
import warnings
from multiprocessing.connection import wait
from typing import Any, Callable

import cloudpickle

from wmdist.runtime import cleanup
from wmdist.runtime.children import descendants, kill
from wmdist.runtime.failures import (PoolRestartWarning, RankFailure, ended, exit_failure, lost_a_peer, start_failure,
                                     timeout_failure)
from wmdist.runtime.messages import (DRAIN_AT_LEAST_S, DRAIN_TIMEOUT_S, mismatched_sizes, unmatched,
                                     unmatched_collectives)
from wmdist.runtime.rank import STATUS_BYTES, worker_main
from wmdist.runtime.stuck import PostBoard, stuck
from wmdist.runtime.start import ending, forkserver_pid, forkserver_ready, mp_context, never_reimport_main_in_ranks

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S", "Pool", "PoolRestartWarning", "RankFailure"]

DEFAULT_TIMEOUT_S = 300.0      # generous: Binder CPUs are slow and shared
MAX_TIMEOUT_S = 7200.0         # two hours; the ranks' own gloo timeout sits just above it
START_TIMEOUT_S = 120.0
ROOT_CAUSE_GRACE_S = 0.5       # how long a rank's error waits for a peer's death, the likelier cause, to show
STUCK_POLL_S = 0.2             # how often a call with finished ranks checks the others' posts (stuck.py)
PEER_LOST_GRACE_S = 3.0        # the same wait when the error is gloo saying a peer went away (a busy machine)

class Pool:
    """N warm gloo ranks serving calls over pipes. Use via `run`, or directly.

    One call at a time (calls from several threads wait their turn), from the
    process that created it.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._status: list[Any] = []
        self._boards: list[PostBoard] = []    # what each rank last posted in the current call (stuck.py)
        self._calls = 0                       # calls sent to this pool's ranks (each rank counts them too)
        self._tmpdir: str | None = None
        self._server: int | None = None       # the forkserver that started the ranks (None under spawn)
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def closed(self) -> bool:
        return not self._procs

    @property
    def alive(self) -> bool:
        """Every rank running (one poll of their sentinels) and the forkserver they die with not killed (start.py)."""
        return bool(self._procs) and not wait([p.sentinel for p in self._procs], timeout=0) and not ending(self._server)

    def start(self, *, timeout: float = START_TIMEOUT_S) -> Pool:
        """Start the ranks and wait for every one to join the group, all within `timeout` seconds.

        A start that takes longer fails with RankFailure(reason="start") that says so; Ctrl-C ends
        it at once (the wait for the forkserver's imports happens before Ctrl-C is held back).
        """
        deadline = time.monotonic() + timeout
        cleanup.remove_stale()
        cleanup.recover_removed_multiprocessing_dir()
        ctx = mp_context()
        self._server = forkserver_pid(ctx)
        self._tmpdir = cleanup.make_run_dir()
        store = os.path.join(self._tmpdir, "rendezvous")
        try:
            never_reimport_main_in_ranks()
            if not forkserver_ready(ctx, within=deadline - time.monotonic()):
                raise start_failure(self.world_size, timeout)
            with cleanup.interrupts_deferred():   # every started rank gets tracked
                self._spawn_ranks(ctx, store)
            cleanup.mark_multiprocessing_dir()
            self._collect(deadline, range(self.world_size), start_timeout=timeout)
        except BaseException:
            self.close(grace=0.2)              # ranks still starting read no "close": do not wait for them
            raise
        return self

    def _spawn_ranks(self, ctx: mp.context.BaseContext, store: str) -> None:
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            status = ctx.RawArray(ctypes.c_char, STATUS_BYTES)
            board = PostBoard.new(ctx)
            proc = ctx.Process(target=worker_main, name=f"wmdist-rank{rank}", daemon=True,
                               args=(rank, self.world_size, store, child_end, status, board.array,
                                     MAX_TIMEOUT_S + 60, os.getpid()))
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._status.append(status)
            self._boards.append(board)

    def run(self, fn: Callable[..., Any], *, args: tuple = (), kwargs: dict | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> list[Any]:
        """Run fn(ctx, *args, **kwargs) on every rank; results in rank order.

        If the call changed rank state that cannot be put back in place, the
        results are returned and the pool closes itself with a PoolRestartWarning.
        """
        payload = cloudpickle.dumps((fn, args, kwargs or {}))
        ranks = range(self.world_size)
        with self._lock:
            try:
                self._calls += 1
                for conn in self._conns:
                    conn.send_bytes(payload)
                replies = self._collect(time.monotonic() + timeout, ranks, call=self._calls)   # [lost, counts, result]
                self._check_messages([replies[r][1] for r in ranks], time.monotonic() + timeout)
            except BaseException:
                self.close(grace=0.2)   # ranks may be stuck in a collective: do not wait long
                raise
            lost = [f"{what} on rank {r}" for r in ranks for what in replies[r][0]]
            if lost:
                self.close()
                warnings.warn(f"wmdist: the call changed {lost[0]}, which cannot be undone in place, "
                              f"so the {self.world_size}-rank pool was restarted", PoolRestartWarning, stacklevel=3)
            return [replies[r][2] for r in ranks]

    def _check_messages(self, counts: list[tuple], deadline: float) -> None:
        """Fail the call if a send or receive was left unmatched; else let unwaited transfers finish.

        counts[r] = (sends rank r posted to each rank, receives it posted from
        each rank, receives from any rank, ops it never waited for, collectives
        it posted on each group, sizes of what it sent and of its receive buffers).
        """
        problem = unmatched([c[0] for c in counts], [c[1] for c in counts], [c[2] for c in counts])
        if problem is not None:
            raise RankFailure(problem[0], "unmatched", f"{problem[1]}; the call fails so that the message "
                                                       "cannot reach a later call", None)
        wrong = mismatched_sizes([c[5] for c in counts], [c[2] for c in counts])
        if wrong is not None:
            raise RankFailure(wrong[0], "unmatched", wrong[1], None)
        stray = unmatched_collectives([c[4] for c in counts])
        if stray is not None:
            raise RankFailure(stray[0], "unmatched", f"{stray[2]}; the call fails so that the collective cannot "
                                                     "pair with one of a later call", None, stray[1])
        unfinished = [r for r, c in enumerate(counts) if c[3]]
        if not unfinished:
            return
        # Within the call's own timeout (capped, and a moment at least): the rank answers when it runs out.
        within = min(max(deadline - time.monotonic(), DRAIN_AT_LEAST_S), DRAIN_TIMEOUT_S)
        for r in unfinished:
            self._conns[r].send_bytes(f"drain {within:.3f}".encode())
        self._collect(time.monotonic() + within + 5.0, unfinished)

    def _collect(self, deadline: float, ranks: range | list[int], start_timeout: float | None = None,
                 call: int | None = None) -> dict[int, list]:
        """Wait for one reply from each of `ranks`: {rank: reply body}; any failure raises RankFailure.

        `start_timeout`: the start's timeout in seconds, when these are the ranks' first replies. `call`: the
        number of the call whose replies these are: a pending rank whose last post a rank that has finished
        can no longer match fails the call at once (stuck.py).
        """
        starting = start_timeout is not None
        replies: dict[int, list] = {}
        pending = set(ranks)
        procs, conns = self._procs, self._conns
        while pending:
            if call is not None:
                failure = stuck(call, {r: self._boards[r].read() for r in pending},
                                {r: body[1] for r, body in replies.items()}, [self._last_comm(r) for r in ranks])
                if failure is not None:
                    raise failure
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_failure(sorted(pending), [self._last_comm(r) for r in range(self.world_size)],
                                      start_timeout=start_timeout)
            waitables = {conns[r]: r for r in pending}
            waitables.update({procs[r].sentinel: r for r in pending})
            try:
                ready = wait(list(waitables), timeout=min(remaining, STUCK_POLL_S) if call else remaining)
            except (OSError, ValueError):
                raise RankFailure(min(pending), "closed", "was shut down while the call ran", None) from None
            # Replies first: a rank may send its result and exit in the same instant.
            for rank in sorted({waitables[w] for w in ready}):
                if conns[rank].poll():
                    try:
                        body = self._receive(rank, starting)
                    except RankFailure as failure:
                        raise self._root_cause(failure, pending - {rank}) from None
                    if body is not None:
                        replies[rank] = body
                        pending.discard(rank)
                        continue
                raise exit_failure(rank, procs[rank], self._last_comm(rank), server=self._server)
        return replies

    def _root_cause(self, failure: RankFailure, others: set[int], grace: float | None = None) -> RankFailure:
        """`failure`, unless another rank died without replying: then that one, the likelier cause.

        A killed rank's peers report their broken collectives at once, maybe before its exit status arrives
        (through the forkserver). So an error waits up to ROOT_CAUSE_GRACE_S (PEER_LOST_GRACE_S when gloo says
        a peer went away; `grace` overrides both) for another pending rank to end without a reply. A death
        shows first as the rank's pipe at end of file, so readable pipes are read (the call fails anyway):
        a reply means alive; end of file, or a process the kernel saw end, means dead.
        """
        if failure.reason not in ("raised", "start") or not others:
            return failure
        if grace is None:
            grace = PEER_LOST_GRACE_S if lost_a_peer(failure) else ROOT_CAUSE_GRACE_S
        deadline, heard = time.monotonic() + grace, set()
        while True:
            for r in sorted(others - heard):
                proc, conn = self._procs[r], self._conns[r]
                if conn.poll():
                    try:
                        if self._receive(r, False) is None:          # end of file: gone without a reply
                            return exit_failure(r, proc, self._last_comm(r), server=self._server)
                    except RankFailure:                               # its own error: alive when it sent it
                        pass
                    heard.add(r)
                elif proc.exitcode is not None or ended(proc.pid, within=0.0):
                    return exit_failure(r, proc, self._last_comm(r), server=self._server)
            silent = sorted(others - heard)
            remaining = deadline - time.monotonic()
            if not silent or remaining <= 0:
                return failure
            waitables = [self._procs[r].sentinel for r in silent] + [self._conns[r] for r in silent]
            with contextlib.suppress(OSError, ValueError):
                wait(waitables, timeout=min(remaining, 0.05))

    def _receive(self, rank: int, starting: bool) -> list | None:
        """Read one reply's body (None if the rank is gone); a failure it reports raises RankFailure."""
        try:
            reply = self._conns[rank].recv_bytes()
        except (EOFError, OSError):
            return None
        try:
            kind, *body = cloudpickle.loads(reply)
        except Exception as err:    # the rest of a reply is plain data: it is the result that failed
            raise RankFailure(rank, "unpickle", f"returned a result that cannot be unpickled in this process: "
                                                f"{type(err).__name__}: {err}", None) from None
        if kind == "error":
            raise RankFailure(rank, "start" if starting else "raised", f"raised an exception:\n{body[0]}", body[1])
        if kind == "drained" and body[0] is not None:
            raise RankFailure(rank, "unmatched", body[0], None)
        return body

    def _last_comm(self, rank: int) -> str:
        return self._status[rank].value.decode(errors="replace") if rank < len(self._status) else ""

    def close(self, *, grace: float = 2.0) -> list[int | None]:
        """Stop every rank (politely, then by force) and what the ranks started, remove the rendezvous files.

        The ranks are taken off the pool first and killed in a `finally` that
        holds Ctrl-C back, so a second interrupt cannot leave them running.
        Returns the ranks' exit codes: 0 for a clean exit, -signal if it had to be killed.
        """
        with cleanup.interrupts_deferred():
            procs, conns, tmpdir = self._procs, self._conns, self._tmpdir
            self._procs, self._conns, self._status, self._boards, self._tmpdir = [], [], [], [], None
            started = descendants([p.pid for p in procs if p.pid is not None])   # found while the ranks live
            try:
                for conn in conns:
                    with contextlib.suppress(Exception):
                        conn.send_bytes(b"close")
                deadline = time.monotonic() + grace
                for proc in procs:
                    proc.join(timeout=max(0.0, deadline - time.monotonic()))
            finally:
                alive = [proc for proc in procs if proc.is_alive()]
                for proc in alive:       # all at once: a rank left alive while its peer is reaped sees the
                    proc.kill()          # peer's sockets close and logs torch's C++ error (gloo's connect)
                for proc in alive:
                    proc.join(timeout=5.0)
                kill(started)
                codes = [proc.exitcode for proc in procs]
                for handle in conns + procs:
                    with contextlib.suppress(Exception):
                        handle.close()
                if tmpdir:
                    shutil.rmtree(tmpdir, ignore_errors=True)
        return codes
