"""One mesh training run, decided before any process starts: the model, the data, the four degrees (pure).

`MeshSpec` names everything a rank needs to build its share of the step:
the transformer world model's sizes, the batch and its microbatches, the
dp x tp x pp x cp degrees (their product is the world size), the gradient
buckets, the pipeline schedule and the optimizer's learning rate. Every
inconsistency (a tp rank without a head, a stage without a block, a cp
block that does not divide the context) is refused here, with the argument
named, so a demo fails before it starts processes. `MeshRun` is what one run
measured next to what was predicted: plain data, so figures and tables read
it without importing the runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from wmdist.comm.mesh import Mesh
from wmdist.costs.mesh import StepShape, Traffic
from wmdist.costs.validate import require_choice, require_fields, require_int, require_real

Schedule = Literal["gpipe", "1f1b"]    # chapter 05's two pipeline orders
SCHEDULES: tuple[str, ...] = get_args(Schedule)
MAX_CONTEXT = 64          # the demos' model learns at most this many positions


@dataclass(frozen=True, kw_only=True)
class MeshSpec:
    """A training step of the transformer world model on a dp x tp x pp x cp mesh (defaults: 2 x 2 x 2 x 1)."""
    width: int = 32            # H
    heads: int = 4
    mlp_ratio: int = 4         # F = mlp_ratio * H
    layers: int = 4
    seq_len: int = 8           # T: the context length of every trajectory
    batch: int = 8             # B trajectories per step, all data-parallel ranks together
    microbatches: int = 2      # M per data-parallel rank (pipeline microbatches, or gradient accumulation)
    dp: int = 2
    tp: int = 2
    pp: int = 2
    cp: int = 1
    buckets: int = 2           # gradient buckets per rank
    schedule: Schedule = "gpipe"
    lr: float = 0.05           # SGD with momentum 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        require_fields(self, ("width", "heads", "mlp_ratio", "layers", "seq_len", "batch", "microbatches", "dp", "tp",
                              "pp", "cp", "buckets"), 1)
        require_int("seq_len", self.seq_len, 1, high=MAX_CONTEXT)
        require_int("seed", self.seed, 0)
        require_choice("schedule", self.schedule, SCHEDULES)
        if require_real("lr", self.lr) == 0:
            raise ValueError("lr must be > 0")
        _ = self.shape             # building the StepShape checks the sizes against each other

    @property
    def mesh(self) -> Mesh:
        """The rank layout: tp fastest-varying (neighbouring ranks), then cp, dp, pp."""
        return Mesh(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shape(self) -> StepShape:
        """The sizes the per-axis formulas (costs.mesh) take."""
        return StepShape(width=self.width, heads=self.heads, hidden=self.mlp_ratio * self.width, layers=self.layers,
                         seq_len=self.seq_len, batch=self.batch, microbatches=self.microbatches, dp=self.dp,
                         tp=self.tp, pp=self.pp, cp=self.cp, buckets=self.buckets, max_len=self.seq_len)

    @property
    def degrees(self) -> str:
        """e.g. "2dp x 2tp x 2pp": the axes with more than one rank."""
        parts = [f"{getattr(self, a)}{a}" for a in ("dp", "cp", "tp", "pp") if getattr(self, a) > 1]
        return " x ".join(parts) or "1 rank"

    def check_world(self, world_size: int) -> int:
        """Refuse a world size that is not this mesh's dp * tp * pp * cp, before any process starts."""
        n = require_int("world_size", world_size, 1)
        if n != self.world_size:
            raise ValueError(f"world_size {n} does not fit the mesh {self.degrees}: it needs exactly "
                             f"dp * tp * pp * cp = {self.world_size} ranks")
        return n

    def for_world(self, world_size: int) -> MeshSpec:
        """This spec, once `world_size` is checked to be its dp * tp * pp * cp (an experiment's `spec`)."""
        self.check_world(world_size)
        return self


@dataclass(kw_only=True, frozen=True)
class MeshRun:
    """Everything a notebook shows about one mesh step: per rank, per axis, measured next to predicted."""
    spec: MeshSpec
    coords: list[dict[str, int]]
    measured: list[dict[str, Traffic]]       # ledger, per rank and axis
    predicted: list[dict[str, Traffic]]      # costs.mesh.axis_traffic, per rank and axis
    phases: list[dict[str, dict[str, int]]]  # each rank's ledger phase by phase
    held: list[dict[str, int]]               # bytes held after the step, measured
    held_predicted: list[dict[str, int]]     # the memory calculator's figures
    step_seconds: list[float]                # the step on each rank
    groups: list[int]                        # process groups each rank's process holds after the call
