"""Demos: the affine scan on N ranks equals the loop, and its ledger bytes depend on n and N, never on T.

scan-affine: diagonal and dense A at several state sizes, T = 37 (no N > 1
             divides it), both combines; every rank's bytes, messages and
             operations equal wmdist.costs.scan's formulas.
scan-bytes:  the same scheme over a sweep of T and of n: the measured bytes
             per rank match formulas in which T does not appear.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wmdist.compare import ROUNDOFF
from wmdist.costs.scan import (
    COMBINES,
    allgather_summary_bytes,
    chunked_ops,
    chunked_rank_ops,
    handoff_bytes,
    reassociation_bound,
    sequential_ops,
)
from wmdist.costs.validate import require_int
from wmdist.report import Check, Count, Demo, Report, close_check, counts_per_rank, exact_check
from wmdist.scan.affine import sequential
from wmdist.scan.affine_ranks import AffineCase, RankOutcome, gather_states, scan_cases, validate


def tolerance(case: AffineCase, world_size: int) -> float:
    """Largest |ranks - loop| rounding can explain: reassociation_bound(depths) * max |h|_abs.

    Both are sums of the same products of A, b and h0 entries, grouped
    differently; the chunked schedule's longest chain of dependent operations
    is (L_0 - 1) + (N - 1) + L_(N-1), the loop's is T, and |h|_abs (the loop
    run on |A|, |b|, |h0| in float64) bounds every term's magnitude.
    """
    depth = chunked_ops(case.steps, world_size).depth
    factor = reassociation_bound(depth, sequential_ops(case.steps).depth, case.state_size, case.diagonal,
                                 ROUNDOFF[case.b.dtype])
    magnitude = sequential(case.A.double().abs(), case.b.double().abs(), case.h0.double().abs()).max()
    return factor * float(magnitude)


def agreement_checks(cases: list[AffineCase], outcomes: list[list[list[RankOutcome]]], world_size: int) -> list[Check]:
    """Per case: the ranks' all-gathered states against the loop (to `tolerance`), hand-off against all-gather (exact)."""
    why = "a summary regroups the products: reassociation_bound(chunked depth, T) * max|h|_abs"
    checks: list[Check] = []
    for i, case in enumerate(cases):
        gathered = gather_states(outcomes, i, COMBINES.index("gathered"))
        handed = gather_states(outcomes, i, COMBINES.index("handoff"))
        checks.append(close_check(f"{case.label}: ranks == sequential loop", gathered,
                                  sequential(case.A, case.b, case.h0), tolerance(case, world_size), why))
        checks.append(exact_check(f"{case.label}: hand-off == all-gather", handed, gathered,
                                  "both apply the same summaries to h0 in the same order"))
    return checks


def predicted_traffic(case: AffineCase, world_size: int, combine: str, rank: int) -> dict[str, int]:
    """bytes_sent, bytes_recv, messages the formulas give one rank for one case and combine."""
    elem = case.b.element_size()
    if combine == "gathered":
        return allgather_summary_bytes(case.state_size, case.batch, world_size, case.diagonal, elem)
    return handoff_bytes(case.state_size, case.batch, world_size, rank, elem)


def traffic_counts(outcomes: list[list[list[RankOutcome]]], cases: list[AffineCase], world_size: int,
                   ops: bool) -> list[Count]:
    """Per case and combine: measured bytes and messages (and, with `ops`, composes/applies) vs the formulas."""
    rows = []
    for i, case in enumerate(cases):
        for j, combine in enumerate(COMBINES):
            got = [per_rank[i][j] for per_rank in outcomes]
            want = [predicted_traffic(case, world_size, combine, r) for r in range(world_size)]
            label = f"{case.label}, {combine}"
            for quantity, key in (("bytes sent", "bytes_sent"), ("bytes received", "bytes_recv"),
                                  ("messages", "messages")):
                rows += counts_per_rank(quantity, [getattr(g, key) for g in got], [w[key] for w in want], case=label)
            if ops:
                formula = [chunked_rank_ops(case.steps, world_size, r, combine) for r in range(world_size)]
                rows += counts_per_rank("composes", [g.composes for g in got], [f.composes for f in formula],
                                        case=label)
                rows += counts_per_rank("applies", [g.applies for g in got], [f.applies for f in formula],
                                        case=label)
    return rows


def affine_cases(steps: int = 37, batch: int = 2, state_sizes: tuple[int, ...] = (1, 4, 16), seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> list[AffineCase]:
    """Diagonal and dense systems at each state size (seeded, contracting)."""
    return [AffineCase.random(batch, steps, n, diagonal, seed=seed + 10 * n + diagonal, dtype=dtype)
            for diagonal in (True, False) for n in state_sizes]


def affine_demo(world_size: int, steps: int = 37, batch: int = 2, state_sizes: tuple[int, ...] = (1, 4, 16),
                seed: int = 0) -> Report:
    """The time axis split over N ranks, both combines, against the loop in one process (float32)."""
    cases = affine_cases(require_int("steps", steps, 1), batch, state_sizes, seed)
    n = validate(world_size, cases)
    start = time.perf_counter()
    outcomes = scan_cases(n, cases)
    seconds = time.perf_counter() - start
    checks = agreement_checks(cases, outcomes, n)
    exact = traffic_counts(outcomes, cases, n, ops=True)
    return Report("scan-affine", n, checks, exact, seconds,
                  {"steps": steps, "batch": batch, "state_sizes": list(state_sizes), "dtype": "float32"})


@dataclass(frozen=True)
class BytesRow:
    """Measured bytes one configuration sent, per rank (sum over ranks in `total`)."""
    steps: int
    state_size: int
    diagonal: bool
    combine: str
    sent_per_rank: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sent_per_rank)


@dataclass(frozen=True)
class ByteSweep:
    """Ledger bytes of the chunked scan over a sweep of T (at one n) and of n (at one T)."""
    world_size: int
    batch: int
    fixed_state_size: int     # n in the sweep over T
    fixed_steps: int          # T in the sweep over n
    rows: tuple[BytesRow, ...]

    def select(self, combine: str, diagonal: bool, over: str) -> list[BytesRow]:
        """Rows of one combine and A structure, sweeping `over` = "steps" or "state_size" (the other fixed)."""
        if over == "steps":
            keep = [r for r in self.rows if r.state_size == self.fixed_state_size]
        else:
            keep = [r for r in self.rows if r.steps == self.fixed_steps]
        keep = [r for r in keep if r.combine == combine and r.diagonal == diagonal]
        return sorted({getattr(r, over): r for r in keep}.values(), key=lambda r: getattr(r, over))


def bytes_demo(world_size: int, steps: tuple[int, ...] = (8, 64, 512), state_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
               batch: int = 2, fixed_state_size: int = 4, fixed_steps: int = 64, seed: int = 0) -> Report:
    """Sweep T at n = fixed_state_size and n at T = fixed_steps, diagonal and dense: bytes vs formulas."""
    for t in steps:
        require_int("steps", t, 1)
    configs = sorted({(t, fixed_state_size) for t in steps} | {(fixed_steps, s) for s in state_sizes})
    cases = [AffineCase.random(batch, t, s, diagonal, seed=seed + t + s, dtype=torch.float32)
             for t, s in configs for diagonal in (True, False)]
    n = validate(world_size, cases)
    start = time.perf_counter()
    outcomes = scan_cases(n, cases)
    seconds = time.perf_counter() - start
    rows = tuple(BytesRow(c.steps, c.state_size, c.diagonal, combine,
                          tuple(per_rank[i][j].bytes_sent for per_rank in outcomes))
                 for i, c in enumerate(cases) for j, combine in enumerate(COMBINES))
    # The states are checked in scan-affine; here one sanity check that the sweep computed the right thing.
    last = len(cases) - 1
    check = close_check(f"{cases[last].label}: ranks == sequential loop",
                        gather_states(outcomes, last, COMBINES.index("gathered")),
                        sequential(cases[last].A, cases[last].b, cases[last].h0), tolerance(cases[last], n),
                        "reassociation_bound(chunked depth, T) * max|h|_abs")
    data = ByteSweep(n, batch, fixed_state_size, fixed_steps, rows)
    return Report("scan-bytes", n, [check], traffic_counts(outcomes, cases, n, ops=False), seconds,
                  {"steps": list(steps), "state_sizes": list(state_sizes), "batch": batch}, data)


def spread_over_steps(report: Report) -> dict[str, int]:
    """Per A structure and combine: max - min over T of the bytes all ranks sent (0: T did not matter)."""
    data: ByteSweep = report.data
    out = {}
    for combine in COMBINES:
        for diagonal in (True, False):
            totals = [r.total for r in data.select(combine, diagonal, "steps")]
            out[f"{'diagonal' if diagonal else 'dense'}, {combine}"] = max(totals) - min(totals)
    return out


DEMOS = [Demo("scan-affine", "Affine recurrence over N ranks (all-gather and hand-off) vs the sequential loop",
              affine_demo, world_sizes=(1, 2, 4, 8), chapter="07"),
         Demo("scan-bytes", "Ledger bytes of the chunked scan: set by state size and N, not by T",
              bytes_demo, world_sizes=(4,), chapter="07")]
