"""Chapter 05 demos on real ranks: a forward pipeline and pipeline training, each against one process.

`forward_demo` is the text's basic schedule: M microbatches flow forward
through P stages (GPipe's forward half); the output must equal the
single-device model and the ledger must show M(P-1) activation transfers
with their bytes. `train_demo` runs GPipe, 1F1B and interleaved 1F1B: the
loss and every gradient must equal the full-batch run (to the rounding of
summing the B*T token rows in M groups), and bitwise equal a single process
that accumulates the same microbatches in the same order.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from wmdist.costs import pipeline as pcosts
from wmdist.costs.validate import require_int
from wmdist.pipeline.executor import StageRun, run_pipeline
from wmdist.pipeline.plan import (
    MAX_STAGES,
    Message,
    PipeWork,
    check_name,
    incoming,
    microbatch_sizes,
    outgoing,
    require_world,
    stage_blocks,
    transfer_counts,
)
from wmdist.pipeline.schedules import BACKWARD, FORWARD, MAX_MICROBATCHES, Schedule, make_schedule
from wmdist.pipeline.stages import Reference, gradient_tolerance, loss_tolerance, model_for, reference
from wmdist.report import Count, Demo, Report, close_check, counts_per_rank, exact_check, max_abs_error
from wmdist.transformer import TransformerConfig

WIDTH = TransformerConfig().width      # H: every boundary tensor is one microbatch of (b, T, H) float32


def plan(world_size: int, name: str, microbatches: int, chunks: int, work: PipeWork) -> Schedule:
    """Build and check everything a run needs; a bad input is one ValueError here, before any process starts."""
    schedule = make_schedule(check_name(name), world_size, microbatches, chunks)
    require_world(world_size, schedule)
    work.check(schedule)
    return schedule


def boundary_counts(schedule: Schedule, runs: list[StageRun], work: PipeWork, case: str) -> list[Count]:
    """Per rank: transfers and bytes the ledger counted in each direction, against what the schedule implies."""
    sizes, only = microbatch_sizes(work.batch_size, schedule.microbatches), work.forward_only
    ranks = range(len(runs))

    def nbytes(messages: Iterable[Message]) -> int:       # one boundary tensor: b_m x T x H float32
        return sum(4 * sizes[m[2]] * work.seq_len * WIDTH for m in messages)

    out: list[Count] = []
    kinds = (("activation", FORWARD),) + (() if only else (("gradient", BACKWARD),))
    for kind, letter in kinds:
        for quantity in (f"{kind} sends", f"{kind} receives"):
            out += counts_per_rank(quantity, [r.transfers[quantity] for r in runs],
                                   [transfer_counts(schedule, r, only)[quantity] for r in ranks], case=case)
    for kind, letter in kinds:
        sent = [nbytes(m for dst, m in outgoing(schedule, r, only) if dst != r and m[0] == letter) for r in ranks]
        got = [nbytes(m for msgs in incoming(schedule, r, only).values() for m in msgs if m[0] == letter)
               for r in ranks]
        out += counts_per_rank(f"{kind} bytes sent", [r.bytes[f"{kind} bytes sent"] for r in runs], sent, case=case)
        out += counts_per_rank(f"{kind} bytes received", [r.bytes[f"{kind} bytes received"] for r in runs], got,
                               case=case)
    return out


@dataclass(frozen=True)
class ForwardResult:
    """The forward pipeline's totals, as the text states them."""
    stages: int
    microbatches: int
    transfers: int            # activation sends over all ranks (the text: M(P-1))
    bytes: int                # their bytes
    output_error: float       # max |pipeline output - single device|


def forward_demo(world_size: int, microbatches: int = 8, work: PipeWork | None = None) -> Report:
    """GPipe's forward on `world_size` stages: outputs equal one process; M(P-1) activation transfers, counted."""
    require_int("microbatches", microbatches, 1, MAX_MICROBATCHES)      # named before the batch it sizes
    work = work or PipeWork(batch_size=2 * microbatches, forward_only=True)
    if not work.forward_only:
        raise ValueError("forward_demo runs forwards only: pass a PipeWork with forward_only=True")
    schedule = plan(world_size, "gpipe", microbatches, 1, work)
    start = time.perf_counter()
    runs: list[StageRun] = run_pipeline(world_size, schedule, work)
    seconds = time.perf_counter() - start
    ref = reference(work, microbatches, gradients=False)
    output = runs[-1].outputs
    checks = [exact_check("pipeline output == single-device model", output, ref.output,
                          "every operation acts on each token row alone: splitting the batch into microbatches "
                          "and the layers into stages changes no arithmetic")]
    exact = boundary_counts(schedule, runs, work, "forward")
    total = sum(r.transfers["activation sends"] for r in runs)
    exact.append(Count("activation transfers, all ranks (M(P-1))", 0, total,
                       pcosts.boundary_transfers(world_size, microbatches), case="forward"))
    data = ForwardResult(world_size, microbatches, total, sum(r.bytes["activation bytes sent"] for r in runs),
                         max_abs_error(output, ref.output))
    return Report("pp-forward", world_size, checks, exact, seconds,
                  {"schedule": "gpipe (forwards only)", "microbatches": microbatches, "batch_size": work.batch_size,
                   "layers": work.layers, "blocks per stage": [len(b) for b in stage_blocks(work.layers, world_size)]},
                  data)


@dataclass(frozen=True)
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


def train_plans(world_size: int) -> list[tuple[str, int, int]]:
    """(schedule, M, v) the training demo runs on N ranks: M = 2N; v = 2 where 8 blocks allow 2N stages."""
    m = 2 * world_size
    return [("gpipe", m, 1), ("1f1b", m, 1), ("interleaved", m, 2 if 2 * world_size <= PipeWork().layers else 1)]


def train_demo(world_size: int, plans: list[tuple[str, int, int]] | None = None) -> Report:
    """One training step under each schedule: loss and every gradient vs one process, transfers and peaks counted."""
    plans = plans or train_plans(world_size)
    schedules = []
    for name, m, v in plans:
        make_schedule(check_name(name), world_size, m, v)       # P, M and v named first, then the batch
        work = PipeWork(batch_size=2 * m)
        schedules.append((plan(world_size, name, m, v, work), work))
    start = time.perf_counter()
    results = [(s, w, run_pipeline(world_size, s, w)) for s, w in schedules]
    seconds = time.perf_counter() - start
    checks, exact, data = [], [], []
    references: dict[int, Reference] = {}            # one per M: the schedules differ only in accumulation order
    for schedule, work, runs in results:
        name, m = schedule.name, schedule.microbatches
        if m not in references:
            references[m] = reference(work, m)
        ref = references[m]
        accumulated = ref.accumulated(backward_orders(schedule), model_for(work))
        grads = {k: v for r in runs for k, v in r.grads.items()}
        names = sorted(ref.grads)
        gtol = gradient_tolerance(work, ref.bound)
        loss = runs[(schedule.virtual_stages - 1) % world_size].loss
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
                                 [pcosts.peak_activations_in_flight(name, world_size, m, schedule.chunks, rank=r)
                                  for r in range(world_size)], case=name)
        data.append(TrainResult(name, m, schedule.chunks, max_abs_error(loss, ref.loss),
                                max_abs_error([grads[k] for k in names], [ref.grads[k] for k in names]), gtol,
                                tuple(r.peak_held for r in runs)))
    return Report("pp-train", world_size, checks, exact, seconds,
                  {"plans": [f"{n} M={m} v={v}" for n, m, v in plans], "batch_size": "2M"}, tuple(data))


DEMOS = [Demo("pp-forward", "Forward pipeline (GPipe's forwards): output == one process, M(P-1) transfers",
              forward_demo, world_sizes=(1, 2, 4), chapter="05", max_world_size=MAX_STAGES),
         Demo("pp-train", "Pipeline training (GPipe, 1F1B, interleaved): loss and gradients == one process",
              train_demo, world_sizes=(1, 2, 4), chapter="05", max_world_size=MAX_STAGES)]
