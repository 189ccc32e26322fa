"""Bytes and rounds of one ZeRO training step, stage by stage, with ring collectives."""
from __future__ import annotations

from wmdist.costs.collectives import ring_all_gather_bytes, ring_reduce_scatter_bytes
from wmdist.costs.validate import require_choice, require_int

ZERO_STAGES = (0, 1, 2, 3)


def zero_step_bytes(numel: int, world_size: int, rank: int, stage: int, *, elem_size: int = 4) -> dict[str, int]:
    """Bytes rank `rank` sends in one ZeRO training step, by phase, with ring collectives.

    The schedule wmdist.memory.zero runs (the whole model is one flat unit):
    stage 0 (replicated data parallelism) all-reduces the gradient;
    stages 1 and 2 reduce-scatter the gradient and all-gather the updated
    parameters, which is the all-reduce's volume split in two;
    stage 3 all-gathers the parameters before forward, again before backward
    (they were freed in between) and reduce-scatters the gradient: 1.5x.
    Chunk sizes are the true tensor_split sizes, so ranks can differ slightly.
    """
    require_choice("stage", stage, ZERO_STAGES)
    scatter = ring_reduce_scatter_bytes(numel, world_size, rank, elem_size=elem_size)
    gather = ring_all_gather_bytes(numel, world_size, rank, elem_size=elem_size)
    if stage == 0:
        return {"gradient all-reduce/reduce-scatter": scatter, "gradient all-reduce/all-gather": gather}
    if stage in (1, 2):
        return {"gradient reduce-scatter": scatter, "parameter all-gather": gather}
    return {"forward all-gather": gather, "backward all-gather": gather, "gradient reduce-scatter": scatter}


def zero_step_rounds(world_size: int, stage: int) -> int:
    """Ring rounds per ZeRO step: N-1 per collective; two collectives (three for stage 3)."""
    n = require_int("world_size", world_size, 1)
    require_choice("stage", stage, ZERO_STAGES)
    return (3 if stage == 3 else 2) * (n - 1)
