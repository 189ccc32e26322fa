"""Timelines as data: spans of work per row, and how much of one kind hides under another.

Pure Python (no torch): the bucketing demo measures spans on ranks, the
pipeline chapter builds them from a schedule, and both use the same overlap
arithmetic and the same plot (wmdist.ui.timeline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


@dataclass(kw_only=True, frozen=True)
class Span:
    """One interval of work on one row (a rank, a stage): [start, end) in seconds."""
    row: int
    start: float
    end: float
    kind: str            # e.g. "compute", "comm"
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.row, bool) or not isinstance(self.row, int) or self.row < 0:
            raise ValueError(f"row must be an integer >= 0, got {self.row!r}")
        for name in ("start", "end"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.end < self.start:
            raise ValueError(f"span {self.label!r} ends ({self.end}) before it starts ({self.start})")

    @property
    def duration(self) -> float:
        return self.end - self.start


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping or touching intervals into disjoint sorted ones."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of `intervals`."""
    return sum(e - s for s, e in union(intervals))


def intersection(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Length of (union of a) intersected with (union of b)."""
    ua, ub = union(a), union(b)
    total, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Overlap:
    """How much of one row's communication ran while it was computing."""
    row: int
    comm: float          # seconds some communication was in flight (union of comm spans)
    hidden: float        # of those, seconds during which compute also ran
    compute: float       # seconds of compute (union)

    @property
    def exposed(self) -> float:
        return self.comm - self.hidden

    @property
    def hidden_fraction(self) -> float:
        return self.hidden / self.comm if self.comm > 0 else 0.0


def overlap(spans: Iterable[Span]) -> list[Overlap]:
    """Per row: communication time (spans of kind "comm"), and the part of it that overlapped "compute"."""
    spans = list(spans)
    out = []
    for row in sorted({s.row for s in spans}):
        comm = [(s.start, s.end) for s in spans if s.row == row and s.kind == "comm"]
        comp = [(s.start, s.end) for s in spans if s.row == row and s.kind == "compute"]
        out.append(Overlap(row, length(comm), intersection(comm, comp), length(comp)))
    return out
