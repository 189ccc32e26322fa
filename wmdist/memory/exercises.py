"""Chapter 03 exercises: model-state bytes per rank under ZeRO (pure), and ZeRO's sharded update (ranks)."""
from __future__ import annotations

from typing import Iterator

import torch

from wmdist.comm import Context, ring_reduce_scatter
from wmdist.course.exercises import Exercise
from wmdist.memory.zero import shard_range


# --- bytes of model state per rank under ZeRO (pure) -------------------------------------

def zero_bytes_solution(params: int, stage: int, dp: int, dp_rank: int) -> int:
    """Model-state bytes on one rank for fp16 mixed-precision Adam: 2 (params) + 2 (grads) + 12 (fp32 copies)."""
    base, extra = divmod(params, dp)
    shard = base + (1 if dp_rank < extra else 0)        # tensor_split: the first `extra` ranks get one more
    held = lambda sharded: shard if sharded else params  # noqa: E731 - one line reads best here
    return 2 * held(stage >= 3) + 2 * held(stage >= 2) + 12 * held(stage >= 1)


def zero_bytes_cases() -> Iterator[tuple[int, int, int, int]]:
    """(params, stage, dp, dp_rank) over a grid with uneven shards and a billion-parameter model."""
    for params in (0, 1, 12, 1000, 1003, 10**9 + 7):
        for stage in range(4):
            for dp in (1, 2, 3, 4, 8):
                for dp_rank in range(dp):
                    yield params, stage, dp, dp_rank


ZERO_BYTES = Exercise(
    name="ZeRO bytes",
    task="Return the bytes of model state (parameters, gradients, optimizer state, master weights) that rank "
         "dp_rank holds for fp16 mixed-precision Adam at ZeRO `stage` on `dp` data-parallel ranks.",
    reference=zero_bytes_solution,
    cases=zero_bytes_cases,
    hint="stage 1 shards the 12 bytes/param of fp32 copies, stage 2 also the 2 of gradients, stage 3 also the "
         "2 of parameters; shards follow torch.tensor_split, so the first P % dp ranks hold one more element.",
)


# --- the sharded Adam update (on ranks) -------------------------------------------------

def shard_update_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r holds the same parameters (101,) and its own local gradient (101,): 101 is prime, chunks differ."""
    params = torch.randn(101, generator=torch.Generator().manual_seed(0))
    return params, torch.randn(101, generator=torch.Generator().manual_seed(1 + rank))


def shard_update_solution(ctx: Context, params: torch.Tensor, local_grad: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter the gradient, take Adam's first step on this rank's chunk, return the chunk."""
    grad = ring_reduce_scatter(ctx, local_grad, phase="my reduce-scatter")    # my chunk of the summed gradient
    start, stop = shard_range(params.numel(), ctx.world_size, ctx.rank)
    m, v = (1 - 0.9) * grad, (1 - 0.999) * grad * grad                  # moments after one step from zero
    m_hat, v_hat = m / (1 - 0.9), v / (1 - 0.999)                       # bias correction
    return params[start:stop] - 1e-2 * m_hat / (v_hat.sqrt() + 1e-8)


SHARD_UPDATE = Exercise(
    name="ZeRO shard update",
    task="Each rank holds the full parameters and its local gradient. Sum the gradients so that you get "
         "only your chunk (tensor_split layout), take Adam's first step on your chunk (lr=1e-2, betas "
         "(0.9, 0.999), eps=1e-8, moments starting at zero) and return your updated chunk.",
    reference=shard_update_solution,
    make_inputs=shard_update_inputs,
    world_sizes=(2, 3),
    tolerance=1e-6,
    reason="Adam's first step moves each element by about lr; summing the gradient in another order or "
           "writing Adam's few float32 operations in another order changes the result by a few ulps",
    hint="every rank must call the reduce-scatter, in the same order; rank r owns chunk r of torch.tensor_split",
)

EXERCISES = [ZERO_BYTES, SHARD_UPDATE]
