"""Demo: in one process, the log-depth scans equal the loop; their operation counts equal the formulas.

Three groupings of the same affine recurrence against the sequential loop:
the Hillis-Steele scan (affine.associative_scan), torch's prototype
associative_scan (generic mode: a work-efficient odd/even scan), and the
chunked scheme with N chunks (what N ranks do, here in one process). Each is
checked within the reassociation bound, and the operations each performs
(counted while it runs) equal wmdist.costs.scan's formulas. Wall times are
measured separately (`measure_times`), for plots only: a scan pays in depth,
never in total work.

The demo is an `Experiment` that runs in this process (`local`, no rank
starts): its spec, OneProcessSpec, seeds the systems and refuses N > T before
anything runs; `scan_groupings` computes and counts, `compare_scans` runs the
reference loop and judges.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from wmdist.course.compare import ROUNDOFF
from wmdist.costs.scan import (
    OpCount,
    blelloch_ops,
    chunked_ops,
    hillis_steele_ops,
    reassociation_bound,
    sequential_ops,
    time_chunk_sizes,
)
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, close_check
from wmdist.scan.affine import Tally, associative_scan, chunked, compose, sequential, time_scans, torch_associative_scan
from wmdist.scan.affine_ranks import AffineCase
from wmdist.scan.results import ScanTimes


def torch_scan_ops(steps: int) -> OpCount:
    """Count what torch's generic associative_scan does on T maps: composes, and its levels (+ 1 for the applies).

    Runs torch's own generic_associative_scan with a combine that notes how
    many maps each call composes (each call composes its slice in parallel).
    """
    from torch._higher_order_ops.associative_scan import generic_associative_scan  # private: imported here only

    t = require_int("steps", steps, 1)
    sizes: list[int] = []

    def counting(a1: torch.Tensor, b1: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor) -> list[torch.Tensor]:
        if b1.shape[0]:                                   # torch also calls it on empty slices: no work
            sizes.append(b1.shape[0])
        return list(compose((a1, b1), (a2, b2)))

    generic_associative_scan(counting, [torch.rand(t, 1, 2), torch.rand(t, 1, 2)])   # diagonal maps, n = 2
    return OpCount(composes=sum(sizes), applies=t, depth=len(sizes) + 1)


def _count_rows(label: str, measured: OpCount, predicted: OpCount,
                quantities: tuple[str, ...] = ("composes", "applies", "depth")) -> list[Count]:
    return [Count(quantity=q, rank=0, measured=getattr(measured, q), predicted=getattr(predicted, q), case=label) for q in quantities]


@dataclass(frozen=True, kw_only=True)
class OneProcessSpec:
    """scan-one-process's inputs: seeded diagonal and dense systems (float32), cut into N = world_size chunks.

    No process starts: `world_size` is the number of chunks the chunked scheme uses in this
    process. Refuses T < 1 and N > T (every chunk needs a step) when built.
    """
    world_size: int
    steps: int = 37
    state_size: int = 4
    batch: int = 2
    seed: int = 0
    cases: tuple[AffineCase, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        t = require_int("steps", self.steps, 1)
        n = require_int("world_size", self.world_size, 1)
        time_chunk_sizes(t, n)                                            # N <= T, or a clear ValueError
        object.__setattr__(self, "cases", tuple(
            AffineCase.random(self.batch, t, self.state_size, diagonal=diagonal, seed=self.seed + diagonal)
            for diagonal in (True, False)))


@dataclass(frozen=True)
class Grouping:
    """One grouping's states (B, T, n) for one case, and what its Tally counted while it ran (None: not counted)."""
    name: str
    states: torch.Tensor
    tally: Tally | None


@dataclass(frozen=True)
class ScanRuns:
    """What the groupings computed in this process: per case, Hillis-Steele, torch's scan and the chunked
    scheme (torch's counts are taken by `torch_scan_ops` once: they do not depend on A's structure)."""
    groupings: tuple[tuple[Grouping, ...], ...]
    torch_ops: OpCount


def _run(name: str, scan: Callable[..., torch.Tensor], case: AffineCase, **options: Any) -> Grouping:
    tally = Tally()
    return Grouping(name, scan(case.A, case.b, case.h0, tally=tally, **options), tally)


def scan_groupings(spec: OneProcessSpec) -> ScanRuns:
    """The demo's `local` part: every case through Hillis-Steele, torch's associative_scan and N chunks."""
    n = spec.world_size
    groupings = []
    for case in spec.cases:
        theirs = torch_associative_scan(case.A, case.b, case.h0)         # counted by torch_scan_ops, not a Tally
        groupings.append((_run("hillis-steele", associative_scan, case),
                          Grouping("torch associative_scan", theirs, None),
                          _run(f"chunked, {n} chunks", chunked, case, chunks=n, combine="handoff")))
    return ScanRuns(tuple(groupings), torch_scan_ops(spec.steps))


def compare_scans(spec: OneProcessSpec, results: list[ScanRuns]) -> Verdict:
    """Each grouping against the loop within the reassociation bound; the counts (loop included) vs the formulas."""
    (runs,) = results
    t, n = spec.steps, spec.world_size
    depth_seq = sequential_ops(t).depth
    formulas = {"hillis-steele": hillis_steele_ops(t), "torch associative_scan": blelloch_ops(t),
                f"chunked, {n} chunks": chunked_ops(t, n)}
    checks: list[Check] = []
    exact: list[Count] = []
    for case, groupings in zip(spec.cases, runs.groupings):
        A, b, h0 = case.A, case.b, case.h0
        magnitude = float(sequential(A.double().abs(), b.double().abs(), h0.double().abs()).max())
        loop_tally = Tally()
        ref = sequential(A, b, h0, tally=loop_tally)
        for g in groupings:
            ops = formulas[g.name]
            tol = reassociation_bound(ops.depth, depth_seq, case.state_size, diagonal=case.diagonal,
                                      unit_roundoff=ROUNDOFF[b.dtype]) * magnitude
            checks.append(close_check(f"{case.label}: {g.name} == loop", g.states, ref, tol,
                                      f"regrouped products: reassociation_bound(depth {ops.depth}, T) * max|h|_abs"))
        if case.diagonal:                                 # the counts do not depend on A's structure: count once
            hs, _, ch = groupings
            assert hs.tally is not None and ch.tally is not None
            for name, tally, ops in (("loop", loop_tally, sequential_ops(t)), (hs.name, hs.tally, formulas[hs.name])):
                exact += _count_rows(name, OpCount(tally.composes, tally.applies, tally.calls), ops)
            exact += _count_rows("torch associative_scan", runs.torch_ops, blelloch_ops(t), ("composes", "depth"))
            exact += [Count(quantity=q, rank=0, measured=getattr(ch.tally, q), predicted=getattr(formulas[ch.name], q), case=ch.name)
                      for q in ("composes", "applies")]
    return Verdict(checks=checks, exact=exact,
                   params={"steps": t, "state_size": spec.state_size, "batch": spec.batch, "chunks": n})


SCAN_DEMO = Experiment(name="scan-one-process", chapter="07", world_sizes=(1, 4),
                       title="One process: Hillis-Steele, torch's associative_scan and N chunks vs the loop",
                       spec=lambda n: OneProcessSpec(world_size=n), local=scan_groupings, compare=compare_scans)


def scan_demo(world_size: int, *, steps: int = 37, state_size: int = 4, batch: int = 2, seed: int = 0) -> Report:
    """One process, N = world_size chunks: Hillis-Steele, torch's scan and the chunked scheme vs the loop.

    float32, diagonal and dense A. Starts no process (the Experiment's `local`); counts are rank 0's.
    """
    return SCAN_DEMO.run_spec(OneProcessSpec(world_size=world_size, steps=steps, state_size=state_size, batch=batch,
                                             seed=seed))


def measure_times(*, steps: tuple[int, ...] = (16, 64, 256, 1024), state_size: int = 8, diagonal: bool = True,
                  batch: int = 4, repeats: int = 3) -> ScanTimes:
    """Time the three in this process (affine.time_scans); timings vary by machine and load: never asserted."""
    rows = time_scans(steps=steps, state_size=state_size, batch=batch, diagonal=diagonal, repeats=repeats)
    loop, scan, theirs = ([r[key] for r in rows] for key in ("sequential_s", "hillis_steele_s", "torch_scan_s"))
    return ScanTimes(state_size=state_size, diagonal=diagonal, steps=tuple(int(r["steps"]) for r in rows), loop_s=tuple(loop), hillis_steele_s=tuple(scan),
                     torch_scan_s=tuple(theirs))


DEMOS = [SCAN_DEMO]
