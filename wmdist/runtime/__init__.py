"""Processes: the entry point `run` (launch.py) runs one function on N ranks, on warm pools of
local gloo ranks, or on the processes torchrun already launched. One module per concern:

    launch.py      `run`, `shutdown`: argument checks, then local pools or torchrun's processes
    warm.py        the warm pools by world size, reused across calls, within a rank budget
    pool_budget.py that budget across processes: a process starting ranks asks the others to close idle pools
    pool.py        the parent side of one pool: calls to N ranks over pipes, results back
    start.py       how rank processes start: a forkserver with torch preloaded, Ctrl-C held while it imports
    frozen.py      run last in the forkserver, so what it preloaded is cheap to share with the ranks
    rank.py        the rank side of the pool: join the gloo group, serve calls until told to close
    resources.py   what a rank keeps across calls: its process groups and receive buffers
    groups.py      process groups a rank function makes with torch's own API, reused or found
    isolation.py   process-wide settings a rank function changed, put back after every call
    messages.py    every collective and point-to-point message a call posts, counted and matched at its end
    slots.py       per-communicator counts: torch's sequence numbers, so what C++ posts (DDP's reducer) counts
    matching.py    the end-of-call rule: same count per group, the same op where both sides saw it
    stuck.py       the shared board: a post no other rank can still match, found while the call runs
    notary.py      a thread that writes "blocked" on that board only for a wait that lasts
    routes.py      which collective each torch route posts, by the name a learner knows it by
    children.py    a rank's own child processes: allowed, and ended with the call that started them
    failures.py    a failed call as one RankFailure naming the rank, what happened and where
    cleanup.py     nothing left behind: temporary directories, helpers, exit signals, kernel restarts
"""
from wmdist.runtime.launch import (DEFAULT_TIMEOUT_S, MAX_LOCAL_WORLD, MAX_TIMEOUT_S, MAX_WARM_RANKS, RankFailure,
                                   as_world_size, run, shutdown, under_torchrun, warm_pids)
from wmdist.runtime.failures import PoolRestartWarning
from wmdist.runtime.pool import Pool
from wmdist.runtime.resources import RankResources

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_LOCAL_WORLD", "MAX_TIMEOUT_S", "MAX_WARM_RANKS", "Pool", "PoolRestartWarning",
           "RankFailure", "RankResources", "as_world_size", "run", "shutdown", "under_torchrun", "warm_pids"]
