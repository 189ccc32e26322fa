"""Chapter 06's exercise: one ring step by hand. Swap partial attentions with the other rank, then merge them.

Each of two ranks holds the attention of the same query rows over its own block of keys: an
output normalised over that block and the rows' log-sum-exp there. Neither can finish alone:
it must get the other rank's partial (one exchange, as each ring step moves a K, V block) and
merge the two by their log-sum-exp, as every ring step does. The inputs include the two rows a
causal ring produces that a first attempt tends to get wrong: a block whose keys are all
masked for a row (lse = -inf), and a row whose keys are masked in both blocks, whose merged
output must be 0, not NaN. A merge that ignores the other rank's partial, or averages the two
outputs, is wrong on every rank.
"""
from __future__ import annotations

import math

import torch

from wmdist.comm import Context, exchange
from wmdist.costs.rounding import FLOAT64_ROUNDOFF
from wmdist.course.exercises import Exercise

LSE_MAX = 4.0     # |lse| of the finite inputs is at most this; |out| at most 1


def merge_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of this rank's block: a (1, 2, 6, 4) output in [-1, 1] and the (1, 2, 6) lse in [-4, 4].

    Both ranks' partials are drawn from one seed (the same query rows), and rank r keeps block r.
    Row 0 of block 1 and row 1 of both blocks are empty (lse -inf, output 0).
    """
    gen = torch.Generator().manual_seed(600)
    outs = [2 * torch.rand(1, 2, 6, 4, generator=gen, dtype=torch.float64) - 1 for _ in range(2)]
    lses = [LSE_MAX * (2 * torch.rand(1, 2, 6, generator=gen, dtype=torch.float64) - 1) for _ in range(2)]
    for block, rows in ((1, [0, 1]), (0, [1])):
        outs[block][:, :, rows] = 0.0
        lses[block][:, :, rows] = -math.inf
    return outs[rank], lses[rank]


def merge_with_neighbour(ctx: Context, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The attention of the queries over both ranks' keys: swap partials with the other rank, then merge."""
    other = 1 - ctx.rank
    out_other = exchange(ctx, out, other, torch.empty_like(out), other, phase="partial out")
    lse_other = exchange(ctx, lse, other, torch.empty_like(lse), other, phase="partial lse")
    both = torch.logaddexp(lse, lse_other)                            # log of the combined normaliser, (B, H, S)
    shift = torch.where(torch.isinf(both), torch.zeros_like(both), both)  # no keys at all: avoid -inf - -inf
    mine = torch.exp(lse - shift)[..., None]                          # share of this block in the row's softmax
    theirs = torch.exp(lse_other - shift)[..., None]
    return mine * out + theirs * out_other                           # (B, H, S, D)


ONLINE_SOFTMAX_MERGE = Exercise(
    name="online-softmax merge",
    task="Each of the two ranks holds softmax attention of the same query rows over its own block of keys: out "
         "(B, H, S, D) normalised over that block, and lse (B, H, S), the log-sum-exp of the row's scores in it. "
         "Get the other rank's partial (wmdist.comm.exchange, or send and recv) and return the attention over both "
         "blocks together, on both ranks.",
    reference=merge_with_neighbour,
    make_inputs=merge_inputs,
    world_sizes=(2,),
    tolerance=2 * (3 * LSE_MAX + 8) * FLOAT64_ROUNDOFF,
    reason="float64: a correct merge (logaddexp, softmax or sigmoid weights) errs by at most (3 max|lse| + 8) u "
           "relative to |out| <= 1; two correct merges differ by at most twice that",
    hint="first swap out and lse with rank 1 - ctx.rank (exchange(ctx, out, other, torch.empty_like(out), other)); "
         "then weight each partial output by exp(its lse - the combined lse), with the combined lse = "
         "logaddexp(lse, lse_other); the weights add to 1. Rows whose keys are all masked have lse = -inf in both "
         "blocks: their output must stay 0, so do not subtract -inf from -inf.",
)
EXERCISES = [ONLINE_SOFTMAX_MERGE]
