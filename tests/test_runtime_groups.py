"""Subgroups on warm ranks: any pattern of ctx.group_of over any sequence of calls works, whatever
groups each rank made before (issue 19, High 1)."""
from __future__ import annotations

import os
import random

import torch

from wmdist import demos
from wmdist.comm import all_reduce
from wmdist.runtime import run

STRESS = os.environ.get("WMDIST_STRESS") == "1"


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
    rng = random.Random(19)
    calls = 60 if STRESS else 12          # WMDIST_STRESS=1: the long version
    for _ in range(calls):
        n = rng.choice([2, 3, 4, 5, 8])
        subsets = []
        for _ in range(rng.randint(1, 4)):
            size = rng.randint(1, n)
            subsets.append(tuple(sorted(rng.sample(range(n), size))))
        assert run(make_groups, n, subsets, timeout=60) == [expected(r, subsets) for r in range(n)], subsets
    run(make_groups, 4, [(0, 1), (2, 3), (1, 3)], timeout=60)     # histories that differ across the 4 ranks
    [report] = demos.verify(["mesh-2d"], 4)
    assert report.passed, report.failures
