"""Demos: the affine scan on N ranks equals the loop, and its ledger bytes depend on n and N, never on T.

scan-affine: diagonal and dense A at several state sizes, T = 37 (no N > 1
             divides it), both combines; every rank's bytes, messages and
             operations equal wmdist.costs.scan's formulas.
scan-bytes:  the same scheme over a sweep of T and of n: the measured bytes
             per rank match formulas in which T does not appear.

Both are `Experiment`s whose specs (AffineSpec, BytesSpec) build the seeded
systems and refuse a bad size before any process starts; every rank runs
affine_ranks.scan_rank on the spec's ScanSpec.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.course.compare import ROUNDOFF
from wmdist.costs.scan import (
    COMBINES,
    Combine,
    allgather_summary_bytes,
    chunked_ops,
    chunked_rank_ops,
    handoff_bytes,
    reassociation_bound,
    sequential_ops,
)
from wmdist.costs.validate import require_choice, require_int
from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, close_check, counts_per_rank, exact_check
from wmdist.scan.affine import sequential
from wmdist.scan.affine_ranks import AffineCase, ScanRank, ScanSpec, gather_states, scan_rank
from wmdist.scan.results import BytesRow, ByteSweep


def affine_tolerance(case: AffineCase, world_size: int) -> float:
    """Largest |ranks - loop| rounding can explain: reassociation_bound(depths) * max |h|_abs.

    Both are sums of the same products of A, b and h0 entries, grouped
    differently; the chunked schedule's longest chain of dependent operations
    is (L_0 - 1) + (N - 1) + L_(N-1), the loop's is T, and |h|_abs (the loop
    run on |A|, |b|, |h0| in float64) bounds every term's magnitude.
    """
    depth = chunked_ops(case.steps, world_size).depth
    factor = reassociation_bound(depth, sequential_ops(case.steps).depth, case.state_size, diagonal=case.diagonal,
                                 unit_roundoff=ROUNDOFF[case.b.dtype])
    magnitude = sequential(case.A.double().abs(), case.b.double().abs(), case.h0.double().abs()).max()
    return factor * float(magnitude)


def affine_agreement_checks(cases: tuple[AffineCase, ...], outcomes: list[ScanRank], world_size: int) -> list[Check]:
    """Per case: the ranks' all-gathered states vs the loop (to `affine_tolerance`), hand-off vs all-gather (exact)."""
    why = "a summary regroups the products: reassociation_bound(chunked depth, T) * max|h|_abs"
    checks: list[Check] = []
    for i, case in enumerate(cases):
        gathered = gather_states(outcomes, i, COMBINES.index("gathered"))
        handed = gather_states(outcomes, i, COMBINES.index("handoff"))
        checks.append(close_check(f"{case.label}: ranks == sequential loop", gathered,
                                  sequential(case.A, case.b, case.h0), affine_tolerance(case, world_size), why))
        checks.append(exact_check(f"{case.label}: hand-off == all-gather", handed, gathered,
                                  "both apply the same summaries to h0 in the same order"))
    return checks


def predicted_traffic(case: AffineCase, world_size: int, combine: Combine, rank: int) -> dict[str, int]:
    """bytes_sent, bytes_recv, messages the formulas give one rank for one case and combine."""
    require_choice("combine", combine, COMBINES)
    elem = case.b.element_size()
    if combine == "gathered":
        return allgather_summary_bytes(case.state_size, case.batch, world_size, diagonal=case.diagonal, elem_size=elem)
    return handoff_bytes(case.state_size, case.batch, world_size, rank, elem_size=elem)


def affine_traffic_counts(outcomes: list[ScanRank], cases: tuple[AffineCase, ...], world_size: int, *,
                   ops: bool) -> list[Count]:
    """Per case and combine: measured bytes and messages (and, with `ops`, composes/applies) vs the formulas."""
    rows = []
    for i, case in enumerate(cases):
        for j, combine in enumerate(COMBINES):
            got = [per_rank.outcomes[i][j] for per_rank in outcomes]
            want = [predicted_traffic(case, world_size, combine, r) for r in range(world_size)]
            label = f"{case.label}, {combine}"
            for quantity, key in (("bytes sent", "bytes_sent"), ("bytes received", "bytes_recv"),
                                  ("messages", "messages")):
                rows += counts_per_rank(quantity, [getattr(g, key) for g in got], [w[key] for w in want], case=label)
            if ops:
                formula = [chunked_rank_ops(case.steps, world_size, r, combine=combine) for r in range(world_size)]
                rows += counts_per_rank("composes", [g.composes for g in got], [f.composes for f in formula],
                                        case=label)
                rows += counts_per_rank("applies", [g.applies for g in got], [f.applies for f in formula],
                                        case=label)
    return rows


def affine_cases(*, steps: int = 37, batch: int = 2, state_sizes: tuple[int, ...] = (1, 4, 16), seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> list[AffineCase]:
    """Diagonal and dense systems at each state size (seeded, contracting)."""
    return [AffineCase.random(batch, steps, n, diagonal=diagonal, seed=seed + 10 * n + diagonal, dtype=dtype)
            for diagonal in (True, False) for n in state_sizes]


@dataclass(frozen=True, kw_only=True)
class AffineSpec:
    """scan-affine's inputs: diagonal and dense systems at each state size, validated for N ranks."""
    world_size: int
    steps: int = 37
    batch: int = 2
    state_sizes: tuple[int, ...] = (1, 4, 16)
    seed: int = 0
    scan: ScanSpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cases = affine_cases(steps=require_int("steps", self.steps, 1), batch=self.batch,
                             state_sizes=self.state_sizes, seed=self.seed)
        object.__setattr__(self, "scan", ScanSpec(world_size=self.world_size, cases=tuple(cases)))


def chunked_ranks(ctx: Context, spec: AffineSpec | BytesSpec) -> ScanRank:
    """Rank function of both demos: the chunked scan of every case with both combines."""
    return scan_rank(ctx, spec.scan)


def compare_affine(spec: AffineSpec, results: list[ScanRank]) -> Verdict:
    """States against the loop (reassociation bound), hand-off against all-gather (exact), counts vs formulas."""
    cases, n = spec.scan.cases, spec.world_size
    return Verdict(checks=affine_agreement_checks(cases, results, n),
                   exact=affine_traffic_counts(results, cases, n, ops=True),
                   params={"steps": spec.steps, "batch": spec.batch, "state_sizes": list(spec.state_sizes),
                           "dtype": "float32"})


AFFINE_DEMO = Experiment(name="scan-affine", chapter="07", world_sizes=(1, 2, 4, 8),
                         title="Affine recurrence over N ranks (all-gather and hand-off) vs the sequential loop",
                         spec=lambda n: AffineSpec(world_size=n), ranks=chunked_ranks, compare=compare_affine)


def affine_demo(world_size: int, *, steps: int = 37, batch: int = 2, state_sizes: tuple[int, ...] = (1, 4, 16),
                seed: int = 0) -> Report:
    """The time axis split over N ranks, both combines, against the loop in one process (float32)."""
    return AFFINE_DEMO.run_spec(AffineSpec(world_size=world_size, steps=steps, batch=batch,
                                           state_sizes=tuple(state_sizes), seed=seed))


@dataclass(frozen=True, kw_only=True)
class BytesSpec:
    """scan-bytes' sweep: T over `steps` at n = fixed_state_size, n over `state_sizes` at T = fixed_steps."""
    world_size: int
    steps: tuple[int, ...] = (8, 64, 512)
    state_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    batch: int = 2
    fixed_state_size: int = 4
    fixed_steps: int = 64
    seed: int = 0
    scan: ScanSpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for t in self.steps:
            require_int("steps", t, 1)
        configs = sorted({(t, self.fixed_state_size) for t in self.steps}
                         | {(self.fixed_steps, s) for s in self.state_sizes})
        cases = tuple(AffineCase.random(self.batch, t, s, diagonal=diagonal, seed=self.seed + t + s,
                                        dtype=torch.float32)
                      for t, s in configs for diagonal in (True, False))
        object.__setattr__(self, "scan", ScanSpec(world_size=self.world_size, cases=cases))


def compare_bytes(spec: BytesSpec, results: list[ScanRank]) -> Verdict:
    """Bytes and messages per rank vs the formulas; one sanity check of the states (scan-affine checks them all)."""
    cases, n = spec.scan.cases, spec.world_size
    rows = tuple(BytesRow(steps=c.steps, state_size=c.state_size, diagonal=c.diagonal, combine=combine,
                          sent_per_rank=tuple(per_rank.outcomes[i][j].bytes_sent for per_rank in results))
                 for i, c in enumerate(cases) for j, combine in enumerate(COMBINES))
    last = len(cases) - 1
    check = close_check(f"{cases[last].label}: ranks == sequential loop",
                        gather_states(results, last, COMBINES.index("gathered")),
                        sequential(cases[last].A, cases[last].b, cases[last].h0), affine_tolerance(cases[last], n),
                        "reassociation_bound(chunked depth, T) * max|h|_abs")
    return Verdict(checks=[check], exact=affine_traffic_counts(results, cases, n, ops=False),
                   params={"steps": list(spec.steps), "state_sizes": list(spec.state_sizes), "batch": spec.batch},
                   data=ByteSweep(world_size=n, batch=spec.batch, fixed_state_size=spec.fixed_state_size, fixed_steps=spec.fixed_steps, rows=rows))


BYTES_DEMO = Experiment(name="scan-bytes", chapter="07", world_sizes=(4,),
                        title="Ledger bytes of the chunked scan: set by state size and N, not by T",
                        spec=lambda n: BytesSpec(world_size=n), ranks=chunked_ranks, compare=compare_bytes)


def bytes_demo(world_size: int, *, steps: tuple[int, ...] = (8, 64, 512),
               state_sizes: tuple[int, ...] = (1, 2, 4, 8, 16), batch: int = 2, fixed_state_size: int = 4,
               fixed_steps: int = 64, seed: int = 0) -> Report:
    """Sweep T at n = fixed_state_size and n at T = fixed_steps, diagonal and dense: bytes vs formulas."""
    return BYTES_DEMO.run_spec(BytesSpec(world_size=world_size, steps=tuple(steps), state_sizes=tuple(state_sizes),
                                         batch=batch, fixed_state_size=fixed_state_size, fixed_steps=fixed_steps,
                                         seed=seed))


def spread_over_steps(report: Report) -> dict[str, int]:
    """Per A structure and combine: max - min over T of the bytes all ranks sent (0: T did not matter)."""
    data: ByteSweep = report.data
    out = {}
    for combine in COMBINES:
        for diagonal in (True, False):
            totals = [r.total for r in data.select(combine, diagonal=diagonal, over="steps")]
            out[f"{'diagonal' if diagonal else 'dense'}, {combine}"] = max(totals) - min(totals)
    return out


DEMOS = [AFFINE_DEMO, BYTES_DEMO]
