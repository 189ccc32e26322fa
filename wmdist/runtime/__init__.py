"""Processes: the entry point `run` (launch.py), which uses warm pools of local gloo ranks
locally (warm.py, pool.py for the parent side, rank.py for the rank side, isolation.py and
messages.py for what a rank checks between calls, slots.py, wire.py, matching.py and stuck.py
for how every rank's posts are counted and matched, at the end of a call and while it runs,
cleanup.py for what must not be left behind, resources.py for the groups and buffers a rank
process keeps across calls) and the already-launched processes under torchrun."""
from wmdist.runtime.launch import (DEFAULT_TIMEOUT_S, MAX_LOCAL_WORLD, MAX_TIMEOUT_S, MAX_WARM_RANKS, RankFailure,
                                   as_world_size, run, shutdown, under_torchrun, warm_pids)
from wmdist.runtime.failures import PoolRestartWarning
from wmdist.runtime.pool import Pool
from wmdist.runtime.resources import RankResources

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_LOCAL_WORLD", "MAX_TIMEOUT_S", "MAX_WARM_RANKS", "Pool", "PoolRestartWarning",
           "RankFailure", "RankResources", "as_world_size", "run", "shutdown", "under_torchrun", "warm_pids"]
