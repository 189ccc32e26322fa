"""Chapter 01's compression demo: torch's DDP comm hooks, bytes against their formula, error and loss measured.

dp-compression (2 or 4 ranks): the same SGD run (10 steps, momentum 0.9) under torch's
allreduce_hook, fp16_compress_hook, bf16_compress_hook and powerSGD_hook at rank 1, 2, 4 with
error feedback on and off. Checked: the bytes each hook hands to all_reduce, per rank per step,
equal wmdist.costs.compression's formula; fp16/bf16 (and the uncompressed hook) stay within their
rounding bound of the exact average at every step; PowerSGD's error is beyond any rounding and
falls as its rank grows (measured to hold on this seeded run). How error feedback changes the
loss is data (`CompressionData`), stated as measured, not promised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from wmdist.course.compare import bound_ratio
from wmdist.costs import compression as formula
from wmdist.costs.validate import require_int
from wmdist.data_parallel.compression import (CompressionRanks, CompressionSpec, Method, MethodRun,
                                              compression_runs)
from wmdist.data_parallel.training import TrainSpec
from wmdist.course.experiment import Experiment, Verdict
from wmdist.models.world import make_model
from wmdist.course.report import Check, Count, Report, counts_per_rank, exact_check, fact_check


def methods(*, ranks: tuple[int, ...] = (1, 2, 4)) -> tuple[Method, ...]:
    """none, fp16, bf16, then PowerSGD at each rank with error feedback on, then off."""
    out = [Method(kind="none"), Method(kind="fp16"), Method(kind="bf16")]
    for r in ranks:
        out += [Method(kind="powersgd", rank=r, error_feedback=True),
                Method(kind="powersgd", rank=r, error_feedback=False)]
    return tuple(out)


def compression_spec(world_size: int, *, steps: int = 10, ranks: tuple[int, ...] = (1, 2, 4), seed: int = 0,
                     start_iter: int = 2) -> CompressionSpec:
    """Every method for `steps` steps on `world_size` ranks; refused here, before any process starts.

    PowerSGD runs the plain float32 all-reduce for steps < start_iter (torch requires >= 2 with
    error feedback or warm start on); the steps from start_iter on are the compressed ones.
    """
    n = require_int("world_size", world_size, 1)
    train = TrainSpec(steps=steps, seed=seed)
    if n < 2:
        raise ValueError(f"world_size must be >= 2 (one rank has nothing to all-reduce), got {n}")
    if train.batch_size % n:
        raise ValueError(f"world_size must divide batch_size {train.batch_size} (DDP divides every sum by N, right "
                         f"only for equal shards), got {n}")
    require_int("start_iter", start_iter, 2)
    if steps <= start_iter:
        raise ValueError(f"steps must be > start_iter {start_iter} (else PowerSGD never compresses), got {steps}")
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must name distinct PowerSGD ranks, got {ranks!r}")
    return CompressionSpec(world_size=n, train=train, methods=methods(ranks=tuple(ranks)), start_iter=start_iter)


@dataclass(frozen=True, kw_only=True)
class MethodRow:
    """One method on rank 0: bytes per step, the gradient's relative L2 error, the loss curve."""
    label: str
    bytes_per_step: int               # in a compressed step (PowerSGD: from start_iter on)
    total_bytes: int                  # all steps
    first_error: float                # ||applied - exact|| / ||exact|| at step start_iter (same parameters for all)
    mean_error: float                 # the same, averaged over steps start_iter .. T-1
    cumulative_error: float           # ||sum_s applied_s - sum_s exact_s|| / ||sum_s exact_s||, s >= start_iter
    losses: tuple[float, ...]         # global-batch loss before each step, then after the last (T + 1 points)

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


@dataclass(frozen=True, kw_only=True)
class CompressionData:
    """Every method's row, the gradient size P and the first compressed step."""
    rows: tuple[MethodRow, ...]
    numel: int
    start_iter: int

    def row(self, label: str) -> MethodRow:
        return next(r for r in self.rows if r.label == label)


def relative_errors(run: MethodRun) -> list[float]:
    """||applied - exact|| / ||exact|| per step (NaN when either side is not finite)."""
    out = []
    for got, want in zip(run.applied.double(), run.exact.double()):
        ok = bool(torch.isfinite(got).all() and torch.isfinite(want).all())
        out.append(float((got - want).norm() / want.norm()) if ok else math.nan)
    return out


def cumulative_error(run: MethodRun, start: int) -> float:
    """How far the sum of the applied gradients over steps >= start is from the sum of the exact ones (relative).

    Error feedback adds each step's compression residue to the next step's gradient, so what it
    should keep small is this sum (where SGD without momentum would take the weights), not each step's error.
    """
    got, want = run.applied[start:].double().sum(0), run.exact[start:].double().sum(0)
    if not bool(torch.isfinite(got).all() and torch.isfinite(want).all()):
        return math.nan
    return float((got - want).norm() / want.norm())


def _bound(kind: str, n: int, abs_mean: torch.Tensor) -> torch.Tensor:
    rel, tiny = formula.hook_bound_terms(kind, n)          # type: ignore[arg-type]
    return rel * abs_mean.double() + tiny


def _ratio(run: MethodRun, kind: str, n: int, steps: range) -> float:
    ratios = [bound_ratio(run.applied[s], run.exact[s], _bound(kind, n, run.abs_mean[s])) for s in steps]
    return math.nan if any(math.isnan(r) for r in ratios) else max(ratios)


def _counts(spec: CompressionSpec, method: Method, runs: list[MethodRun], shapes: list[tuple[int, ...]]) -> list[Count]:
    out: list[Count] = []
    n = spec.world_size
    for s in range(spec.train.steps):
        keys = dict(rank=method.rank, step=s, start_iter=spec.start_iter)
        want = formula.hook_bytes(method.kind, shapes, min_compression_rate=spec.min_compression_rate, **keys)
        out += counts_per_rank("hook all_reduce bytes sent", [r.hook_bytes[s] for r in runs], [want] * n,
                               step=s, case=method.label)
        calls = formula.hook_calls(method.kind, step=s, start_iter=spec.start_iter)
        out += counts_per_rank("hook all_reduce calls", [r.hook_calls[s] for r in runs], [calls] * n,
                               step=s, case=method.label)
    return out


def compare_compression(spec: CompressionSpec, results: list[CompressionRanks]) -> Verdict:
    """Bytes against the formula; half-precision error against its bound; PowerSGD's error and loss as data."""
    n, steps, start = spec.world_size, spec.train.steps, spec.start_iter
    shapes = [tuple(p.shape) for p in make_model(seed=spec.train.seed).parameters()]
    by_method = [list(runs) for runs in zip(*(r.runs for r in results), strict=True)]
    checks: list[Check] = []
    exact: list[Count] = []
    rows = []
    why_half = ("each rank's entry rounded to the half format and divided by N there, N-1 half-precision additions "
                "in gloo, the float32 reference's own N roundings: gamma(N+1, u_half) A + gamma(N, u32) A + "
                "subnormal terms, A = sum_i |g_i| / N per entry (u_fp16 = 2^-11, u_bf16 = 2^-8)")
    why_f32 = "torch's hook divides by N then sums, the reference sums then divides: 2 gamma(N, u32) A per entry"
    for method, runs in zip(spec.methods, by_method, strict=True):
        zero = runs[0]
        exact += _counts(spec, method, runs, shapes)
        seen = [(r.applied, torch.tensor(r.losses, dtype=torch.float64)) for r in runs]
        checks.append(exact_check(f"{method.label}: every rank applies the same gradient and sees the same losses, "
                                  "every step", seen, [seen[0]] * n,
                                  "every rank decompresses the same all-reduced tensors; losses are all-reduced"))
        if method.kind in ("fp16", "bf16"):
            checks.append(Check(name=f"{method.label}: applied gradient == exact average within the half-precision "
                                     "rounding bound, every step (in units of the bound)",
                                error=_ratio(zero, method.kind, n, range(steps)), tolerance=1.0, reason=why_half))
        else:
            plain = range(steps) if method.kind == "none" else range(start)
            checks.append(Check(name=f"{method.label}: applied gradient == exact average within float32 "
                                     f"rounding in its uncompressed steps {plain.start}..{plain.stop - 1} "
                                     "(in units of the bound)",
                                error=_ratio(zero, "none", n, plain), tolerance=1.0, reason=why_f32))
        finite = all(math.isfinite(x) for x in zero.losses)
        checks.append(fact_check(f"{method.label}: every loss is finite and the last is below the first",
                                 holds=finite and zero.losses[-1] < zero.losses[0],
                                 reason=f"loss {zero.losses[0]:.4f} -> {zero.losses[-1]:.4f}"))
        errors = relative_errors(zero)
        rows.append(MethodRow(label=method.label, bytes_per_step=zero.hook_bytes[-1], total_bytes=sum(zero.hook_bytes),
                              first_error=errors[start], mean_error=sum(errors[start:]) / (steps - start),
                              cumulative_error=cumulative_error(zero, start), losses=zero.losses))
    data = CompressionData(rows=tuple(rows), numel=sum(math.prod(s) for s in shapes), start_iter=start)
    checks += _powersgd_checks(spec, data, by_method)
    params = {"steps": steps, "lr": spec.train.lr, "optimizer": "sgd (momentum 0.9)", "start_powerSGD_iter": start,
              "min_compression_rate": spec.min_compression_rate, "warm_start": True, "numel": data.numel}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


def _powersgd_checks(spec: CompressionSpec, data: CompressionData, by_method: list[list[MethodRun]]) -> list[Check]:
    """PowerSGD's measured error: beyond rounding, and falling as the rank grows (on this seeded run)."""
    ranks = sorted({m.rank for m in spec.methods if m.kind == "powersgd"})
    checks: list[Check] = []
    if not ranks:
        return checks
    start, n = spec.start_iter, spec.world_size
    top = next(runs[0] for m, runs in zip(spec.methods, by_method) if m.kind == "powersgd" and m.rank == ranks[-1])
    checks.append(Check(name=f"powersgd r={ranks[-1]}: its first compressed step misses the exact average by more than "
                             "bf16 rounding can (in units of the bf16 bound)",
                        error=_ratio(top, "bf16", n, range(start, start + 1)), tolerance=1.0, must_differ=True,
                        reason="a low-rank approximation, not a rounding: it drops what P Q^T cannot hold"))
    for ef in (True, False):
        labels = [Method(kind="powersgd", rank=r, error_feedback=ef).label for r in ranks]
        first = [data.row(x).first_error for x in labels]
        mean = [data.row(x).mean_error for x in labels]
        tag = "with" if ef else "without"
        falls = lambda xs: all(a > b for a, b in zip(xs, xs[1:]))  # noqa: E731
        if ef:       # error memory is still zero at the first compressed step: EF on and off agree there
            checks.append(fact_check(f"powersgd: the first compressed step's error falls as r grows "
                                     f"(r = {', '.join(map(str, ranks))})", holds=falls(first),
                                     reason="measured at the same parameters: " + ", ".join(f"{e:.3f}" for e in first)))
        checks.append(fact_check(f"powersgd {tag} error feedback: the mean error over compressed steps falls "
                                 "as r grows",
                                 holds=falls(mean), reason="measured on this seeded run: "
                                                           + ", ".join(f"{e:.3f}" for e in mean)))
    on = [data.row(Method(kind="powersgd", rank=r, error_feedback=True).label).cumulative_error for r in ranks]
    off = [data.row(Method(kind="powersgd", rank=r, error_feedback=False).label).cumulative_error for r in ranks]
    checks.append(fact_check("powersgd: error feedback makes the summed gradient over the compressed steps closer to "
                             "the exact sum, at every r", holds=all(a < b for a, b in zip(on, off)),
                             reason="measured on this seeded run, with vs without: " + ", ".join(
                                 f"r={r} {a:.3f} vs {b:.3f}" for r, a, b in zip(ranks, on, off))))
    return checks


COMPRESSION_DEMO = Experiment(name="dp-compression", chapter="01", world_sizes=(2, 4), spec=compression_spec,
                              title="torch's DDP comm hooks (fp16, bf16, PowerSGD r=1,2,4, error feedback "
                                    "on/off): bytes exact, error and loss measured",
                              ranks=compression_runs, compare=compare_compression)


def compression_demo(world_size: int, *, steps: int = 10, ranks: tuple[int, ...] = (1, 2, 4), seed: int = 0) -> Report:
    """Every method on `world_size` ranks; the table is `report.data` (CompressionData)."""
    return COMPRESSION_DEMO.run_spec(compression_spec(world_size, steps=steps, ranks=ranks, seed=seed))


def table_lines(data: CompressionData) -> list[str]:
    """One line per method: bytes per (compressed) step and its share of float32, the errors, the final loss."""
    full = data.row("none").bytes_per_step if any(r.label == "none" for r in data.rows) else None
    out = [f"{'method':<20}{'bytes/step':>11}{'vs fp32':>9}{'err@step ' + str(data.start_iter):>14}"
           f"{'mean err':>10}{'sum err':>10}{'final loss':>12}"]
    for r in data.rows:
        share = f"{r.bytes_per_step / full:.1%}" if full else "-"
        out.append(f"{r.label:<20}{r.bytes_per_step:>11}{share:>9}{r.first_error:>14.2e}{r.mean_error:>10.2e}"
                   f"{r.cumulative_error:>10.2e}{r.final_loss:>12.4f}")
    return out


DEMOS = [COMPRESSION_DEMO]
