"""All-reduce scaling: the T(N) cost model, a measurement of it, and a fit of a and b.

Three layers, top to bottom:

* the model (pure): for N = 1..N_max workers sharing a fixed global amount of
  compute C, one step costs C/N of compute plus a ring all-reduce of G bytes,
  T(N) = 2(N-1)a + 2(N-1)/N bG (wmdist.costs.allreduce_time). The latency term
  grows with N; the byte term tends to 2bG. Speedup and efficiency follow.
* the fit (pure): T is linear in (a, b), so measured times at several N and G
  give a and b by least squares.
* the measurement (processes, imported lazily): real ring all-reduces
  (wmdist.comm.ring_all_reduce) on real gloo ranks, timed, with the ledger's
  byte counts kept so they can be checked against the formula.

torch is imported only inside the functions that start processes, so the
model and the fit load without it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from wmdist import costs
from wmdist.costs import require_int, require_real

KIB, MIB = 1024, 1024 * 1024
DEFAULT_WORLD_SIZES = (2, 4, 8)
DEFAULT_SIZES_BYTES = (256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)
DEFAULT_REPEATS = 3
TARGET_MEDIAN_REL_ERROR = 0.25   # the bench target: the fit explains the median point within 25 %


# --- the model --------------------------------------------------------------------

@dataclass(frozen=True)
class ScalingParams:
    """Inputs of the scaling model. Times in seconds, sizes in bytes.

    Defaults: 100 us per round (a software ring over Ethernet), 10 GB/s links
    (b = 1e-10 s/B), a 400 MB gradient (100 M float32 parameters), 3 s of
    global compute per step.
    """
    alpha: float = 1e-4             # a: seconds per communication round (latency)
    beta: float = 1e-10             # b: seconds per byte (1 / bandwidth)
    payload_bytes: float = 4e8      # G: gradient bytes each rank contributes
    max_workers: int = 32           # N_max
    compute_seconds: float = 3.0    # C: compute of one global step on one worker

    def __post_init__(self) -> None:
        require_real("alpha", self.alpha)
        require_real("beta", self.beta)
        require_real("payload_bytes", self.payload_bytes)
        require_int("max_workers", self.max_workers, 1)
        require_real("compute_seconds", self.compute_seconds)
        if self.compute_seconds == 0:
            raise ValueError("compute_seconds must be > 0 (speedup compares against one worker's step time)")


@dataclass(frozen=True)
class ScalingCurve:
    """The model evaluated at N = 1..N_max; every tuple has one entry per N."""
    params: ScalingParams
    workers: tuple[int, ...]
    latency: tuple[float, ...]      # 2(N-1)a
    bandwidth: tuple[float, ...]    # 2(N-1)/N bG
    allreduce: tuple[float, ...]    # T(N) = latency + bandwidth
    compute: tuple[float, ...]      # C/N
    total: tuple[float, ...]        # compute + T(N)
    speedup: tuple[float, ...]      # total(1) / total(N)
    efficiency: tuple[float, ...]   # speedup / N

    @property
    def byte_limit(self) -> float:
        """2bG: what the byte term approaches as N grows."""
        return 2 * self.params.beta * self.params.payload_bytes

    def at(self, workers: int) -> dict[str, float]:
        """All quantities at one N, by name."""
        i = self.workers.index(workers)
        return {k: getattr(self, k)[i] for k in
                ("latency", "bandwidth", "allreduce", "compute", "total", "speedup", "efficiency")}


def scaling_curve(params: ScalingParams) -> ScalingCurve:
    """Evaluate the model for every N from 1 to params.max_workers."""
    p = params
    ns = tuple(range(1, p.max_workers + 1))
    terms = [costs.allreduce_terms(n, p.alpha, p.beta, p.payload_bytes) for n in ns]
    latency = tuple(t[0] for t in terms)
    bandwidth = tuple(t[1] for t in terms)
    allreduce = tuple(costs.allreduce_time(n, p.alpha, p.beta, p.payload_bytes) for n in ns)
    compute = tuple(p.compute_seconds / n for n in ns)
    total = tuple(c + t for c, t in zip(compute, allreduce))
    speed = tuple(costs.speedup(total[0], t) for t in total)
    eff = tuple(costs.efficiency(total[0], t, n) for t, n in zip(total, ns))
    return ScalingCurve(p, ns, latency, bandwidth, allreduce, compute, total, speed, eff)


# --- the fit ------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """Median wall time of a ring all-reduce of `payload_bytes` on `world_size` ranks.

    A sample is the slowest rank's time for one repetition (the collective is
    done when the last rank is); `seconds` is the median over repetitions.
    `bytes_sent` is what each rank's ledger counted for one all-reduce.
    """
    world_size: int
    payload_bytes: int
    seconds: float
    samples: tuple[float, ...] = ()
    bytes_sent: tuple[int, ...] = ()


@dataclass(frozen=True)
class Fit:
    """a and b fitted to measurements, and how well the model then explains them."""
    alpha: float                    # seconds per round
    beta: float                     # seconds per byte
    median_rel_error: float         # median over points of |model - measured| / measured
    max_rel_error: float
    predicted: tuple[float, ...]    # model time at each measurement, in input order
    measurements: tuple[Measurement, ...] = field(repr=False, default=())

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return float("inf") if self.beta == 0 else 1.0 / self.beta

    def predict(self, world_size: int, payload_bytes: float) -> float:
        return costs.allreduce_time(world_size, self.alpha, self.beta, payload_bytes)


def design_row(world_size: int, payload_bytes: float) -> tuple[float, float]:
    """Coefficients of (a, b) in T(N): (2(N-1), 2(N-1)/N G)."""
    n = require_int("world_size", world_size, 1)
    return 2.0 * (n - 1), 2.0 * (n - 1) / n * require_real("payload_bytes", payload_bytes)


def fit_alpha_beta(measurements: Sequence[Measurement]) -> Fit:
    """Least-squares a, b >= 0 for T = 2(N-1)a + 2(N-1)/N bG.

    Rows are divided by the measured time, so the fit minimizes relative
    error: otherwise the 16 MiB points would outweigh the small ones a
    thousandfold and a (which only small messages reveal) would be noise. If
    the unconstrained solution has a negative coefficient, that coefficient
    is fixed at 0 and the other refitted (a physical time cannot be negative).
    """
    ms = tuple(measurements)
    if any(m.world_size < 2 for m in ms):
        raise ValueError("measurements must have world_size >= 2 (T(1) = 0 carries no information)")
    if any(not (m.seconds > 0) for m in ms):
        raise ValueError("every measurement must have seconds > 0")
    X = np.array([design_row(m.world_size, m.payload_bytes) for m in ms]).reshape(-1, 2)   # (P, 2)
    if len(ms) < 2 or np.linalg.matrix_rank(X / np.abs(X).max(axis=0)) < 2:
        raise ValueError("fit_alpha_beta needs measurements that separate a from b: two or more "
                         "(world size, size) points whose G/N ratios differ")
    t = np.array([m.seconds for m in ms])                                     # (P,)
    Xw, tw = X / t[:, None], np.ones_like(t)                                  # relative residuals
    scale = np.abs(Xw).max(axis=0)                                            # columns to unit size
    coef = np.linalg.lstsq(Xw / scale, tw, rcond=None)[0] / scale
    if (coef < 0).any():
        keep = int(np.argmax(coef))
        single = np.zeros(2)
        single[keep] = float(Xw[:, keep] @ tw) / float(Xw[:, keep] @ Xw[:, keep])
        coef = single
    pred = X @ coef
    rel = np.abs(pred - t) / t
    return Fit(float(coef[0]), float(coef[1]), float(np.median(rel)), float(rel.max()),
               tuple(float(p) for p in pred), ms)


# --- the measurement (processes) -------------------------------------------------------

def time_ring_allreduce(ctx: Any, numel: int, repeats: int) -> tuple[list[float], int]:
    """Rank function: time `repeats` ring all-reduces of `numel` float32 values.

    One untimed warm-up first (buffers, connections). A counted barrier before
    each repetition lines the ranks up so every sample times the collective,
    not a rank arriving late. Returns this rank's times and the bytes its
    ledger counted for one all-reduce.
    """
    import torch

    from wmdist.comm import barrier, ring_all_reduce

    x = torch.ones(numel)                                     # (numel,)
    ring_all_reduce(ctx, x, phase="warm-up")
    times = []
    for _ in range(repeats):
        barrier(ctx, phase="line up")
        start = time.perf_counter()
        ring_all_reduce(ctx, x, phase="timed")
        times.append(time.perf_counter() - start)
    return times, ctx.ledger.totals("warm-up/reduce-scatter")["bytes_sent"] + \
        ctx.ledger.totals("warm-up/all-gather")["bytes_sent"]


def _check_plan(world_sizes: Sequence[int], sizes_bytes: Sequence[int], repeats: int) -> None:
    if not world_sizes or not sizes_bytes:
        raise ValueError("world_sizes and sizes_bytes must each name at least one value")
    for n in world_sizes:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 16:
            raise ValueError(f"world_sizes must be integers from 2 to 16, got {n!r}")
    for s in sizes_bytes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 4 or s % 4:
            raise ValueError(f"sizes_bytes must be positive multiples of 4 (float32), got {s!r}")
    require_int("repeats", repeats, 1)


def measure_allreduce(world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                      sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
                      repeats: int = DEFAULT_REPEATS,
                      progress: Callable[[int, int, str], None] | None = None) -> list[Measurement]:
    """Time ring all-reduces on real ranks for every (N, size); one Measurement each.

    `progress(done, total, what)` is called before each point and once at the
    end, so a panel can show where the measurement is.
    """
    _check_plan(world_sizes, sizes_bytes, repeats)
    from wmdist.launch import run

    plan = [(n, s) for n in world_sizes for s in sizes_bytes]
    out = []
    for i, (n, size) in enumerate(plan):
        if progress is not None:
            progress(i, len(plan), f"N={n}, {size / MIB:g} MiB")
        per_rank = run(time_ring_allreduce, n, size // 4, repeats)
        samples = tuple(max(r[0][k] for r in per_rank) for k in range(repeats))   # slowest rank per repeat
        out.append(Measurement(n, size, statistics.median(samples), samples, tuple(r[1] for r in per_rank)))
    if progress is not None:
        progress(len(plan), len(plan), "done")
    return out


def bench_allreduce_fit(world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                        sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
                        repeats: int = DEFAULT_REPEATS) -> dict[str, Any]:
    """Measure, fit a and b, and report the fit's error (for `wmdist bench`)."""
    start = time.perf_counter()
    ms = measure_allreduce(world_sizes, sizes_bytes, repeats)
    fit = fit_alpha_beta(ms)
    bytes_ok = all(m.bytes_sent[r] == costs.ring_allreduce_bytes(m.payload_bytes // 4, m.world_size, r)
                   for m in ms for r in range(m.world_size))
    return {
        "name": "allreduce-fit",
        "alpha_s": fit.alpha,
        "beta_s_per_byte": fit.beta,
        "bandwidth_GB_per_s": fit.bandwidth_bytes_per_s / 1e9,
        "median_rel_error": fit.median_rel_error,
        "max_rel_error": fit.max_rel_error,
        "target_median_rel_error": TARGET_MEDIAN_REL_ERROR,
        "met_target": fit.median_rel_error < TARGET_MEDIAN_REL_ERROR,
        "ledger_bytes_exact": bytes_ok,
        "world_sizes": list(world_sizes),
        "sizes_bytes": list(sizes_bytes),
        "repeats": repeats,
        "points": [{"world_size": m.world_size, "payload_bytes": m.payload_bytes, "seconds": m.seconds,
                    "fit_seconds": p} for m, p in zip(ms, fit.predicted)],
        "seconds": time.perf_counter() - start,
    }
