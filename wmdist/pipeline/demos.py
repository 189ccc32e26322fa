"""Chapter 05 demos on real ranks: a forward pipeline and pipeline training, each against one process.

`forward_demo` is the text's basic schedule: M microbatches flow forward
through P stages (GPipe's forward half); the output must equal the
single-device model and the ledger must show M(P-1) activation transfers
with their bytes. `schedules_train_demo` runs GPipe, 1F1B and interleaved 1F1B: the
loss and every gradient must equal the full-batch run (to the rounding of
summing the B*T token rows in M groups), and bitwise equal a single process
that accumulates the same microbatches in the same order.

Both are `Experiment`s on one spec type, `Plans` (the (schedule, work) cases
of a run on P ranks, built and checked before any process starts), and one
rank function, `plans_rank`, that runs every case in one call: both live in
spec.py, which the chapter's other demos share (re-exported here).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from wmdist.costs import pipeline as pcosts
from wmdist.costs.pipeline import ScheduleName
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.executor import StageRun
from wmdist.pipeline.plan import (
    Message,
    PipeWork,
    check_name,
    incoming,
    microbatch_sizes,
    outgoing,
    stage_blocks,
    transfer_counts,
)
from wmdist.pipeline.schedules import BACKWARD, FORWARD, MAX_MICROBATCHES, Schedule, make_schedule
from wmdist.pipeline.spec import Plans, StageRuns, by_case, checked_schedule, plans_rank
from wmdist.pipeline.stages import PipelineReference, gradient_tolerance, loss_tolerance, model_for, reference
from wmdist.course.report import Check, Count, Report, close_check, counts_per_rank, exact_check, max_abs_error
from wmdist.models.transformer import TransformerConfig

__all__ = ["Plans", "StageRuns", "by_case", "plans_rank", "boundary_counts", "ForwardResult", "forward_spec",
           "compare_forward", "FORWARD_DEMO", "forward_demo", "TrainResult", "backward_orders", "train_plans",
           "train_spec", "compare_train", "TRAIN_DEMO", "schedules_train_demo", "DEMOS"]

WIDTH = TransformerConfig().width      # H: every boundary tensor is one microbatch of (b, T, H) float32


def boundary_counts(schedule: Schedule, runs: list[StageRun], work: PipeWork, case: str) -> list[Count]:
    """Per rank: transfers and bytes the ledger counted in each direction, against what the schedule implies."""
    sizes, only = microbatch_sizes(work.batch_size, schedule.microbatches), work.forward_only
    ranks = range(len(runs))

    def nbytes(messages: Iterable[Message]) -> int:       # one boundary tensor: b_m x T x H float32
        return sum(4 * sizes[m.microbatch] * work.seq_len * WIDTH for m in messages)

    out: list[Count] = []
    kinds = (("activation", FORWARD),) + (() if only else (("gradient", BACKWARD),))
    for kind, letter in kinds:
        for quantity in (f"{kind} sends", f"{kind} receives"):
            out += counts_per_rank(quantity, [r.transfers[quantity] for r in runs],
                                   [transfer_counts(schedule, r, forward_only=only)[quantity] for r in ranks],
                                   case=case)
    for kind, letter in kinds:
        sent = [nbytes(m for dst, m in outgoing(schedule, r, forward_only=only) if dst != r and m.kind == letter)
                for r in ranks]
        got = [nbytes(m for msgs in incoming(schedule, r, forward_only=only).values() for m in msgs if m.kind == letter)
               for r in ranks]
        out += counts_per_rank(f"{kind} bytes sent", [r.bytes[f"{kind} bytes sent"] for r in runs], sent, case=case)
        out += counts_per_rank(f"{kind} bytes received", [r.bytes[f"{kind} bytes received"] for r in runs], got,
                               case=case)
    return out


@dataclass(kw_only=True, frozen=True)
class ForwardResult:
    """The forward pipeline's totals, as the text states them."""
    stages: int
    microbatches: int
    transfers: int            # activation sends over all ranks (the text: M(P-1))
    bytes: int                # their bytes
    output_error: float       # max |pipeline output - single device|


def forward_spec(world_size: int, *, microbatches: int = 8, work: PipeWork | None = None) -> Plans:
    """GPipe's forwards of M microbatches on P = `world_size` stages, checked (the batch defaults to 2M)."""
    require_int("microbatches", microbatches, 1, high=MAX_MICROBATCHES)      # named before the batch it sizes
    work = work or PipeWork(batch_size=2 * microbatches, forward_only=True)
    if not work.forward_only:
        raise ValueError("forward_demo runs forwards only: pass a PipeWork with forward_only=True")
    return Plans(world_size=world_size, cases=((checked_schedule(world_size, "gpipe", microbatches, 1, work), work),))


def compare_forward(plans: Plans, results: list[StageRuns]) -> Verdict:
    """The output against the single-device model (bitwise), the boundary transfers against the schedule."""
    (schedule, work), = plans.cases
    runs, = by_case(results)
    P, M = plans.world_size, schedule.microbatches
    ref = reference(work, M, gradients=False)
    output = runs[-1].outputs
    checks = [exact_check("pipeline output == single-device model", output, ref.output,
                          "recorded on this build, not promised: microbatches hold whole trajectories (attention "
                          "mixes rows only within one), and this build's matrix kernels keep their summation "
                          "order for fewer rows")]
    exact = boundary_counts(schedule, runs, work, "forward")
    total = sum(r.transfers["activation sends"] for r in runs)
    exact.append(Count(quantity="activation transfers, all ranks (M(P-1))", rank=0, measured=total, predicted=pcosts.boundary_transfers(P, M),
                       case="forward"))
    data = ForwardResult(stages=P, microbatches=M, transfers=total, bytes=sum(r.bytes["activation bytes sent"] for r in runs),
                         output_error=max_abs_error(output, ref.output))
    params = {"schedule": "gpipe (forwards only)", "microbatches": M, "batch_size": work.batch_size,
              "layers": work.layers, "blocks per stage": [len(b) for b in stage_blocks(work.layers, P)]}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


FORWARD_DEMO = Experiment(name="pp-forward", chapter="05", world_sizes=(1, 2, 4), spec=forward_spec,
                          title="Forward pipeline (GPipe's forwards): output == one process, M(P-1) transfers",
                          ranks=plans_rank, compare=compare_forward)


def forward_demo(world_size: int, *, microbatches: int = 8, work: PipeWork | None = None) -> Report:
    """GPipe's forward on `world_size` stages: outputs equal one process; M(P-1) activation transfers, counted."""
    return FORWARD_DEMO.run_spec(forward_spec(world_size, microbatches=microbatches, work=work))


@dataclass(kw_only=True, frozen=True)
class TrainResult:
    """One schedule's training step against the single-device runs."""
    schedule: str
    microbatches: int
    chunks: int
    loss_error: float             # |pipeline loss - full batch|
    grad_error: float             # max |pipeline gradient - full-batch gradient|
    grad_tolerance: float         # the rounding bound it is held to
    peak_held: tuple[int, ...]    # per rank: most activation sets held at once


def backward_orders(schedule: Schedule) -> list[list[int]]:
    """For each virtual stage, the microbatches in the order its rank runs their backwards."""
    return [[a.microbatch for a in schedule.ranks[s % schedule.stages] if a.kind == BACKWARD and a.stage == s]
            for s in range(schedule.virtual_stages)]


def train_plans(world_size: int) -> list[tuple[ScheduleName, int, int]]:
    """(schedule, M, v) the training demo runs on N ranks: M = 2N; v = 2 where 8 blocks allow 2N stages."""
    m = 2 * world_size
    return [("gpipe", m, 1), ("1f1b", m, 1), ("interleaved", m, 2 if 2 * world_size <= PipeWork().layers else 1)]


def train_spec(world_size: int, *, plans: list[tuple[ScheduleName, int, int]] | None = None) -> Plans:
    """One training step per (schedule, M, v), batch 2M, on `world_size` ranks, checked (default: train_plans)."""
    cases = []
    for name, m, v in plans or train_plans(world_size):
        make_schedule(check_name(name), world_size, m, chunks=v)       # P, M and v named first, then the batch
        work = PipeWork(batch_size=2 * m)
        cases.append((checked_schedule(world_size, name, m, v, work), work))
    return Plans(world_size=world_size, cases=tuple(cases))


def compare_train(plans: Plans, results: list[StageRuns]) -> Verdict:
    """Per schedule: loss and gradients against the full batch (rounding bound), bitwise against one process
    accumulating the same microbatches; transfers and peak activation sets against the schedule."""
    P = plans.world_size
    checks: list[Check] = []
    exact: list[Count] = []
    data = []
    # one per M: the schedules differ only in accumulation order
    references: dict[int, PipelineReference] = {}
    for (schedule, work), runs in zip(plans.cases, by_case(results), strict=True):
        name, m = schedule.name, schedule.microbatches
        if m not in references:
            references[m] = reference(work, m)
        ref = references[m]
        accumulated = ref.accumulated(backward_orders(schedule), model_for(work))
        grads = {k: v for r in runs for k, v in r.grads.items()}
        names = sorted(ref.grads)
        gtol = gradient_tolerance(work, ref.bound)
        loss = runs[(schedule.virtual_stages - 1) % P].loss
        checks += [
            close_check(f"{name}: loss == single device, whole batch", loss, ref.loss,
                        loss_tolerance(work, float(ref.loss), m), "positive terms summed in M groups"),
            close_check(f"{name}: every gradient == single device, whole batch", [grads[k] for k in names],
                        [ref.grads[k] for k in names], gtol,
                        f"the B*T = {work.batch_size * work.seq_len} token rows of each gradient summed in M groups"),
            exact_check(f"{name}: every gradient == one process accumulating the same microbatches",
                        [grads[k] for k in names], [accumulated[k] for k in names],
                        "the same operations in the same order: bitwise")]
        exact += boundary_counts(schedule, runs, work, name)
        exact += counts_per_rank("activation sets held (peak)", [r.peak_held for r in runs],
                                 [pcosts.peak_activations_in_flight(name, P, m, chunks=schedule.chunks, rank=r)
                                  for r in range(P)], case=name)
        data.append(TrainResult(schedule=name, microbatches=m, chunks=schedule.chunks, loss_error=max_abs_error(loss, ref.loss),
                                grad_error=max_abs_error([grads[k] for k in names], [ref.grads[k] for k in names]), grad_tolerance=gtol,
                                peak_held=tuple(r.peak_held for r in runs)))
    params = {"plans": [f"{s.name} M={s.microbatches} v={s.chunks}" for s, _ in plans.cases], "batch_size": "2M"}
    return Verdict(checks=checks, exact=exact, params=params, data=tuple(data))


TRAIN_DEMO = Experiment(name="pp-train", chapter="05", world_sizes=(1, 2, 4), spec=train_spec,
                        title="Pipeline training (GPipe, 1F1B, interleaved): loss and gradients == one process",
                        ranks=plans_rank, compare=compare_train)


def schedules_train_demo(world_size: int, *, plans: list[tuple[ScheduleName, int, int]] | None = None) -> Report:
    """One training step under each schedule: loss and every gradient vs one process, transfers and peaks counted."""
    return TRAIN_DEMO.run_spec(train_spec(world_size, plans=plans))


DEMOS = [FORWARD_DEMO, TRAIN_DEMO]
