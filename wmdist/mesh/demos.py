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
runs (their specs are the named scenarios of scenarios.py). Each is an `Experiment`: its spec is the MeshSpec (any other world size
is refused there, before a process starts), its rank function `mesh_step`, and
`compare_mesh` makes the three kinds of checks and the `MeshRun` figures read.
"""
from __future__ import annotations

from dataclasses import replace

from wmdist.costs.mesh import TRAFFIC_AXES, axis_traffic, rank_params
from wmdist.base.on_progress import OnProgress
from wmdist.course.experiment import Experiment, Verdict
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.mesh.reference import agreement, reference_step
from wmdist.mesh.scenarios import MESH_2D, MESH_3D, MESH_CP
from wmdist.mesh.spec import MeshRun, MeshSpec
from wmdist.mesh.step import HELD, RankStep, mesh_step
from wmdist.course.report import Count, Report, counts_per_rank

__all__ = ["MESH_2D", "MESH_3D", "MESH_CP", "DEMOS", "MeshRun", "compare_mesh", "memory_config", "mesh_experiment",
           "run_mesh", "mesh_2d_demo", "mesh_3d_demo", "mesh_cp_demo"]


def memory_config(spec: MeshSpec) -> MemoryConfig:
    """The calculator's config for this mesh: same degrees, fp32, SGD with momentum, this model's exact pieces."""
    shape = spec.shape
    whole = rank_params(replace(shape, dp=1, tp=1, pp=1, cp=1), 0, 0)
    pieces = tuple(rank_params(shape, t, p) for p in range(spec.pp) for t in range(spec.tp))
    return MemoryConfig(params=whole, param_dtype="fp32", optimizer="momentum", dp=spec.dp, tp=spec.tp, pp=spec.pp,
                        cp=spec.cp, layers=spec.layers, param_pieces=pieces)


def compare_mesh(spec: MeshSpec, runs: list[RankStep]) -> Verdict:
    """The step against one device (reference.agreement), each rank's ledger by axis against costs.mesh, and the
    bytes each rank holds against the memory calculator; the MeshRun for figures and tables."""
    checks = agreement(spec, reference_step(spec), runs)
    predicted = [axis_traffic(spec.shape, r.coords) for r in runs]
    memory = memory_config(spec)
    held_predicted = [{k: per_rank_bytes(memory, rank=r.rank)[k] for k in HELD} for r in runs]
    case = spec.degrees
    exact: list[Count] = []
    for axis in TRAFFIC_AXES:
        exact += counts_per_rank("bytes sent", [r.traffic[axis].bytes_sent for r in runs],
                                 [p[axis].bytes_sent for p in predicted], phase=f"{axis}/", case=case)
        exact += counts_per_rank("messages", [r.traffic[axis].messages for r in runs],
                                 [p[axis].messages for p in predicted], phase=f"{axis}/", case=case)
    exact += counts_per_rank("bytes sent", [sum(v["bytes_sent"] for v in r.phases.values()) for r in runs],
                             [sum(t.bytes_sent for t in p.values()) for p in predicted], phase="all", case=case)
    for kind in HELD:
        exact += counts_per_rank(f"{kind} bytes held", [r.held[kind] for r in runs],
                                 [h[kind] for h in held_predicted], case=case)
    data = MeshRun(spec=spec, coords=[r.coords for r in runs], measured=[r.traffic for r in runs], predicted=predicted, phases=[r.phases for r in runs],
                   held=[r.held for r in runs], held_predicted=held_predicted, step_seconds=[r.seconds for r in runs], groups=[r.groups for r in runs])
    params = {"mesh": case, "width": spec.width, "heads": spec.heads, "layers": spec.layers, "seq_len": spec.seq_len,
              "batch": spec.batch, "microbatches": spec.microbatches, "buckets": spec.buckets}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


def mesh_experiment(name: str, title: str, spec: MeshSpec) -> Experiment[MeshSpec, RankStep]:
    """One training step of `spec` as an experiment: runs on exactly dp * tp * pp * cp ranks."""
    return Experiment(name=name, title=title, chapter="09", world_sizes=(spec.world_size,), spec=spec.for_world,
                      ranks=mesh_step, compare=compare_mesh)


def run_mesh(spec: MeshSpec, world_size: int, *, name: str = "mesh", progress: OnProgress | None = None) -> Report:
    """One step of `spec` on `world_size` local ranks (or under torchrun), checked against one device, the
    per-axis formulas and the memory calculator. The world size is checked before any process starts;
    `progress(done, total, text)` hears about each part."""
    return mesh_experiment(name, f"one training step of {spec.degrees}", spec).run(world_size, progress=progress)


DEMOS = [
    mesh_experiment("mesh-3d", "3D parallelism: 2 dp x 2 tp x 2 pp, one step vs one device, ledger by axis, memory",
                    MESH_3D),
    mesh_experiment("mesh-cp", "2 dp x 2 cp x 2 tp: ring attention inside tensor-parallel blocks, one step vs one "
                    "device", MESH_CP),
    mesh_experiment("mesh-2d", "2 dp x 2 tp on 4 ranks (the mesh the torchrun test spreads over two nodes)", MESH_2D),
]
MESH_3D_DEMO, MESH_CP_DEMO, MESH_2D_DEMO = DEMOS


def mesh_3d_demo(world_size: int) -> Report:
    """2 data x 2 tensor x 2 pipeline on 8 ranks: one step vs one device, per-axis bytes, memory per rank."""
    return MESH_3D_DEMO.run(world_size)


def mesh_cp_demo(world_size: int) -> Report:
    """2 data x 2 context x 2 tensor on 8 ranks: ring attention inside the tensor-parallel blocks."""
    return MESH_CP_DEMO.run(world_size)


def mesh_2d_demo(world_size: int) -> Report:
    """2 data x 2 tensor on 4 ranks: the mesh the two-"node" torchrun test runs."""
    return MESH_2D_DEMO.run(world_size)
