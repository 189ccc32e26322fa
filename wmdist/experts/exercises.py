"""Chapter 10 exercise: the dispatch permutation and its inverse, checked on real ranks.

Each rank routes its own tokens (the expert ids below are drawn per rank, unevenly: some experts get
none, rank 1's tokens all go to one expert). The reader returns `order`, which lists the assignments
grouped by expert (so by destination rank too) with token order kept inside each group, and
`inverse`, which undoes it. The checker compares both with the reference's on every rank, and also
that x[order][inverse] is x again.
"""
from __future__ import annotations

import torch

from wmdist.comm import Context
from wmdist.course.exercises import Exercise

EXPERTS, ASSIGNMENTS = 4, 10


def dispatch_inputs(rank: int, world_size: int) -> tuple[torch.Tensor]:
    """Rank r's expert ids, one per assignment (A,): skewed, expert 3 never chosen; rank 1 sends all to expert 0."""
    if rank == 1:
        return (torch.zeros(ASSIGNMENTS, dtype=torch.int64),)
    gen = torch.Generator().manual_seed(10 + rank)
    return (torch.randint(0, EXPERTS - 1, (ASSIGNMENTS,), generator=gen),)


def dispatch_solution(ctx: Context, expert_ids: torch.Tensor) -> torch.Tensor:
    """order: the assignments sorted by expert id, stably (token order kept); inverse[order[i]] = i. Stacked (2, A)."""
    order = torch.sort(expert_ids, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return torch.stack([order, inverse])


DISPATCH = Exercise(
    name="dispatch permutation",
    task="Given this rank's expert id for each assignment, return torch.stack([order, inverse]): `order` lists "
         "the assignment indices grouped by expert (expert 0's first), keeping their original order within each "
         "expert; `inverse` undoes it, so that grouped[inverse] puts every row back where it came from.",
    reference=dispatch_solution,
    make_inputs=dispatch_inputs,
    world_sizes=(2, 4),
    hint="a stable sort by expert id gives `order` (torch.sort(..., stable=True).indices; argsort is not stable "
         "by default); the inverse of a permutation p has inverse[p[i]] = i.",
)

EXERCISES = [DISPATCH]
