"""Reports: what a demo checked, what it counted, and what the formula predicted.

A demo runs a rank function on real processes and a single-device reference,
then returns one Report. Notebooks print it or look rows up by key, tests
assert `report.passed`, `wmdist verify` tabulates many. Float comparisons
carry a tolerance and the reason for it; integers (bytes sent, messages,
bytes held) are compared exactly.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable, Sequence

import torch

from wmdist.course.report_html import checks_html, counts_html


@dataclass(kw_only=True, frozen=True)
class Check:
    """One float comparison; `reason` says why that tolerance.

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
    detail: str = ""          # where the error was largest ("fc1.weight on rank 2"): shown, never part of the name
    fact: bool = False        # a yes/no statement (fact_check): error 0 when it holds, 1 when it does not

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a check needs a name")

    @property
    def finite(self) -> bool:
        """Both the error and the tolerance are finite numbers: only then can the check pass."""
        return math.isfinite(self.error) and math.isfinite(self.tolerance)

    @property
    def passed(self) -> bool:
        if not self.finite:
            return False
        return self.error >= self.tolerance if self.must_differ else self.error <= self.tolerance

    def describe(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        if self.fact:
            return f"{mark} {self.name}: {'holds' if self.passed else 'does NOT hold'} ({self.reason})"
        if not self.finite:
            return (f"{mark} {self.name}: not finite: error {self.error:.3g}, tolerance {self.tolerance:.3g} (a NaN or "
                    f"inf in a result, its reference or its tolerance, or shapes that differ) ({self.reason})")
        where = f" [worst: {self.detail}]" if self.detail else ""
        sign = (">=" if self.passed else "<") if self.must_differ else ("<=" if self.passed else ">")
        what = "differs by" if self.must_differ else "max abs error"
        return f"{mark} {self.name}: {what} {self.error:.3g} {sign} {self.tolerance:.3g}{where} ({self.reason})"

    def line(self) -> str:
        """One line that is the same on every machine while the check passes (for notebooks' checked outputs).

        A passing check says how it passed, not by how much: "bit for bit" (an exact check, tolerance
        0), "within its tolerance", or "differs by at least T" (T to 2 digits). A check with room for
        rounding says "within" even when its error happens to be 0 here: on another machine's kernels
        it may not be. A failing one gives the whole `describe()`: there the numbers are the point.
        """
        if not self.passed:
            return self.describe()
        if self.fact:
            how = "holds"
        elif self.must_differ:
            how = f"differs by at least {self.tolerance:.2g}"
        else:
            how = "bit for bit" if self.tolerance == 0 else "within its tolerance"
        return f"PASS {self.name}: {how}"

    __str__ = describe


@dataclass(kw_only=True, frozen=True)
class Count:
    """An exact integer one rank produced (bytes sent, rounds, bytes held), and the formula's; they must be equal.

    `quantity` says what is counted; `phase`, `step` and `case` (a variant of
    the demo, e.g. "1 bucket" or "stage 2") locate it, so a notebook can ask
    `report.counts(quantity="bytes sent", step=0)` instead of parsing labels.
    """
    quantity: str
    rank: int
    measured: int
    predicted: int
    phase: str | None = None
    step: int | None = None
    case: str | None = None

    @property
    def passed(self) -> bool:
        return self.measured == self.predicted

    @property
    def label(self) -> str:
        """The quantity with its keys, e.g. "bytes sent [phase gradient reduce-scatter, step 2]"."""
        keys = [f"{k} {v}" for k, v in (("case", self.case), ("phase", self.phase), ("step", self.step))
                if v is not None]
        return self.quantity + (f" [{', '.join(keys)}]" if keys else "")


KEYS = ("quantity", "rank", "phase", "step", "case")


def counts_per_rank(quantity: str, measured: Sequence[int], predicted: Sequence[int], **keys: Any) -> list[Count]:
    """One Count per rank (rank = position) for a quantity; `keys` are phase/step/case."""
    return [Count(quantity=quantity, rank=r, measured=int(m), predicted=int(p), **keys)
            for r, (m, p) in enumerate(zip(measured, predicted, strict=True))]


@dataclass(kw_only=True)
class Report:
    """The outcome of one demo at one world size.

    `data` holds the demo's own typed results for plots and text (a frozen
    dataclass such as timelines or estimator statistics); it is not part of
    the JSON form. `error` says why the demo broke while running (it then
    fails, whatever its rows say); None when it ran to the end.
    """
    name: str
    world_size: int
    checks: list[Check] = field(default_factory=list)
    exact: list[Count] = field(default_factory=list)
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    data: Any = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks) and all(c.passed for c in self.exact)

    @property
    def failures(self) -> list[str]:
        out = [f"broke while running: {self.error}"] if self.error is not None else []
        out += [c.describe()[5:] for c in self.checks if not c.passed]
        out += [f"rank {c.rank} {c.label}: measured {c.measured} != predicted {c.predicted}"
                for c in self.exact if not c.passed]
        return out

    def counts(self, **keys: Any) -> list[Count]:
        """The exact counts whose fields equal every given key (quantity, rank, phase, step, case), rank order."""
        unknown = set(keys) - set(KEYS)
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}; counts are keyed by {KEYS}")
        rows = [c for c in self.exact if all(getattr(c, k) == v for k, v in keys.items())]
        return sorted(rows, key=lambda c: c.rank)

    def measured(self, **keys: Any) -> list[int]:
        """Measured values of counts(**keys), in rank order."""
        return [c.measured for c in self.counts(**keys)]

    def predicted(self, **keys: Any) -> list[int]:
        """Predicted values of counts(**keys), in rank order."""
        return [c.predicted for c in self.counts(**keys)]

    def check(self, name: str) -> Check:
        """The check called `name` (KeyError listing the names if there is none)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {[c.name for c in self.checks]}")

    def groups(self) -> list[tuple[tuple, list[Count]]]:
        """Counts grouped by (quantity, phase, step, case), in first-seen order."""
        out: dict[tuple, list[Count]] = {}
        for c in self.exact:
            out.setdefault((c.quantity, c.phase, c.step, c.case), []).append(c)
        return list(out.items())

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}
        d["checks"] = [asdict(c) for c in self.checks]
        d["exact"] = [asdict(c) for c in self.exact]
        d["passed"] = self.passed
        return d

    def __repr__(self) -> str:
        """One line (a notebook's plain-text view; str() and the HTML table give the rows)."""
        ok = sum(c.passed for c in self.checks), sum(c.passed for c in self.exact)
        return (f"<Report {self.name} on {self.world_size} rank(s): {'PASS' if self.passed else 'FAIL'}, "
                f"{ok[0]}/{len(self.checks)} checks, {ok[1]}/{len(self.exact)} exact counts>")

    def __str__(self) -> str:
        lines = [f"{self.name} on {self.world_size} rank(s): {'PASS' if self.passed else 'FAIL'}"]
        lines += [f"  FAIL broke while running: {self.error}"] if self.error is not None else []
        lines += [f"  {c.describe()}" for c in self.checks]
        for _, rows in self.groups():
            ok = all(r.passed for r in rows)
            lines.append(f"  {'ok  ' if ok else 'FAIL'} {rows[0].label} per rank: measured {[r.measured for r in rows]}"
                         f", predicted {[r.predicted for r in rows]}")
        return "\n".join(lines)

    def listing(self, *, only: Callable[[Check], bool] | None = None, counts: bool = False) -> str:
        """The checks (those `only` keeps), a `Check.line` each, in order: what a notebook prints.

        Deterministic while everything passes, so a checked cell can show it. With `counts`, one
        line per group of exact counts follows ("equal their formula on every rank", or the rows).
        A demo that broke says so first.
        """
        lines = [f"FAIL {self.name} broke while running: {self.error}"] if self.error is not None else []
        lines += [c.line() for c in self.checks if only is None or only(c)]
        if counts:
            for _, rows in self.groups():
                if all(r.passed for r in rows):
                    lines.append(f"PASS {rows[0].label}: equal to its formula on every rank")
                else:
                    lines.append(f"FAIL {rows[0].label}: measured {[r.measured for r in rows]}, "
                                 f"predicted {[r.predicted for r in rows]}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        verdict = "<b style='color:#080'>PASS</b>" if self.passed else "<b style='color:#b00'>FAIL</b>"
        out = [f"<p><b>{esc(self.name)}</b> on {self.world_size} rank(s): {verdict}</p>"]
        if self.error is not None:
            out.append(f"<p>broke while running: {esc(self.error)}</p>")
        if self.checks:
            out.append(checks_html(self.checks))        # report_html: grouped by reason, long groups folded
        if self.exact:
            out.append(counts_html([g for _, g in self.groups()]))
        return "\n".join(out)


def max_abs_error(got: Any, expected: Any) -> float:
    """Largest |got - expected| over tensors, or sequences of tensors/numbers.

    NaN when any element on either side is NaN or inf (Check then fails and
    says "not finite"), inf when shapes or lengths differ.
    """
    if isinstance(got, (list, tuple)):
        if not isinstance(expected, (list, tuple)) or len(got) != len(expected):
            return math.inf
        errors = [max_abs_error(g, e) for g, e in zip(got, expected)]
        return math.nan if any(math.isnan(x) for x in errors) else max(errors, default=0.0)
    g, e = torch.as_tensor(got).double(), torch.as_tensor(expected).double()
    if g.shape != e.shape:
        return math.inf
    if not (bool(torch.isfinite(g).all()) and bool(torch.isfinite(e).all())):
        return math.nan
    return float((g - e).abs().max()) if g.numel() else 0.0


def close_check(name: str, got: Any, expected: Any, tolerance: float, reason: str) -> Check:
    """Check that got matches expected within `tolerance` (say why in `reason`)."""
    return Check(name=name, error=max_abs_error(got, expected), tolerance=tolerance, reason=reason)


def exact_check(name: str, got: Any, expected: Any,
                reason: str = "same operations in the same order: bitwise equal") -> Check:
    """Check bitwise equality (tolerance 0)."""
    return Check(name=name, error=max_abs_error(got, expected), tolerance=0.0, reason=reason)


def fact_check(name: str, *, holds: bool, reason: str) -> Check:
    """A yes/no statement the demo checks (the save failed, LATEST names step 2, a count equals its value)."""
    return Check(name=name, error=0.0 if holds else 1.0, tolerance=0.0, reason=reason, fact=True)


def differ_check(name: str, got: Any, expected: Any, at_least: float, reason: str) -> Check:
    """Check that got and expected DIFFER by at least `at_least` (a pitfall made visible)."""
    return Check(name=name, error=max_abs_error(got, expected), tolerance=at_least, reason=reason, must_differ=True)


def format_table(reports: Iterable[Report], *, seconds: bool = True) -> str:
    """Plain-text table of reports, one row per (demo, world size).

    `seconds=False` leaves out the timing column, for output that must be
    identical from run to run (notebook cells checked by nbval).
    """
    rows = [("demo", "N", "checks", "exact counts", "seconds", "result")]
    for r in reports:
        checks = f"{sum(c.passed for c in r.checks)}/{len(r.checks)}"
        exact = f"{sum(c.passed for c in r.exact)}/{len(r.exact)}" if r.exact else "-"
        rows.append((r.name, str(r.world_size), checks, exact, f"{r.seconds:.2f}", "PASS" if r.passed else "FAIL"))
    if not seconds:
        rows = [row[:4] + row[5:] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def to_json(reports: Iterable[Report]) -> str:
    return json.dumps([r.to_dict() for r in reports], indent=2)
