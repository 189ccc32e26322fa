"""Chapter 04's exercise: the row-parallel forward, checked on real ranks.

Each rank holds a slice of the input features and the matching columns of
the weight. Its matmul gives a share of *every* output; the shares must be
summed over the ranks, and the bias added once.
"""
from __future__ import annotations

import torch

from wmdist.comm import Context, ring_all_reduce
from wmdist.costs import reordered_sum_bound
from wmdist.costs.tensor_parallel import shard_sizes
from wmdist.course.exercises import Exercise

FEATURES, OUTPUTS, TOKENS = 10, 5, 3     # 10 features: uneven slices on 3 and 4 ranks


def row_parallel_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank r: x_r (T, F_r), its slice of the input features; W_r (H, F_r), the matching weight columns; b (H,)."""
    g = torch.Generator().manual_seed(44)
    x = 2 * torch.rand(TOKENS, FEATURES, generator=g) - 1             # (T, F), entries in [-1, 1]
    w = 2 * torch.rand(OUTPUTS, FEATURES, generator=g) - 1            # (H, F)
    b = 0.5 + 0.5 * torch.rand(OUTPUTS, generator=g)                  # (H,), entries in [0.5, 1]
    sizes = shard_sizes(FEATURES, world_size)
    start = sum(sizes[:rank])
    return x[:, start:start + sizes[rank]].clone(), w[:, start:start + sizes[rank]].clone(), b


def row_parallel_solution(ctx: Context, x_shard: torch.Tensor, w_shard: torch.Tensor,
                          bias: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b from feature shards: local matmul, sum over ranks, then the bias once."""
    partial = x_shard @ w_shard.T                                       # (T, H): a share of every output
    total = ring_all_reduce(ctx, partial, phase="row-parallel sum")     # sum over ranks (all-reduce)
    return total + bias


ROW_PARALLEL = Exercise(
    name="row-parallel forward",
    task="Each rank holds x_shard (T, F_r), its slice of the input features, and w_shard (H, F_r), the "
         "matching columns of the weight; every rank holds the bias (H,). Return y = x W^T + b (T, H), "
         "the same on every rank.",
    reference=row_parallel_solution,
    make_inputs=row_parallel_inputs,
    world_sizes=(4, 3),
    tolerance=reordered_sum_bound(FEATURES, FEATURES + 1, extra_roundings=1),
    reason="the 10 products of each output summed in another order (partial sums below 10 + 1), and the bias "
           "added once",
    hint="x_shard @ w_shard.T is only this rank's share of every output: sum the shares over the ranks "
         "(an all-reduce), then add the bias once, not once per rank.",
)
EXERCISES = [ROW_PARALLEL]
