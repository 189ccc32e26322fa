"""Processes: a warm pool of local gloo ranks (pool.py) and the entry point `run` (launch.py),
which uses the pool locally and the already-launched processes under torchrun."""
from wmdist.runtime.launch import (DEFAULT_TIMEOUT_S, MAX_LOCAL_WORLD, MAX_WARM_RANKS, RankFailure, run, shutdown,
                                   under_torchrun, warm_pids)
from wmdist.runtime.pool import Pool

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_LOCAL_WORLD", "MAX_WARM_RANKS", "Pool", "RankFailure", "run", "shutdown",
           "under_torchrun", "warm_pids"]
