"""Demo: in one process, the log-depth scans equal the loop; their operation counts equal the formulas.

Three groupings of the same affine recurrence against the sequential loop:
the Hillis-Steele scan (affine.associative_scan), torch's prototype
associative_scan (generic mode: a work-efficient odd/even scan), and the
chunked scheme with N chunks (what N ranks do, here in one process). Each is
checked within the reassociation bound, and the operations each performs
(counted while it runs) equal wmdist.costs.scan's formulas. Wall times are
measured separately (`measure_times`), for plots only: a scan pays in depth,
never in total work.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wmdist.compare import ROUNDOFF
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
from wmdist.report import Check, Count, Demo, Report, close_check
from wmdist.scan.affine import Tally, associative_scan, chunked, compose, sequential, time_scans, torch_associative_scan
from wmdist.scan.affine_ranks import AffineCase


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
    return [Count(q, 0, getattr(measured, q), getattr(predicted, q), case=label) for q in quantities]


def scan_demo(world_size: int, steps: int = 37, state_size: int = 4, batch: int = 2, seed: int = 0) -> Report:
    """One process, N = world_size chunks: Hillis-Steele, torch's scan and the chunked scheme vs the loop.

    float32, diagonal and dense A. Counts use rank 0 (there is one process).
    """
    t = require_int("steps", steps, 1)
    n = require_int("world_size", world_size, 1)
    time_chunk_sizes(t, n)                                                # N <= T, or a clear ValueError
    cases = [AffineCase.random(batch, t, state_size, diagonal, seed=seed + diagonal) for diagonal in (True, False)]
    start = time.perf_counter()
    checks: list[Check] = []
    exact: list[Count] = []
    depth_seq = sequential_ops(t).depth
    for case in cases:
        A, b, h0 = case.A, case.b, case.h0
        magnitude = float(sequential(A.double().abs(), b.double().abs(), h0.double().abs()).max())
        tallies = {name: Tally() for name in ("loop", "hillis-steele", "chunked")}
        ref = sequential(A, b, h0, tallies["loop"])
        runs = [("hillis-steele", associative_scan(A, b, h0, tallies["hillis-steele"]), hillis_steele_ops(t)),
                ("torch associative_scan", torch_associative_scan(A, b, h0), blelloch_ops(t)),
                (f"chunked, {n} chunks", chunked(A, b, h0, n, "handoff", tallies["chunked"]), chunked_ops(t, n))]
        for name, got, ops in runs:
            tol = reassociation_bound(ops.depth, depth_seq, case.state_size, case.diagonal,
                                      ROUNDOFF[b.dtype]) * magnitude
            checks.append(close_check(f"{case.label}: {name} == loop", got, ref, tol,
                                      f"regrouped products: reassociation_bound(depth {ops.depth}, T) * max|h|_abs"))
        if case.diagonal:                                 # the counts do not depend on A's structure: count once
            for name, tally, ops in (("loop", tallies["loop"], sequential_ops(t)),
                                     ("hillis-steele", tallies["hillis-steele"], hillis_steele_ops(t))):
                exact += _count_rows(name, OpCount(tally.composes, tally.applies, tally.calls), ops)
            exact += _count_rows("torch associative_scan", torch_scan_ops(t), blelloch_ops(t),
                                 ("composes", "depth"))
            ch = chunked_ops(t, n)
            exact += [Count(q, 0, getattr(tallies["chunked"], q), getattr(ch, q), case=f"chunked, {n} chunks")
                      for q in ("composes", "applies")]
    seconds = time.perf_counter() - start
    return Report("scan-one-process", n, checks, exact, seconds,
                  {"steps": t, "state_size": state_size, "batch": batch, "chunks": n})


@dataclass(frozen=True)
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


def measure_times(steps: tuple[int, ...] = (16, 64, 256, 1024), state_size: int = 8, diagonal: bool = True,
                  batch: int = 4, repeats: int = 3) -> ScanTimes:
    """Time the three in this process (affine.time_scans); timings vary by machine and load: never asserted."""
    rows = time_scans(steps, state_size, batch, diagonal, repeats)
    loop, scan, theirs = ([r[key] for r in rows] for key in ("sequential_s", "hillis_steele_s", "torch_scan_s"))
    return ScanTimes(state_size, diagonal, tuple(int(r["steps"]) for r in rows), tuple(loop), tuple(scan),
                     tuple(theirs))


DEMOS = [Demo("scan-one-process", "One process: Hillis-Steele, torch's associative_scan and N chunks vs the loop",
              scan_demo, world_sizes=(1, 4), chapter="07")]
