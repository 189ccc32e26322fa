"""Warm pools by world size: reused across calls, kept within a rank budget, safe to call from threads.

This is a cache of OS resources owned by this interpreter (like a connection
pool), not state shared between demos: every call gets a fresh Context and
Ledger, and the ranks put back what a call changed. Calls for one world size
take turns (widget callbacks can call from several threads at once), so two
threads never start two pools of the same size; other sizes proceed.

The cache also gives memory back (pool_budget.py): in a neighbourhood (the
course's kernels of one Jupyter server), starting a pool first asks the other
kernels to close the pools they are not using, and a pool idle for
`WMDIST_POOL_IDLE_S` closes by itself (outside a neighbourhood pools stay warm
until the process ends, as before). Once a process has no pool left, its
forkserver goes too. A pool that has to start again for either reason says so
once, when it starts, as an ordinary note on stdout: it is news, not an error
(on stderr JupyterLab showed it in a red box).
"""
from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from wmdist.costs.units import seconds
from wmdist.runtime import cleanup
from wmdist.runtime.pool_budget import Neighbours
from wmdist.runtime.pool import Pool


class WarmPools:
    """Pools by world size, least recently used dropped once more than `max_ranks` ranks are warm.

    A pool larger than `max_ranks` on its own serves its call and is closed.
    A pool in use by another thread is never dropped, so the budget can be
    exceeded while calls run in parallel.
    """

    def __init__(self, max_ranks: int, *, idle_seconds: float | None = None):
        self.max_ranks = max_ranks
        self._pools: OrderedDict[int, Pool] = OrderedDict()
        self._lock = threading.RLock()                    # guards the dicts; held only briefly
        self._turns: dict[int, threading.Lock] = {}      # per world size: held for a whole call
        self._last_used: dict[int, float] = {}           # per world size: when its last call ended (monotonic)
        self._closed_why: dict[int, str] = {}            # per world size: why its pool was closed for memory
        self.neighbours = Neighbours(self.close_idle, idle_seconds=idle_seconds)

    def run(self, world_size: int, fn: Callable[..., Any], args: tuple, kwargs: dict, timeout: float) -> list[Any]:
        """Run fn on the warm pool of `world_size` ranks (started if needed)."""
        self.neighbours.idle_seconds()              # a bad WMDIST_POOL_IDLE_S fails here, before any process starts
        with self._turn(world_size):
            pool = self._warm(world_size, timeout)
            try:
                results = pool.run(fn, args=args, kwargs=kwargs, timeout=timeout)
            except BaseException:
                self._forget(world_size, pool)       # already closed by Pool.run's failure path
                raise
            if pool.closed or world_size > self.max_ranks:   # closed itself (state it could not put back),
                self._forget(world_size, pool)                  # or too large to keep warm on its own
                pool.close()
            self._last_used[world_size] = time.monotonic()
            return results

    def close_idle(self, *, older_than: float | None = None) -> int:
        """Close the pools no call is using (idle for `older_than` seconds, if given); return the ranks closed.

        Once no pool is left, multiprocessing's forkserver (a full torch import of
        its own) is stopped too; the next pool starts a new one.
        """
        now = time.monotonic()
        closed: list[Pool] = []
        with self._lock:
            for size in list(self._pools):
                if older_than is not None and now - self._last_used.get(size, now) < older_than:
                    continue
                if self._turns[size].acquire(blocking=False):        # idle: no call on it right now
                    try:
                        closed.append(self._pools.pop(size))
                        self._closed_why[size] = (f"closed after {seconds(older_than)} idle" if older_than
                                                  else "closed while idle, for another notebook's ranks")
                    finally:
                        self._turns[size].release()
            for pool in closed:
                pool.close()
            if not self._pools and (closed or older_than is None):   # asked, or the last pool went: the
                cleanup.stop_helpers()                                 # forkserver alone holds ~200 MB
                self.neighbours.close()
        return sum(p.world_size for p in closed)

    def _forget(self, world_size: int, pool: Pool) -> None:
        with self._lock:
            if self._pools.get(world_size) is pool:
                del self._pools[world_size]

    def pids(self) -> dict[int, list[int]]:
        """Process ids of the warm pools, by world size."""
        with self._lock:
            return {n: p.pids for n, p in self._pools.items()}

    def shutdown(self, *, grace: float = 2.0) -> None:
        """Close every pool (a call running in another thread then fails with RankFailure)."""
        with self._lock:                  # one step, as in _warm: no pool counted after this without a listener
            pools = list(self._pools.values())
            self._pools.clear()
            self.neighbours.close()
        for pool in pools:
            pool.close(grace=grace)

    def _turn(self, world_size: int) -> threading.Lock:
        with self._lock:
            return self._turns.setdefault(world_size, threading.Lock())

    def _warm(self, world_size: int, timeout: float) -> Pool:
        """The live pool of this size, or a new one after making room (caller holds this size's turn)."""
        with self._lock:
            pool = self._pools.get(world_size)
            if pool is not None and pool.alive:
                self._pools.move_to_end(world_size)
                return pool
            dropped = [self._pools.pop(world_size)] if pool is not None else []
            for size in list(self._pools):                       # least recently used first
                if sum(self._pools) + world_size <= self.max_ranks:
                    break
                if self._turns[size].acquire(blocking=False):     # idle: no call on it right now
                    try:
                        dropped.append(self._pools.pop(size))
                    finally:
                        self._turns[size].release()
        for old in dropped:
            old.close()
        cleanup.clean_up_on_exit_signals(self._on_exit_signal)
        cleanup.clean_up_on_kernel_shutdown(self._on_kernel_shutdown)
        self.neighbours.ask_others(within=timeout / 2)   # in a neighbourhood: the others give back idle ranks
        why = self._closed_why.pop(world_size, None)
        if why:
            print(f"wmdist: starting the {world_size}-rank pool again (it was {why}); this takes a few seconds",
                  file=sys.stdout, flush=True)
        pool = Pool(world_size)
        with self._lock:
            # Listening and holding the pool are one step under the lock close_idle decides under: a neighbour's
            # request being answered now (its close seconds long) cannot stop the listener once this pool counts.
            self.neighbours.listen()
            self._pools[world_size] = pool    # before it starts, so shutdown() on a signal reaches its ranks
        try:
            return pool.start(timeout=timeout)    # a cold call is bounded too: start, then the call itself
        except BaseException:
            self._forget(world_size, pool)
            raise

    def _on_exit_signal(self) -> None:
        self.shutdown(grace=0.2)      # the process is ending: busy ranks are not waited for
        cleanup.remove_multiprocessing_dir()

    def _on_kernel_shutdown(self) -> None:
        self.shutdown()
        cleanup.stop_helpers()

