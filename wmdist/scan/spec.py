"""The episodes chapter 07's cell demos run on: seeded, and checked before any process starts.

scan-cell (three ways to split the GRU core's work) and scan-picard (Picard
sweeps) run on the same kind of input: B seeded episodes of T steps, a seeded
cell, initial states, and a sleep per step and episode so the timelines show
the schedule rather than gloo's latency. `EpisodeSpec` names them once; its
`inputs` are boundaries.CellInputs, refused (one ValueError) when built.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.costs.validate import require_int
from wmdist.scan.boundaries import CellInputs
from wmdist.scan.cell import GRUCell


def episodes(*, batch: int = 8, steps: int = 37, state_size: int = 16, input_size: int = 8, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> tuple[GRUCell, torch.Tensor, torch.Tensor]:
    """A seeded cell, inputs x (B, T, m) ~ N(0, 1) and initial states h0 (B, n) uniform in [-1, 1]."""
    cell = GRUCell.seeded(state_size, input_size, seed=seed + 1, dtype=dtype)
    g = torch.Generator().manual_seed(require_int("seed", seed, 0) + 2)
    x = torch.randn(require_int("batch", batch, 1), require_int("steps", steps, 1), input_size, generator=g,
                    dtype=torch.float64)
    h0 = torch.rand(batch, state_size, generator=g, dtype=torch.float64) * 2 - 1
    return cell, x.to(dtype), h0.to(dtype)


@dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """Seeded `episodes` for `world_size` ranks (at least `min_world_size`), each step sleeping `step_seconds`
    per episode; `inputs` holds them, checked."""
    world_size: int
    steps: int = 37
    batch: int = 8
    step_seconds: float = 1e-4
    seed: int = 0
    min_world_size: int = 1
    inputs: CellInputs = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cell, x, h0 = episodes(batch=self.batch, steps=self.steps, seed=self.seed)
        object.__setattr__(self, "inputs", CellInputs(world_size=self.world_size, cell=cell, x=x, h0=h0,
                                                      step_seconds=self.step_seconds,
                                                      min_world_size=self.min_world_size))
