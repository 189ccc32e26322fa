"""ZeRO's transient peak: what a rank holds *during* a step, next to the steady state between steps (pure).

`per_rank_bytes` counts what a rank keeps between steps. Within a step the
sharded stages briefly need full tensors again: stage 2 builds the full local
gradient before reduce-scattering it, stage 3 gathers the full parameters for
forward and again for backward, and backward builds the full gradient.
Stages 0 and 1 accumulate into the full gradient buffer they keep anyway.

Two views of the same rule:

* `zero_step_held`: byte-exact predictions, per kind, at the three points of
  the step at which wmdist.memory.zero reads what a rank holds (its schedule
  gathers the whole tiny model as one unit, fp32, Adam).
* `transient_peak`: the calculator's estimate for any MemoryConfig. A
  framework gathers and reduces one unit at a time (a layer, an FSDP unit, a
  gradient bucket), so the extra is one unit's full tensors: the gradient of
  a unit for stage 2, its parameters and gradient for stage 3. Unit = the
  whole local model is what our demo does; one layer is FSDP-like.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs.collectives import ring_chunk_size
from wmdist.costs.validate import require_choice, require_int
from wmdist.memory.footprint import DTYPE_BYTES, MemoryConfig, local_params, per_rank_bytes

POINTS = ("between forward and backward", "after backward", "after the gradient reduction")
HELD_KINDS = ("parameters", "gradients", "optimizer_state")


def zero_step_held(numel: int, world_size: int, rank: int, stage: int, *, keep_gathered: bool = False
                   ) -> dict[str, dict[str, int]]:
    """Bytes the demo's rank holds at each of POINTS, by kind (fp32, Adam): {point: {kind: bytes}}.

    P = numel, c = this rank's chunk. Between steps a rank keeps
    P/P/2P (stage 0), P/P/2c (1), P/c/2c (2), c/c/2c (3) elements of
    parameters/gradients/Adam moments. During the step, stage 2 adds the full
    gradient P after backward until the reduced chunk is in place; stage 3
    adds the gathered parameters P after backward (freed between forward and
    backward, and again before the reduction) and the full gradient P.
    `keep_gathered` is the broken stage 3 that never frees its gathered copy.
    """
    require_int("numel", numel, 0)
    n = require_int("world_size", world_size, 1)
    if not 0 <= require_int("rank", rank, 0) < n:
        raise ValueError(f"rank must be < world_size {n}, got {rank}")
    require_choice("stage", stage, (0, 1, 2, 3))
    P, c = numel, ring_chunk_size(numel, n, rank)
    params = P if stage < 3 else c
    grads = P if stage < 2 else c
    moments = 2 * (P if stage == 0 else c)
    gathered = P if stage == 3 else 0                  # stage 3's full copy, when it is resident
    full_grad = P if stage >= 2 else 0                 # stages 2-3 build the full gradient beside their shard
    kept = gathered if keep_gathered else 0
    rows = {POINTS[0]: (params + kept, grads),
            POINTS[1]: (params + gathered, grads + full_grad),
            POINTS[2]: (params + kept, grads + full_grad)}
    return {point: {"parameters": 4 * p, "gradients": 4 * g, "optimizer_state": 4 * moments}
            for point, (p, g) in rows.items()}


@dataclass(frozen=True)
class TransientPeak:
    """Steady bytes between steps, the peak within a step, and what makes the difference."""
    steady: int
    peak: int
    what: str

    @property
    def extra(self) -> int:
        return self.peak - self.steady


def transient_peak(cfg: MemoryConfig, *, rank: int = 0, unit: int | None = None) -> TransientPeak:
    """Steady total and the peak while a ZeRO stage builds full tensors of one `unit` (elements).

    `unit` defaults to the rank's whole model-parallel piece (everything
    gathered at once, as in our demo); pass piece // layers for one layer at a
    time. Activations and the batch are counted as in the steady state.
    """
    piece, _ = local_params(cfg, rank=rank)
    u = piece if unit is None else require_int("unit", unit, 0, high=piece)
    steady = per_rank_bytes(cfg, rank=rank)["total"]
    pbytes, gbytes = DTYPE_BYTES[cfg.param_dtype], DTYPE_BYTES[cfg.grad_dtype or cfg.param_dtype]
    if cfg.zero_stage == 2 and cfg.dp > 1:
        return TransientPeak(steady, steady + u * gbytes, "the full gradient of a unit, before its reduce-scatter")
    if cfg.zero_stage == 3 and cfg.dp > 1:
        return TransientPeak(steady, steady + u * (pbytes + gbytes),
                             "a unit's gathered parameters and its full gradient, during its backward")
    return TransientPeak(steady, steady, "nothing: gradients accumulate into the full buffer the rank keeps")
