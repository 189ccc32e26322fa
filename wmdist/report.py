"""Reports: what a demo checked, what it measured, and what the formula predicted.

A demo runs a rank function on real processes and a single-device reference,
then returns one Report. Notebooks print it, tests assert `report.passed`,
`wmdist verify` tabulates many. Float comparisons carry a tolerance and the
reason for it; byte and message counts are compared exactly.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch


@dataclass(frozen=True)
class Check:
    """One comparison; `reason` says why that tolerance.

    Normally `error` must not exceed `tolerance`. A pitfall check sets
    `must_differ=True`: then the difference must be at least `tolerance`, i.e.
    larger than anything rounding could explain, so the wrong method is shown
    to be a different computation and not noise.
    """
    name: str
    error: float
    tolerance: float
    reason: str
    must_differ: bool = False

    @property
    def passed(self) -> bool:
        if self.must_differ:
            return not math.isnan(self.error) and self.error >= self.tolerance
        return math.isfinite(self.error) and self.error <= self.tolerance

    def describe(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        if self.must_differ:
            sign = ">=" if self.passed else "<"
            return f"{mark} {self.name}: differs by {self.error:.3g} {sign} {self.tolerance:.3g} ({self.reason})"
        sign = "<=" if self.passed else ">"
        return f"{mark} {self.name}: max abs error {self.error:.3g} {sign} {self.tolerance:.3g} ({self.reason})"


@dataclass(frozen=True)
class CommRow:
    """A ledger quantity of one rank, measured and predicted; they must be equal."""
    rank: int
    quantity: str
    measured: int
    predicted: int

    @property
    def passed(self) -> bool:
        return self.measured == self.predicted


@dataclass
class Report:
    """The outcome of one demo at one world size."""
    name: str
    world_size: int
    checks: list[Check] = field(default_factory=list)
    comm: list[CommRow] = field(default_factory=list)
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)   # timelines etc. for plots; not in JSON

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and all(r.passed for r in self.comm)

    @property
    def failures(self) -> list[str]:
        out = [c.describe()[5:] for c in self.checks if not c.passed]
        out += [f"rank {r.rank} {r.quantity}: measured {r.measured} != predicted {r.predicted}"
                for r in self.comm if not r.passed]
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d["passed"] = self.passed
        return d

    def __str__(self) -> str:
        lines = [f"{self.name} on {self.world_size} rank(s): {'PASS' if self.passed else 'FAIL'}"]
        lines += [f"  {c.describe()}" for c in self.checks]
        for q in sorted({r.quantity for r in self.comm}):
            rows = [r for r in self.comm if r.quantity == q]
            ok = all(r.passed for r in rows)
            lines.append(f"  {'ok  ' if ok else 'FAIL'} {q} per rank: measured {[r.measured for r in rows]}"
                         f", predicted {[r.predicted for r in rows]}")
        return "\n".join(lines)


def max_abs_error(got: Any, expected: Any) -> float:
    """Largest |got - expected| over tensors, or sequences of tensors/numbers."""
    if isinstance(got, (list, tuple)):
        if len(got) != len(expected):
            return math.inf
        return max((max_abs_error(g, e) for g, e in zip(got, expected)), default=0.0)
    g, e = torch.as_tensor(got), torch.as_tensor(expected)
    if g.shape != e.shape:
        return math.inf
    if g.numel() == 0:
        return 0.0
    return float((g.double() - e.double()).abs().max())


def close_check(name: str, got: Any, expected: Any, tolerance: float, reason: str) -> Check:
    """Check that got matches expected within `tolerance` (say why in `reason`)."""
    return Check(name, max_abs_error(got, expected), tolerance, reason)


def exact_check(name: str, got: Any, expected: Any,
                reason: str = "same operations in the same order: bitwise equal") -> Check:
    """Check bitwise equality (tolerance 0)."""
    return Check(name, max_abs_error(got, expected), 0.0, reason)


def differ_check(name: str, got: Any, expected: Any, at_least: float, reason: str) -> Check:
    """Check that got and expected DIFFER by at least `at_least` (a pitfall made visible)."""
    return Check(name, max_abs_error(got, expected), at_least, reason, must_differ=True)


def comm_rows(quantity: str, measured: Sequence[int], predicted: Sequence[int]) -> list[CommRow]:
    """One CommRow per rank for a ledger quantity."""
    return [CommRow(r, quantity, int(m), int(p)) for r, (m, p) in enumerate(zip(measured, predicted, strict=True))]


@dataclass(frozen=True)
class Demo:
    """A registered experiment: `run(world_size)` returns a Report.

    `world_sizes` are the sizes `wmdist verify` runs by default; `min_world_size`
    is the smallest it makes sense at (a demo comparing ranks needs two).
    """
    name: str
    title: str
    run: Callable[[int], Report]
    world_sizes: tuple[int, ...] = (2, 4)
    chapter: str = "00"
    min_world_size: int = 1


def format_table(reports: Iterable[Report], seconds: bool = True) -> str:
    """Plain-text table of reports, one row per (demo, world size).

    `seconds=False` leaves out the timing column, for output that must be
    identical from run to run (notebook cells checked by nbval).
    """
    rows = [("demo", "N", "checks", "exact counts", "seconds", "result")]
    for r in reports:
        checks = f"{sum(c.passed for c in r.checks)}/{len(r.checks)}"
        comm = f"{sum(c.passed for c in r.comm)}/{len(r.comm)}" if r.comm else "-"
        rows.append((r.name, str(r.world_size), checks, comm, f"{r.seconds:.2f}", "PASS" if r.passed else "FAIL"))
    if not seconds:
        rows = [row[:4] + row[5:] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def to_json(reports: Iterable[Report]) -> str:
    return json.dumps([r.to_dict() for r in reports], indent=2)
