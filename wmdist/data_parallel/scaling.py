"""All-reduce scaling: the text's T(N) cost model, and a fit of it to this machine's measurements.

Pure (numpy, no torch, no processes):

* the model: for N = 1..N_max workers sharing a fixed global amount of
  compute C, one step costs C/N of compute plus a ring all-reduce of G bytes,
  T(N) = 2(N-1)a + 2(N-1)/N bG (wmdist.costs.allreduce_time). The latency term
  grows with N; the byte term tends to 2bG. Speedup and efficiency follow.
* the fit: measured times at several N and G give a and b by least squares
  (T is linear in them). On a laptop or Binder, N ranks often share fewer
  cores, which the text's model does not know about. One extra term, fitted
  and named, accounts for it: the contention factor
      s(N) = 1 + g * max(0, N / cores - 1),
  multiplying T(N). g = 0 means sharing cores costs nothing; g = 1 means the
  ranks time-share the cores perfectly, so a step with N > cores ranks takes
  N / cores times as long. The measurement itself is wmdist.data_parallel.measure.
* whether the timings resolve each term: on a busy machine the scatter of the
  times can be larger than everything the byte term (or the latency term)
  adds, and least squares then puts that term at 0 (or at a value within its
  own noise). A Fit carries each term's standard error and says in words when
  a term is not resolved, and what would resolve it, instead of printing
  1/0 = inf GB/s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from wmdist import costs
from wmdist.costs import require_int, require_positive, require_real
from wmdist.costs.units import seconds
from wmdist.base.knobs import knob

MIB = 1024 * 1024
TARGET_MEDIAN_REL_ERROR = 0.25   # the bench target: the fit explains the median point within 25 %
CONTENTION_GRID = tuple(np.round(np.linspace(0.0, 2.0, 81), 3))   # candidate g values
RESOLVED_SIGMAS = 2.0   # a term is resolved when its fitted value is at least 2 standard errors above 0
# What a term the noise defeats is called, and what kind of timing would show it (α shows in small messages).
TERM_WORDS = {"alpha": ("latency", "smaller"), "beta": ("byte", "larger")}


@dataclass(frozen=True, kw_only=True)
class ScalingParams:
    """Inputs of the scaling model. Times in seconds, sizes in bytes.

    Defaults: 100 us per round (a software ring over Ethernet), 10 GB/s links
    (b = 1e-10 s/B), a 400 MB gradient (100 M float32 parameters), 3 s of
    global compute per step. The knobs are the panel's slider ranges.
    """
    alpha: float = knob(1e-4, "α: s per round", low=1e-7, high=1e-2, log=True, fmt=".3s")
    beta: float = knob(1e-10, "β: s per byte", low=1e-12, high=1e-7, log=True, fmt=".3s")
    payload_bytes: float = knob(4e8, "G: gradient bytes", low=1e5, high=1e11, log=True, fmt=".3s")
    max_workers: int = knob(32, "N max", low=2, high=256)
    compute_seconds: float = knob(3.0, "C: compute s", low=1e-2, high=1e2, log=True, fmt=".3g")

    def __post_init__(self) -> None:
        require_real("alpha", self.alpha)
        require_real("beta", self.beta)
        require_real("payload_bytes", self.payload_bytes)
        require_int("max_workers", self.max_workers, 1)
        require_positive("compute_seconds", self.compute_seconds)


@dataclass(kw_only=True, frozen=True)
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

    @property
    def fastest(self) -> int:
        """The N with the shortest step."""
        return min(self.workers, key=lambda n: self.total[n - 1])

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
    allreduce = tuple(a + b for a, b in terms)
    compute = tuple(p.compute_seconds / n for n in ns)
    total = tuple(c + t for c, t in zip(compute, allreduce))
    speed = tuple(costs.speedup(total[0], t) for t in total)
    eff = tuple(costs.efficiency(total[0], t, n) for t, n in zip(total, ns))
    return ScalingCurve(params=p, workers=ns, latency=latency, bandwidth=bandwidth, allreduce=allreduce, compute=compute, total=total, speedup=speed, efficiency=eff)


# --- the fit ------------------------------------------------------------------------

@dataclass(kw_only=True, frozen=True)
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


def contention(world_size: int, cores: int, g: float) -> float:
    """s(N) = 1 + g max(0, N/cores - 1): how much longer N ranks take on `cores` cores."""
    n, c = require_int("world_size", world_size, 1), require_int("cores", cores, 1)
    return 1.0 + require_real("g", g) * max(0.0, n / c - 1.0)


@dataclass(frozen=True, kw_only=True)
class Fit:
    """a, b (and the contention g on `cores` cores) fitted to measurements, and how well they explain them.

    `alpha_stderr` and `beta_stderr` are one standard error of each term, from the scatter of the
    relative residuals (at the chosen g; 0 when the points leave no degree of freedom to estimate
    it from). A term is *resolved* when it lies at least RESOLVED_SIGMAS standard errors above 0:
    otherwise the timings cannot tell it from no term at all, and `describe` says so.
    """
    alpha: float                    # seconds per round
    beta: float                     # seconds per byte
    contention: float               # g in s(N) = 1 + g max(0, N/cores - 1); 0 when no point oversubscribes
    cores: int
    median_rel_error: float         # median over points of |model - measured| / measured
    max_rel_error: float
    predicted: tuple[float, ...]    # model time at each measurement, in input order
    alpha_stderr: float = 0.0
    beta_stderr: float = 0.0
    measurements: tuple[Measurement, ...] = field(repr=False, default=())

    def resolved(self, term: str) -> bool:
        """Whether these timings resolve `term` ("alpha" or "beta"): its value > RESOLVED_SIGMAS standard errors."""
        value, err = {"alpha": (self.alpha, self.alpha_stderr), "beta": (self.beta, self.beta_stderr)}[term]
        return value > 0 and value > RESOLVED_SIGMAS * err

    @property
    def unresolved(self) -> tuple[str, ...]:
        """The terms ("alpha", "beta") these timings do not resolve; () for a usable fit."""
        return tuple(t for t in ("alpha", "beta") if not self.resolved(t))

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """1/b, the link's bytes per second; None when b is not resolved (1/0 is not a bandwidth)."""
        return 1.0 / self.beta if self.resolved("beta") else None

    def describe(self, term: str) -> str:
        """One term in words: "533 µs per round", "166 ps per byte (6.02 GB/s)", or why it is not resolved."""
        if not self.resolved(term):
            name, sizes = TERM_WORDS[term]
            return (f"not resolved by these timings: the noise is larger than the {name} term; "
                    f"time {sizes} messages or more repeats")
        if term == "alpha":
            return f"{seconds(self.alpha)} per round"
        return f"{seconds(self.beta)} per byte ({self.bandwidth_bytes_per_s / 1e9:.3g} GB/s)"

    def predict(self, world_size: int, payload_bytes: float) -> float:
        """s(N) T(N) with the fitted a, b and g."""
        return contention(world_size, self.cores, self.contention) * \
            costs.allreduce_time(world_size, self.alpha, self.beta, payload_bytes)


def design_row(world_size: int, payload_bytes: float) -> tuple[float, float]:
    """Coefficients of (a, b) in T(N): (2(N-1), 2(N-1)/N G)."""
    n = require_int("world_size", world_size, 1)
    return 2.0 * (n - 1), 2.0 * (n - 1) / n * require_real("payload_bytes", payload_bytes)


def _nonnegative_lstsq(X: np.ndarray, t: np.ndarray, *, fixed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Least squares in relative error for t ~ X @ coef with coef >= 0 (two columns): coef and its standard errors.

    `fixed` parameters were chosen outside (the contention g) and count against the degrees of freedom.
    The standard errors are the usual sigma^2 (Xw^T Xw)^-1 of the weighted problem, over the free columns.
    """
    Xw, tw = X / t[:, None], np.ones_like(t)                                  # relative residuals
    scale = np.abs(Xw).max(axis=0)                                            # columns to unit size
    coef = np.linalg.lstsq(Xw / scale, tw, rcond=None)[0] / scale
    free = [0, 1]
    if (coef < 0).any():                  # a physical time cannot be negative: fix it at 0, refit the other
        keep = int(np.argmax(coef))
        coef = np.zeros(2)
        coef[keep] = float(Xw[:, keep] @ tw) / float(Xw[:, keep] @ Xw[:, keep])
        free = [keep]
    stderr = np.full(2, np.inf)           # no spare measurement: the noise is unknown, so no term is resolved
    stderr[[c for c in (0, 1) if c not in free]] = 0.0
    dof = len(t) - len(free) - fixed
    if dof > 0:
        sigma2 = float(((Xw @ coef - tw) ** 2).sum()) / dof
        A = Xw[:, free] / scale[free]
        stderr[free] = np.sqrt(sigma2 * np.diag(np.linalg.inv(A.T @ A))) / scale[free]
    return coef, stderr


def fit_alpha_beta(measurements: Sequence[Measurement], *, cores: int | None = None) -> Fit:
    """Fit a, b >= 0 (and g, when some point has more ranks than `cores`) to measured times.

    Rows are divided by the measured time, so the fit minimizes relative
    error: otherwise the 16 MiB points would outweigh the small ones a
    thousandfold and a (which only small messages reveal) would be noise.
    For each g on a grid from 0 to 2 the contention factor is known, T is
    linear in (a, b), and the g with the smallest squared relative error wins.
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
    c = require_int("cores", cores, 1) if cores is not None else max(m.world_size for m in ms)
    t = np.array([m.seconds for m in ms])                                     # (P,)
    grid = CONTENTION_GRID if any(m.world_size > c for m in ms) else (0.0,)
    best = None
    for g in grid:
        s = np.array([contention(m.world_size, c, g) for m in ms])           # (P,)
        coef, err = _nonnegative_lstsq(X * s[:, None], t, fixed=int(len(grid) > 1))
        pred = (X * s[:, None]) @ coef
        score = float((((pred - t) / t) ** 2).sum())
        if best is None or score < best[0]:
            best = (score, g, coef, err, pred)
    _, g, coef, err, pred = best
    rel = np.abs(pred - t) / t
    return Fit(alpha=float(coef[0]), beta=float(coef[1]), contention=float(g), cores=c,
               median_rel_error=float(np.median(rel)), max_rel_error=float(rel.max()),
               predicted=tuple(float(p) for p in pred), alpha_stderr=float(err[0]), beta_stderr=float(err[1]),
               measurements=ms)


def terms_text(fit: Fit, world_size: int, payload_bytes: float, *, calls: int = 1) -> str:
    """`calls` all-reduces of `payload_bytes` on `world_size` >= 2 ranks, by term, in words, with the fitted a and b.

    "latency 4.64 ms, bytes 10.7 µs: the rounds cost 434x the bytes"; a term the timings do not
    resolve is named as such, briefly ("bytes not resolved by these timings"; `Fit.describe` says
    why and what would resolve it), with no ratio to a term that is noise, and never 1/0.
    """
    n, k = require_int("world_size", world_size, 2), require_int("calls", calls, 1)
    lat, byt = (k * t for t in costs.allreduce_terms(n, fit.alpha, fit.beta, require_positive("payload_bytes",
                                                                                              payload_bytes)))
    if fit.unresolved:
        return "; ".join(f"{name} {seconds(t)}" if fit.resolved(term) else f"{name} not resolved by these timings"
                         for name, term, t in (("latency", "alpha", lat), ("bytes", "beta", byt)))
    ratio = f"the rounds cost {lat / byt:.3g}x the bytes" if lat >= byt else \
        f"the bytes cost {byt / lat:.3g}x the rounds"
    return f"latency {seconds(lat)}, bytes {seconds(byt)}: {ratio}"
