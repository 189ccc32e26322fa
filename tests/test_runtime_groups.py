"""Subgroups on warm ranks: any pattern of ctx.group_of over any sequence of calls works, whatever
groups each rank made before (issue 19, High 1); a raw dist.new_group reuses them, and groups made or destroyed past the cache
restart the pool with a warning that says so (Medium 5)."""
from __future__ import annotations

import os
import random
from datetime import timedelta

import psutil
import pytest
import torch
import torch.distributed as dist

from wmdist import runtime
from wmdist.registry import demos
from wmdist.comm import all_reduce
from wmdist.runtime import PoolRestartWarning, run

STRESS = os.environ.get("WMDIST_STRESS") == "1"        # 60 calls instead of 12
SEED = int(os.environ.get("WMDIST_SEED", "19"))         # another sequence of subsets


def make_groups(ctx, subsets):
    """Every member of each subset asks for its group (in the one global order) and sums its rank over it."""
    sums = []
    for subset in subsets:
        if ctx.rank in subset:
            x = torch.tensor([float(ctx.rank)])
            all_reduce(ctx, x, group=ctx.group_of(subset))
            sums.append(float(x))
    return sums


def expected(rank, subsets):
    return [float(sum(s)) for s in subsets if rank in s]


def test_members_with_different_histories_make_the_same_group():
    # The three calls on 3 ranks: rank 2 has made no group when (0, 2) is asked for, rank 0 one.
    for subsets in ([(0, 1)], [(0, 2)], [(1, 2)], [(0, 1, 2)]):
        assert run(make_groups, 3, subsets, timeout=60) == [expected(r, subsets) for r in range(3)]


def test_neighbour_pairs_in_one_call_on_a_fresh_pool():
    subsets = [(0, 1), (1, 2), (2, 3)]
    assert run(make_groups, 4, subsets, timeout=60) == [expected(r, subsets) for r in range(4)]


def test_random_subsets_over_many_warm_calls_then_a_mesh_demo():
    rng = random.Random(SEED)
    calls = 60 if STRESS else 12          # WMDIST_STRESS=1: the long version
    for _ in range(calls):
        n = rng.choice([2, 3, 4, 5, 8])
        subsets = []
        for _ in range(rng.randint(1, 4)):
            size = rng.randint(1, n)
            subsets.append(tuple(sorted(rng.sample(range(n), size))))
        assert run(make_groups, n, subsets, timeout=60) == [expected(r, subsets) for r in range(n)], subsets
    run(make_groups, 4, [(0, 1), (2, 3), (1, 3)], timeout=60)     # histories that differ across the 4 ranks
    [report] = demos.verify(["mesh-2d"], world_size=4)
    assert report.passed, report.failures


# --- raw dist.new_group (issue 19, Medium 5) -------------------------------------------------------

def raw_new_group(ctx):
    """As torch's tutorials write it: every rank calls dist.new_group, only the members use the group."""
    group = dist.new_group([0, 1])
    x = torch.tensor([float(ctx.rank)])
    if ctx.rank in (0, 1):
        dist.all_reduce(x, group=group)
    return float(x)


def _fds_and_threads(pids):
    return [(psutil.Process(p).num_fds(), psutil.Process(p).num_threads()) for p in pids]


def test_a_raw_new_group_in_every_call_reuses_one_group_and_leaks_nothing():
    assert run(raw_new_group, 3) == [1.0, 1.0, 2.0]
    pids = runtime.warm_pids()[3]
    before = _fds_and_threads(pids)
    for _ in range(20):
        assert run(raw_new_group, 3) == [1.0, 1.0, 2.0]
    assert runtime.warm_pids()[3] == pids and _fds_and_threads(pids) == before


def new_group_with_options(ctx):
    dist.new_group([0, 1], timeout=timedelta(seconds=60))     # options: torch makes a new gloo group
    return ctx.rank


def destroy_a_cached_group(ctx):
    dist.destroy_process_group(ctx.group_of([0, 1]))
    return ctx.rank


@pytest.mark.parametrize("fn, says", [
    (new_group_with_options, "it made 1 group\\(s\\) outside the rank's cache.*2-rank pool was restarted"),
    (destroy_a_cached_group, "it destroyed the cached group\\(s\\) \\[\\[0, 1\\]\\].*2-rank pool was restarted"),
])
def test_groups_made_or_destroyed_outside_the_cache_restart_the_pool_and_say_why(fn, says):
    run(lambda ctx: ctx.rank, 2)
    pids = runtime.warm_pids()[2]
    with pytest.warns(PoolRestartWarning, match=says):
        assert run(fn, 2) == [0, 1]
    assert 2 not in runtime.warm_pids() and run(make_groups, 2, [(0, 1)]) == [[1.0], [1.0]]
    assert set(runtime.warm_pids()[2]).isdisjoint(pids)
