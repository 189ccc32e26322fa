"""The small end's measurement: chapter 09's mesh step run several times on the same ranks, its parts timed.

The notebook's earlier comparison timed one step, the first: it carries one-time costs (autograd's first graph,
the allocator's first blocks, each gloo pair's first message) that a training loop pays once (measured on 2
cores at load 1.4-1.9: a first step 220-254 ms, later ones 85-227 ms; the spread is the machine's load). `measure_mesh_steps` times `repeats` steps after one warm-up step, on
each rank: the schedule (forward, backward, tp's collectives and pp's messages), the gradient sync (cp and dp
all-reduces) and the optimizer step, so a prediction can be set beside the part it models. A thin process layer:
the formulas stay in planner/small.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wmdist.comm import Context, barrier
from wmdist.costs.mesh import TRAFFIC_AXES
from wmdist.costs.validate import require_int
from wmdist.mesh.spec import MeshSpec
from wmdist.mesh.stage import MeshStage, full_model
from wmdist.mesh.step import Momentum, rank_microbatches, run_schedule, sync_mesh_gradients
from wmdist.runtime import run
from wmdist.tensor_parallel.layers import TPGroup


@dataclass(frozen=True)
class StepParts:
    """Seconds of one rank's step: the schedule, the gradient sync, the optimizer step, and all three."""
    schedule: float
    sync: float
    optimizer: float
    total: float


def time_mesh_steps(ctx: Context, spec: MeshSpec, repeats: int) -> list[StepParts]:
    """Rank function: one untimed warm-up step, then `repeats` timed ones, each after a barrier."""
    torch.set_num_threads(1)
    coords = spec.mesh.coords(ctx.rank)
    views = {axis: ctx.along(spec.mesh, axis) for axis in TRAFFIC_AXES}
    tp = TPGroup(views["tp"], views["tp"].group, coords["tp"], spec.tp)
    stage = MeshStage(full_model(spec), spec, coords["tp"], coords["pp"])
    opt = Momentum(list(stage.parameters()), spec.lr)
    micro = rank_microbatches(spec, coords)
    out = []
    for _ in range(repeats + 1):
        for p in stage.parameters():
            p.grad = None
        barrier(ctx, phase="line up")
        t0 = time.perf_counter()
        run_schedule(views["pp"], spec, stage, micro, tp, views["cp"])
        t1 = time.perf_counter()
        sync_mesh_gradients(stage, views, spec.buckets)
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        out.append(StepParts(schedule=t1 - t0, sync=t2 - t1, optimizer=t3 - t2, total=t3 - t0))
    return out[1:]


def measure_mesh_steps(spec: MeshSpec, *, repeats: int = 5) -> list[list[StepParts]]:
    """Per rank, `repeats` warm steps of `spec`'s mesh (time_mesh_steps); a step's time is its slowest rank's.

    A helper for chapter 11's notebook (the small end's measured step): it calls `runtime.run` itself, since a
    timing is shown, never checked, and so is no demo's Experiment.
    """
    require_int("repeats", repeats, 1)
    return run(time_mesh_steps, spec.world_size, spec, repeats)


def slowest_steps(ranks: list[list[StepParts]]) -> list[StepParts]:
    """Each repeat's slowest rank (the step ends when the last rank does)."""
    return [max(step, key=lambda p: p.total) for step in zip(*ranks)]
