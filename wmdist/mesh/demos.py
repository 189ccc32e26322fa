"""Chapter 09's experiments: one training step on a combined mesh, checked three ways.

  * against one device: loss, every gradient slice and every parameter after
    the step, within the derived tolerance of reference.py;
  * against the formulas: each rank's ledger, split by axis ("dp/...",
    "tp/...", "pp/...", "cp/..."), equals costs.mesh.axis_traffic in bytes
    and in messages, and nothing is sent outside the four axes;
  * against the memory calculator: the bytes each rank holds after the step
    (parameters, gradients, momentum buffers, measured by storage) equal
    memory.footprint.per_rank_bytes for a MemoryConfig with the same
    degrees and this model's exact layout (costs.mesh.rank_params).

Demos: "mesh-3d" (2 dp x 2 tp x 2 pp) and "mesh-cp" (2 dp x 2 cp x 2 tp) on
8 ranks, "mesh-2d" (2 dp x 2 tp) on 4, the one the two-"node" torchrun test
runs. Any other world size is refused before a process starts.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from wmdist.comm import Context
from wmdist.costs.mesh import AXES, Traffic, axis_traffic, rank_params
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.mesh.reference import agreement, reference_step
from wmdist.mesh.spec import MeshSpec
from wmdist.mesh.step import HELD, RankStep, mesh_step
from wmdist.report import Demo, Report, counts_per_rank
from wmdist.runtime import run

MESH_3D = MeshSpec(dp=2, tp=2, pp=2, cp=1)
MESH_CP = MeshSpec(dp=2, tp=2, pp=1, cp=2)
MESH_2D = MeshSpec(dp=2, tp=2, pp=1, cp=1)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
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


def memory_config(spec: MeshSpec) -> MemoryConfig:
    """The calculator's config for this mesh: same degrees, fp32, SGD with momentum, this model's exact pieces."""
    shape = spec.shape
    whole = rank_params(replace(shape, dp=1, tp=1, pp=1, cp=1), 0, 0)
    pieces = tuple(rank_params(shape, t, p) for p in range(spec.pp) for t in range(spec.tp))
    return MemoryConfig(params=whole, param_dtype="fp32", optimizer="momentum", dp=spec.dp, tp=spec.tp, pp=spec.pp,
                        cp=spec.cp, layers=spec.layers, param_pieces=pieces)


def mesh_step_counted(ctx: Context, spec: MeshSpec) -> tuple[RankStep, int]:
    """mesh_step, and how many process groups this rank's process holds afterwards (cached across calls)."""
    return mesh_step(ctx, spec), len(ctx.resources.groups)


def run_mesh(spec: MeshSpec, world_size: int, name: str = "mesh", progress: Progress | None = None) -> Report:
    """One step of `spec` on `world_size` local ranks (or under torchrun), checked against one device, the
    per-axis formulas and the memory calculator. The world size is checked before any process starts;
    `progress(done, total, text)` hears about each of the three parts."""
    n = spec.check_world(world_size)
    say = progress or (lambda done, total, text: None)
    say(0, 3, f"one training step of {spec.degrees} on {n} ranks")
    start = time.perf_counter()
    results = run(mesh_step_counted, n, spec, timeout=300)
    seconds = time.perf_counter() - start
    runs, groups = [r[0] for r in results], [r[1] for r in results]
    say(1, 3, "the same step on one device")
    checks = agreement(spec, reference_step(spec), runs)
    say(2, 3, "ledger by axis against the formulas, bytes held against the calculator")
    predicted = [axis_traffic(spec.shape, r.coords) for r in runs]
    memory = memory_config(spec)
    held_predicted = [{k: per_rank_bytes(memory, r.rank)[k] for k in HELD} for r in runs]
    case = spec.degrees
    exact = []
    for axis in AXES:
        exact += counts_per_rank("bytes sent", [r.traffic[axis].bytes_sent for r in runs],
                                 [p[axis].bytes_sent for p in predicted], phase=f"{axis}/", case=case)
        exact += counts_per_rank("messages", [r.traffic[axis].messages for r in runs],
                                 [p[axis].messages for p in predicted], phase=f"{axis}/", case=case)
    exact += counts_per_rank("bytes sent", [sum(v["bytes_sent"] for v in r.phases.values()) for r in runs],
                             [sum(t.bytes_sent for t in p.values()) for p in predicted], phase="all", case=case)
    for kind in HELD:
        exact += counts_per_rank(f"{kind} bytes held", [r.held[kind] for r in runs],
                                 [h[kind] for h in held_predicted], case=case)
    data = MeshRun(spec, [r.coords for r in runs], [r.traffic for r in runs], predicted, [r.phases for r in runs],
                   [r.held for r in runs], held_predicted, [r.seconds for r in runs], groups)
    params = {"mesh": case, "width": spec.width, "heads": spec.heads, "layers": spec.layers, "seq_len": spec.seq_len,
              "batch": spec.batch, "microbatches": spec.microbatches, "buckets": spec.buckets}
    report = Report(name, n, checks, exact, seconds, params, data)
    say(3, 3, f"{name}: {'PASS' if report.passed else 'FAIL'}, step {max(data.step_seconds):.2f} s on the ranks")
    return report


def mesh_3d_demo(world_size: int) -> Report:
    """2 data x 2 tensor x 2 pipeline on 8 ranks: one step vs one device, per-axis bytes, memory per rank."""
    return run_mesh(MESH_3D, world_size, "mesh-3d")


def mesh_cp_demo(world_size: int) -> Report:
    """2 data x 2 context x 2 tensor on 8 ranks: ring attention inside the tensor-parallel blocks."""
    return run_mesh(MESH_CP, world_size, "mesh-cp")


def mesh_2d_demo(world_size: int) -> Report:
    """2 data x 2 tensor on 4 ranks: the mesh the two-"node" torchrun test runs."""
    return run_mesh(MESH_2D, world_size, "mesh-2d")


DEMOS = [
    Demo("mesh-3d", "3D parallelism: 2 dp x 2 tp x 2 pp, one step vs one device, ledger by axis, memory",
         mesh_3d_demo, world_sizes=(8,), chapter="09", min_world_size=8, max_world_size=8),
    Demo("mesh-cp", "2 dp x 2 cp x 2 tp: ring attention inside tensor-parallel blocks, one step vs one device",
         mesh_cp_demo, world_sizes=(8,), chapter="09", min_world_size=8, max_world_size=8),
    Demo("mesh-2d", "2 dp x 2 tp on 4 ranks (the mesh the torchrun test spreads over two nodes)",
         mesh_2d_demo, world_sizes=(4,), chapter="09", min_world_size=4, max_world_size=4),
]
