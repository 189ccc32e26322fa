"""What chapter 07's demos measured, as plain records: the data figures and notebooks read.

Kept apart from the demos that fill them, so a figure imports these and never a runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmdist.costs.scan import COMBINES, Combine
from wmdist.costs.validate import require_choice
from wmdist.base.spans import Span

Sweep = Literal["steps", "state_size"]     # what a ByteSweep row list runs over
SWEEPS: tuple[Sweep, ...] = ("steps", "state_size")


@dataclass(kw_only=True, frozen=True)
class BytesRow:
    """Measured bytes one configuration sent, per rank (sum over ranks in `total`)."""
    steps: int
    state_size: int
    diagonal: bool
    combine: Combine
    sent_per_rank: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sent_per_rank)


@dataclass(kw_only=True, frozen=True)
class ByteSweep:
    """Ledger bytes of the chunked scan over a sweep of T (at one n) and of n (at one T)."""
    world_size: int
    batch: int
    fixed_state_size: int     # n in the sweep over T
    fixed_steps: int          # T in the sweep over n
    rows: tuple[BytesRow, ...]

    def select(self, combine: Combine, *, diagonal: bool, over: Sweep) -> list[BytesRow]:
        """Rows of one combine and A structure, sweeping `over` = "steps" or "state_size" (the other fixed)."""
        require_choice("combine", combine, COMBINES)
        if require_choice("over", over, SWEEPS) == "steps":
            keep = [r for r in self.rows if r.state_size == self.fixed_state_size]
        else:
            keep = [r for r in self.rows if r.steps == self.fixed_steps]
        keep = [r for r in keep if r.combine == combine and r.diagonal == diagonal]
        return sorted({getattr(r, over): r for r in keep}.values(), key=lambda r: getattr(r, over))


@dataclass(kw_only=True, frozen=True)
class CellSplit:
    """What scan-cell measured: the pitfall's error per step, the bound, timelines and waits."""
    chunk_sizes: tuple[int, ...]
    from_zero_errors: tuple[float, ...]   # max |from zero - loop| at each step t = 1 .. T
    bound: float                          # largest gap rounding alone could open (bounds.propagated_bound)
    timelines: dict[str, list[Span]]      # scheme -> spans, each from 0 at its first span
    waits: tuple[float, ...]              # seconds each rank waited for its boundary state (hand-off)
    least_waits: tuple[float, ...]        # what the sleeps alone force: the steps of every earlier chunk
    step_seconds: float


@dataclass(kw_only=True, frozen=True)
class ScanTimes:
    """Best-of wall seconds of the loop, Hillis-Steele and torch's scan at each T, for one kind of A."""
    state_size: int
    diagonal: bool
    steps: tuple[int, ...]
    loop_s: tuple[float, ...]
    hillis_steele_s: tuple[float, ...]
    torch_scan_s: tuple[float, ...]

    def speedup(self, i: int) -> float:
        """Loop time / Hillis-Steele time at steps[i] (> 1: the scan is faster in this process)."""
        return self.loop_s[i] / self.hillis_steele_s[i]


@dataclass(kw_only=True, frozen=True)
class PicardSweeps:
    """What scan-picard measured, per sweep k = 1 .. K: error, start change, work and depth so far."""
    chunk_sizes: tuple[int, ...]
    errors: tuple[float, ...]       # max |trajectory after sweep k - loop|
    changes: tuple[float, ...]      # max |start moved| in sweep k: what the ranks can see (0: done)
    work: tuple[int, ...]           # cell evaluations per sequence after k sweeps: k * T
    depth: tuple[int, ...]          # dependent cell evaluations after k sweeps: k * longest chunk
    loop_steps: int                 # the loop's work and depth alike: T
    stop_below: float
    spans: tuple[Span, ...]         # every rank's compute and comm per sweep, from 0

    @property
    def sweeps(self) -> int:
        return len(self.errors)
