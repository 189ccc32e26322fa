"""zero(work, stage=s, world_size=N): chapter 03's ZeRO on your model, against one process and against torch's.

Our ZeRO-s (wmdist.yours.training.zero_train) and torch's counterpart run on the same ranks, one after
the other: stage 1 next to torch.distributed.optim.ZeroRedundancyOptimizer, stage 2 next to FSDP2 with
reshard_after_forward=False, stage 3 next to FSDP2 with reshard_after_forward=True (versus_torch.py says
how their traffic is counted). Checks: the final parameters against one process (torch.optim on the whole
batch) and against torch's run, to the measured tolerance of reference.py; our summed step-0 gradient in
units of its rounding bound. Exact counts: each step's ring bytes by phase against costs.zero_step_bytes,
ring rounds against costs.zero_step_rounds, the bytes each rank holds between steps against chapter 03's
memory model (memory.footprint.per_rank_bytes), and torch's payload against its own layout. One rank is
the reference's operations (a ring of one sends nothing, the elementwise update is torch.optim's), so it
is checked bit for bit. P counts the trainable elements: frozen parameters stay whole on every rank,
unsent (FSDP2 shards and gathers them, but scatters no gradient for them), and are checked unchanged.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch

from wmdist import costs
from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Verdict
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.course.report import Count, Report, counts_per_rank
from wmdist.yours.dp_check import (OursThenTorch, estimate, frozen_checks, grad_check, ours_then_torch, param_check,
                                   reference_and_tolerance, same_everywhere)
from wmdist.yours.footprint import available_bytes, refuse_if_too_big
from wmdist.yours.training import ZeroResult, zero_train
from wmdist.yours.versus_torch import TorchResult, fsdp2_step_traffic, fsdp2_train, joined_shards, zero_redundancy_train
from wmdist.yours.workload import Workload, WorkloadSpec, prepare_workload

ZeroStage = Literal[1, 2, 3]
STAGES: tuple[int, ...] = get_args(ZeroStage)
TORCH_NAME = {1: "ZeroRedundancyOptimizer", 2: "FSDP2 (reshard_after_forward=False)",
              3: "FSDP2 (reshard_after_forward=True)"}


def torch_zero_train(ctx: Context, spec: WorkloadSpec) -> TorchResult:
    """torch's counterpart of our ZeRO at spec.stage: ZeroRedundancyOptimizer (1), FSDP2 (2: no reshard, 3)."""
    return zero_redundancy_train(ctx, spec) if spec.stage == 1 else fsdp2_train(ctx, spec, reshard=spec.stage == 3)


def ours_and_torch(ctx: Context, spec: WorkloadSpec) -> OursThenTorch[ZeroResult]:
    """Rank function: our ZeRO at spec.stage, then torch's counterpart."""
    return ours_then_torch(ctx, spec, zero_train, torch_zero_train)


def _held(spec: WorkloadSpec, rank: int) -> dict[str, int]:
    work = spec.work
    slots = "adam" if work.optimizer == "adam" else ("momentum" if work.momentum else "sgd")
    dtype = "fp64" if spec.element_bytes == 8 else "fp32"
    return per_rank_bytes(MemoryConfig(params=spec.numel, param_dtype=dtype, optimizer=slots,
                                       zero_stage=spec.stage, dp=spec.world_size), rank=rank)


def _ring_counts(spec: WorkloadSpec, ours: list[ZeroResult]) -> list[Count]:
    n, numel, stage = spec.world_size, spec.numel, spec.stage
    rows = []
    for s in range(spec.work.steps):
        predicted = [costs.zero_step_bytes(numel, n, r, stage, elem_size=spec.element_bytes) for r in range(n)]
        for phase in predicted[0]:
            rows += counts_per_rank("ring bytes sent", [o.phases[s].get(phase, {}).get("bytes_sent", 0) for o in ours],
                                    [p[phase] for p in predicted], phase=phase, step=s)
        rows += counts_per_rank("ring rounds", [sum(v["rounds"] for v in o.phases[s].values()) for o in ours],
                                [costs.zero_step_rounds(n, stage)] * n, step=s)
    for kind in ("parameters", "gradients", "optimizer_state"):
        rows += counts_per_rank("held bytes", [o.held[kind] for o in ours],
                                [_held(spec, r)[kind] for r in range(n)], case=kind)
    if spec.frozen_numel:
        rows += counts_per_rank("held bytes", [o.held["frozen"] for o in ours], [spec.element_bytes * spec.frozen_numel] * n,
                                case="frozen parameters (whole on every rank)")
    return rows


def _torch_counts(spec: WorkloadSpec, theirs: list[TorchResult]) -> list[Count]:
    """torch's payload: the gradient all-reduce, 4P bytes a step (stage 1), or FSDP2's gathers and scatters."""
    n, steps = spec.world_size, spec.work.steps
    if spec.stage == 1:
        return counts_per_rank("gradient all-reduce payload bytes", [t.sent["gradient all-reduce"] for t in theirs],
                               [steps * spec.numel * spec.element_bytes] * n, phase="gradient all-reduce")
    step = fsdp2_step_traffic(spec, reshard=spec.stage == 3)
    rows = []
    for quantity, phase, key, each in (("all-gathers", "fsdp2/all-gather", "calls", step.gathers),
                                       ("payload bytes sent", "fsdp2/all-gather", "sent", step.gather_bytes),
                                       ("reduce-scatters", "fsdp2/reduce-scatter", "calls", step.scatters),
                                       ("payload bytes sent", "fsdp2/reduce-scatter", "sent", step.scatter_bytes)):
        rows += counts_per_rank(f"FSDP2 {quantity}", [getattr(t, key)[phase] for t in theirs], [steps * each] * n,
                                phase=phase)
    return rows


def compare_workload_zero(spec: WorkloadSpec, results: list[OursThenTorch[ZeroResult]]) -> Verdict:
    """Our ZeRO and torch's against one process and each other; ring bytes, rounds, held bytes, torch's payload."""
    n, stage = spec.world_size, spec.stage
    ours, theirs = [r.ours for r in results], [r.theirs for r in results]
    ref, tol = reference_and_tolerance(spec)
    got = torch.cat([o.chunk for o in ours])
    torch_params = theirs[0].params[0] if stage == 1 else joined_shards(theirs, spec)
    torch_frozen = theirs[0].frozen if stage == 1 else joined_shards(theirs, spec, trainable=False)
    name = TORCH_NAME[stage]
    checks = [grad_check(f"ZeRO-{stage} step-0 gradient == one process (in units of its rounding bound)",
                         torch.cat([o.grad0 for o in ours]), ref, n),
              param_check(f"ZeRO-{stage} final parameters == one process", got, ref.params, spec, tol, bitwise=n == 1),
              param_check(f"{name} final parameters == one process", torch_params, ref.params, spec, tol,
                          bitwise=n == 1),
              param_check(f"our ZeRO-{stage} == {name}", got, torch_params, spec, tol, bitwise=n == 1, times=2)]
    checks += frozen_checks([f"our ZeRO-{stage}", name], [ours[0].frozen, torch_frozen], ref)
    if stage == 1:
        checks.append(same_everywhere("every rank holds the same parameters after torch's broadcast",
                                      [t.digest for t in theirs], "a broadcast copies exact bytes"))
    exact = _ring_counts(spec, ours) + _torch_counts(spec, theirs)
    params = {"stage": stage, "steps": spec.work.steps, "optimizer": spec.work.optimizer, "lr": spec.work.lr,
              "numel": spec.numel, "torch": name}
    return Verdict(checks=checks, exact=exact, params=params, data=ref)


def zero_experiment(spec: WorkloadSpec) -> Experiment:
    """The run as an Experiment on this one spec."""
    return Experiment(name=f"your-model-zero-{spec.stage}", chapter="03", world_sizes=(spec.world_size,),
                      title=f"Your model: ZeRO-{spec.stage} vs one process vs {TORCH_NAME[spec.stage]}",
                      spec=lambda n: spec, ranks=ours_and_torch, compare=compare_workload_zero)


def zero(work: Workload, *, stage: ZeroStage, world_size: int = 2) -> Report:
    """Train `work` with ZeRO-`stage` on `world_size` ranks; check it against one process and torch's own.

    Refused with a ValueError or TypeError before any process starts: a stage other than 1, 2, 3, and
    whatever workload.prepare_workload refuses.
    """
    costs.require_choice("stage", stage, STAGES)
    spec = prepare_workload(work, world_size, stage=stage)
    refuse_if_too_big(estimate(spec), available_bytes(), numel=spec.numel, what=f"zero(stage={stage})")
    return zero_experiment(spec).run_spec(spec)
