"""Chapter 06's exercise: merge two partial attention results by their log-sum-exp, as every ring step does.

A rank exercise (run on real ranks, each with its own inputs) because the
checker then compares tensors with a tolerance. The inputs include the two
rows a causal ring produces that a first attempt tends to get wrong: a block
whose keys are all masked for a row (lse = -inf), and a row whose keys are
masked in both partials, whose merged output must be 0, not NaN.
"""
from __future__ import annotations

import math

import torch

from wmdist.comm import Context
from wmdist.costs.rounding import FLOAT64_ROUNDOFF
from wmdist.exercises import Exercise

LSE_MAX = 4.0     # |lse| of the finite inputs is at most this; |out| at most 1


def merge_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_a, lse_a, out_b, lse_b) for this rank: (1, 2, 6, 4) outputs in [-1, 1], (1, 2, 6) lse in [-4, 4].

    Row 0 of block b and row 1 of both blocks are empty (lse -inf, output 0).
    """
    gen = torch.Generator().manual_seed(600 + rank)
    out_a, out_b = (2 * torch.rand(1, 2, 6, 4, generator=gen, dtype=torch.float64) - 1 for _ in range(2))
    lse_a, lse_b = (LSE_MAX * (2 * torch.rand(1, 2, 6, generator=gen, dtype=torch.float64) - 1) for _ in range(2))
    for out, lse, rows in ((out_b, lse_b, [0, 1]), (out_a, lse_a, [1])):
        out[:, :, rows] = 0.0
        lse[:, :, rows] = -math.inf
    return out_a, lse_a, out_b, lse_b


def merge_partials(ctx: Context, out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> torch.Tensor:
    """The attention of the queries over the keys of both blocks, from the two partial results."""
    lse = torch.logaddexp(lse_a, lse_b)                              # log of the combined normaliser, (B, H, S)
    shift = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # a row with no keys at all: avoid -inf - -inf
    weight_a = torch.exp(lse_a - shift)[..., None]                   # share of block a in the row's softmax
    weight_b = torch.exp(lse_b - shift)[..., None]
    return weight_a * out_a + weight_b * out_b                       # (B, H, S, D)


ONLINE_SOFTMAX_MERGE = Exercise(
    name="online-softmax merge",
    task="Each partial result is softmax attention over one block of keys: out_x (B, H, S, D) normalised over "
         "that block, and lse_x (B, H, S), the log-sum-exp of the row's scores in that block. Return the attention "
         "over both blocks together.",
    reference=merge_partials,
    make_inputs=merge_inputs,
    world_sizes=(2,),
    tolerance=2 * (3 * LSE_MAX + 8) * FLOAT64_ROUNDOFF,
    reason="float64: a correct merge (logaddexp, softmax or sigmoid weights) errs by at most (3 max|lse| + 8) u "
           "relative to |out| <= 1; two correct merges differ by at most twice that",
    hint="weight each partial output by exp(its lse - the combined lse), with the combined lse = "
         "logaddexp(lse_a, lse_b); the weights add to 1. Rows whose keys are all masked have lse = -inf in both "
         "blocks: their output must stay 0, so do not subtract -inf from -inf.",
)
EXERCISES = [ONLINE_SOFTMAX_MERGE]
