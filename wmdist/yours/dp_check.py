"""data_parallel(work, world_size=N): chapter 01 on your model, against one process and against torch's DDP.

The same workload runs three ways: our ranks (wmdist.yours.training.replica_train: the counted ring
all-reduce), torch's DistributedDataParallel (versus_torch.workload_ddp_train), and one process on the whole batch
(reference.one_process). The Report holds the checks (the step-0 gradient in units of its rounding bound,
the final parameters to a measured tolerance, every rank's copy bitwise equal) and the exact counts: ring
bytes sent per step against costs.ring_allreduce_bytes (2(N-1)/N of 4P bytes when N divides P), ring rounds
against 2(N-1), and DDP's bucket payload against 4P bytes a step. P counts the trainable elements: frozen
parameters are not sent, and are checked bit for bit unchanged. On one rank our run is the reference's
operations in the reference's order, so it must be equal bit for bit, and is checked so.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from wmdist import costs
from wmdist.course.compare import bound_ratio
from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, close_check, counts_per_rank, exact_check, fact_check, max_abs_error
from wmdist.yours.footprint import Estimate, available_bytes, estimate_bytes, refuse_if_too_big, release_freed_memory
from wmdist.yours.reference import GRAD_WHY, PARAM_WHY, OneProcessRun, one_process, workload_param_tolerance
from wmdist.yours.training import ReplicaResult, replica_train
from wmdist.yours.versus_torch import TorchResult, workload_ddp_train
from wmdist.yours.workload import Workload, WorkloadSpec, prepare_workload


ONE_RANK = ("one rank: the reference's operations in its order (torch's too: its mean over B/1 examples and its "
            "average over 1 rank are the reference's 1/B), bitwise equal")


T = TypeVar("T")


@dataclass(frozen=True)
class OursThenTorch(Generic[T]):
    """One rank's run of ours (ReplicaResult, ZeroResult), then of torch's counterpart (DDP, ZeRO, FSDP2)."""
    ours: T
    theirs: TorchResult


def ours_then_torch(ctx: Context, spec: WorkloadSpec, ours: Callable[[Context, WorkloadSpec], T],
                    theirs: Callable[[Context, WorkloadSpec], TorchResult]) -> OursThenTorch[T]:
    """A rank function's body: `ours`, then `theirs`, on one spec, each one's freed memory given back after it."""
    mine = ours(ctx, spec)
    release_freed_memory()
    torch_run = theirs(ctx, spec)
    release_freed_memory()
    return OursThenTorch(mine, torch_run)


def workload_and_ddp(ctx: Context, spec: WorkloadSpec) -> OursThenTorch[ReplicaResult]:
    """Rank function: the workload with our data parallelism, then with DDP."""
    return ours_then_torch(ctx, spec, replica_train, workload_ddp_train)


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """What a data-parallel Report's figures and text read: distances from one process, and the tolerances."""
    reference: OneProcessRun
    param_tolerance: float
    ours_vs_one_process: float           # max |final parameters - one process's|
    ddp_vs_one_process: float
    grad_bound_ratio: float              # max |our step-0 gradient - one process's| / its bound


def same_everywhere(name: str, digests: list[str], why: str) -> Check:
    """Every rank's final parameters bitwise rank 0's, judged by the digests of their bytes (each rank sends
    its digest, not a second copy of the model); the detail names the ranks that differ."""
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    check = fact_check(name, holds=not differ, reason=f"{why}; bitwise, by the digests of their bytes")
    return dataclasses.replace(check, detail=f"ranks {differ} differ from rank 0" if differ else "")


def grad_check(name: str, got: torch.Tensor, ref: OneProcessRun, world_size: int) -> Check:
    """The step-0 gradient against one process: bit for bit on one rank, else in units of its bound."""
    if world_size == 1:
        return exact_check(name.replace(" (in units of its rounding bound)", ""), got, ref.grad0, ONE_RANK)
    return Check(name=name, error=bound_ratio(got, ref.grad0, ref.grad_bounds[0]), tolerance=1.0, reason=GRAD_WHY)


def param_check(name: str, got: torch.Tensor, want: torch.Tensor, spec: WorkloadSpec, tol: float, *,
                bitwise: bool, times: int = 1) -> Check:
    """Final parameters: bitwise where the operations are the reference's own, else within `times` tolerances."""
    if bitwise:
        return exact_check(name, got, want, ONE_RANK)
    why = PARAM_WHY.format(steps=spec.work.steps, optimizer=spec.work.optimizer)
    if times > 1:
        why = f"each side within the tolerance of one process ({why})"
    return close_check(name, got, want, times * tol, why)


FROZEN_WHY = "frozen (requires_grad=False): never reduced or stepped, so exactly the weights it was built with"


def frozen_checks(who: str, ended: list[torch.Tensor], ref: OneProcessRun) -> list[Check]:
    """Each run's frozen parameters bitwise what the model was built with (none: no checks)."""
    if not ref.frozen.numel():
        return []
    return [exact_check(f"{w} frozen parameters unchanged", e, ref.frozen, FROZEN_WHY) for w, e in zip(who, ended)]


def reference_and_tolerance(spec: WorkloadSpec) -> tuple[OneProcessRun, float]:
    """The one-process run both checks compare with (its memory given back after it), and the parameters' tolerance."""
    ref = one_process(spec.work, spec.world_size)
    release_freed_memory()
    return ref, workload_param_tolerance(spec.work, ref)


def compare_dp(spec: WorkloadSpec, results: list[OursThenTorch[ReplicaResult]]) -> Verdict:
    """Ours and DDP against one process and each other; ring bytes and rounds, DDP's payload, exact."""
    n, numel = spec.world_size, spec.numel
    ours, ddp = [r.ours for r in results], [r.theirs for r in results]
    ref, tol = reference_and_tolerance(spec)
    one = n == 1
    checks = [grad_check("step-0 gradient == one process (in units of its rounding bound)", ours[0].grad0, ref, n),
              param_check("final parameters == one process (rank 0)", ours[0].params, ref.params, spec, tol,
                          bitwise=one),
              same_everywhere("every rank holds the same parameters", [o.digest for o in ours],
                              "every rank applies the same all-gathered sum"),
              grad_check("DDP step-0 gradient == one process (in units of its rounding bound)", ddp[0].grad0, ref, n),
              param_check("DDP final parameters == one process", ddp[0].params[0], ref.params, spec, tol,
                          bitwise=one),
              param_check("our final parameters == DDP's", ours[0].params, ddp[0].params[0], spec, tol,
                          bitwise=one, times=2)]
    checks += frozen_checks(["our", "DDP"], [ours[0].frozen, ddp[0].frozen], ref)
    exact = []
    for s in range(spec.work.steps):
        exact += counts_per_rank("ring bytes sent", [o.bytes_per_step[s] for o in ours],
                                 [costs.ring_allreduce_bytes(numel, n, r, elem_size=spec.element_bytes) for r in range(n)], step=s)
        exact += counts_per_rank("ring rounds", [o.rounds_per_step[s] for o in ours],
                                 [costs.ring_allreduce_rounds(n)] * n, step=s)
    exact += counts_per_rank("DDP bucket payload bytes", [d.sent["ddp/grads"] for d in ddp],
                             [spec.work.steps * numel * spec.element_bytes] * n, phase="ddp/grads")
    data = Agreement(reference=ref, param_tolerance=tol, ours_vs_one_process=max_abs_error(ours[0].params, ref.params),
                     ddp_vs_one_process=max_abs_error(ddp[0].params[0], ref.params),
                     grad_bound_ratio=bound_ratio(ours[0].grad0, ref.grad0, ref.grad_bounds[0]))
    params = {"steps": spec.work.steps, "optimizer": spec.work.optimizer, "lr": spec.work.lr, "numel": numel,
              "batch_sizes": list(spec.batch_sizes)}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


def dp_experiment(spec: WorkloadSpec) -> Experiment:
    """The run as an Experiment on this one spec (your workload is not a registered demo)."""
    return Experiment(name="your-model-data-parallel", chapter="01", world_sizes=(spec.world_size,),
                      title="Your model: data parallel (ring all-reduce) vs one process vs DDP",
                      spec=lambda n: spec, ranks=workload_and_ddp, compare=compare_dp)


def data_parallel(work: Workload, *, world_size: int = 2) -> Report:
    """Train `work` data-parallel on `world_size` ranks; check it against one process and torch's DDP.

    Refused with a ValueError or TypeError before any process starts: see workload.prepare_workload.
    """
    spec = prepare_workload(work, world_size)
    refuse_if_too_big(estimate(spec), available_bytes(), numel=spec.numel, what="data_parallel")
    return dp_experiment(spec).run_spec(spec)


def estimate(spec: WorkloadSpec) -> Estimate:
    """footprint.estimate_bytes for this spec, frozen parameters counted as trainable (an over-estimate: they have
    no gradient or optimizer state, but every run holds them whole); a float64 element as two float32 ones."""
    work = spec.work
    slots = 2 if work.optimizer == "adam" else (1 if work.momentum else 0)
    return estimate_bytes((spec.numel + spec.frozen_numel) * spec.element_bytes // 4, spec.world_size, stage=spec.stage, slots=slots, steps=work.steps)
