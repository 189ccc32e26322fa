"""Estimators and seeds on real ranks: draws spread over ranks, sums all-reduced, checked statistically.

- latent-estimators: bias and variance of the pathwise, score-function and
  straight-through estimators against the exact gradient (straight-through's
  bias is shown significant).
- latent-seeds: shared, independent and antithetic seeds: the covariance
  between ranks' estimates decides the variance of their average, which can
  go up or down. Seeding is a variance question, not a synchronization fix.

Statistics use float64; tolerances are multiples of the standard error the
same draws give (4 SE: a false alarm about 1 in 16,000).

Both are `Experiment`s: the spec (`EstimatorsSpec`, `SeedsSpec`) is checked
before any process starts, and each rank returns a frozen dataclass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.comm import Context, ring_all_reduce
from wmdist.costs import require_int
from wmdist.course.exercises import Exercise
from wmdist.course.experiment import Experiment, Verdict
from wmdist.latents.estimators import (ESTIMATES, LOGIT, MU, SEED_MODES, SIGMA, TARGET, SeedMode, bernoulli_score_grads, cubic,
                                       draw_normal, exact_values, pathwise_grads, rank_generator,
                                       score_function_grads, straight_through_expectation, straight_through_grads)
from wmdist.latents.results import EstimatorStats, SeedStats
from wmdist.course.report import Check, Report, counts_per_rank, exact_check


@dataclass(frozen=True)
class EstimatorSums:
    """One rank's all-reduced sums (every rank's draws): each estimator's sum, then its sum of squares."""
    sums: torch.Tensor          # (2K,) float64, K = len(ESTIMATES)
    bytes_sent: int


def estimator_sums(ctx: Context, draws: int, *, seed: int = 0) -> EstimatorSums:
    """Rank function: this rank's draws of every estimator; sums and sums of squares all-reduced."""
    gen = rank_generator(seed, ctx.rank)
    eps = torch.randn(draws, generator=gen, dtype=torch.float64)          # (M,)
    u = torch.rand(draws, generator=gen, dtype=torch.float64)             # (M,)
    z = MU + SIGMA * eps
    cols = torch.cat([pathwise_grads(MU, SIGMA, eps), score_function_grads(MU, SIGMA, z),
                      bernoulli_score_grads(LOGIT, u)[:, None], straight_through_grads(LOGIT, u)[:, None],
                      cubic(z)[:, None]], dim=1)                          # (M, 7)
    sums = torch.cat([cols.sum(0), cols.pow(2).sum(0)])                   # (14,)
    return EstimatorSums(ring_all_reduce(ctx, sums, phase="estimator sums"), ctx.ledger.totals()["bytes_sent"])


@dataclass(frozen=True, kw_only=True)
class EstimatorsSpec:
    """The estimator run, decided before any process starts: N ranks, `draws_per_rank` draws each (at least 2)."""
    world_size: int
    draws_per_rank: int = 20_000
    seed: int = 0

    def __post_init__(self) -> None:
        require_int("world_size", self.world_size, 1)
        require_int("draws_per_rank", self.draws_per_rank, 2)


def estimators_rank(ctx: Context, spec: EstimatorsSpec) -> EstimatorSums:
    """Rank function: `estimator_sums` with the spec's draws."""
    return estimator_sums(ctx, spec.draws_per_rank, seed=spec.seed)


def compare_estimators(spec: EstimatorsSpec, results: list[EstimatorSums]) -> Verdict:
    """Each unbiased estimator within 4 SE of the exact gradient, straight-through's bias significant and as
    predicted; the sums equal on every rank; the ring's bytes."""
    world_size = spec.world_size
    total = results[0].sums
    count = spec.draws_per_rank * world_size
    k = len(ESTIMATES)
    mean = total[:k] / count
    var = (total[k:] / count - mean ** 2) * count / (count - 1)
    se = (var / count).sqrt()
    exact = torch.tensor(exact_values(), dtype=torch.float64)
    bias = mean - exact
    why = f"unbiased estimator: |mean - exact| within 4 standard errors of {count} draws"
    checks = [Check(name=f"{name}: |bias| vs exact {float(e):.4g}", error=abs(float(b)), tolerance=4 * float(s), reason=why)
              for name, e, b, s in zip(ESTIMATES, exact, bias, se) if name != "straight-through"]
    st = ESTIMATES.index("straight-through")
    checks.append(Check(name="straight-through: |bias| vs exact (must be significant)", error=abs(float(bias[st])),
                        tolerance=4 * float(se[st]), reason="biased estimator: its mean sits outside 4 standard errors of the exact "
                        "gradient", must_differ=True))
    checks.append(Check(name="straight-through: mean vs its biased expectation 2(p-t)p(1-p)",
                        error=abs(float(mean[st]) - straight_through_expectation(LOGIT)), tolerance=4 * float(se[st]),
                        reason="the bias is the predicted one: within 4 standard errors"))
    checks.append(exact_check("every rank holds the same all-reduced sums", [r.sums for r in results],
                              [total] * world_size, "the ring's all-gather copies one reduced chunk to all"))
    exact_counts = counts_per_rank("bytes sent", [r.bytes_sent for r in results],
                                   [costs.ring_allreduce_bytes(2 * k, world_size, r, elem_size=8)
                                    for r in range(world_size)])
    stats = {n: EstimatorStats(name=n, exact=float(e), mean=float(m), bias=float(b), variance=float(v), se=float(s))
             for n, e, m, b, v, s in zip(ESTIMATES, exact, mean, bias, var, se)}
    return Verdict(checks=checks, exact=exact_counts, data=stats,
                   params={"draws_per_rank": spec.draws_per_rank, "mu": MU, "sigma": SIGMA, "logit": LOGIT,
                           "target": TARGET})


ESTIMATORS_DEMO = Experiment(name="latent-estimators", chapter="02", world_sizes=(1, 2, 4),
                             title="Pathwise, score-function and straight-through gradients vs the exact gradient",
                             spec=lambda n: EstimatorsSpec(world_size=n), ranks=estimators_rank,
                             compare=compare_estimators)


def estimators_demo(world_size: int, *, draws_per_rank: int = 20_000, seed: int = 0) -> Report:
    """Bias and variance of each estimator against the exact gradient, draws spread over ranks."""
    return ESTIMATORS_DEMO.run_spec(EstimatorsSpec(world_size=world_size, draws_per_rank=draws_per_rank, seed=seed))


# --- shared vs independent seeds ------------------------------------------------------

@dataclass(frozen=True)
class SeededEstimates:
    """One rank's `trials` pathwise estimates of dJ/dmu under one seeding mode, and their average over ranks."""
    mode: SeedMode
    mine: torch.Tensor          # (R,)
    average: torch.Tensor       # (R,) all-reduced mean over ranks


def seeded_estimates(ctx: Context, trials: int, draws: int, *, mode: SeedMode, seed: int = 0) -> SeededEstimates:
    """Rank function: `trials` pathwise estimates of dJ/dmu, each a mean of `draws` draws,
    from this rank's stream under `mode`; and their average over ranks (all-reduced)."""
    eps = draw_normal(rank_generator(seed, ctx.rank, mode=mode), (trials, draws), ctx.rank, mode=mode)   # (R, m)
    mine = pathwise_grads(MU, SIGMA, eps.reshape(-1))[:, 0].reshape(trials, draws).mean(1)     # (R,)
    return SeededEstimates(mode, mine, ring_all_reduce(ctx, mine, phase=f"average ({mode})") / ctx.world_size)


def _moments(x: torch.Tensor) -> tuple[float, float]:
    """Sample variance and the relative standard error of that variance, sqrt((kurtosis - 1)/R)."""
    c = x - x.mean()
    var = float(c.pow(2).mean())
    kurt = float(c.pow(4).mean()) / var ** 2
    return var * len(x) / (len(x) - 1), math.sqrt(max(kurt - 1, 0.0) / len(x))


@dataclass(frozen=True, kw_only=True)
class SeedsSpec:
    """The seeding run, decided before any process starts: N >= 2 ranks (rank 0 is correlated with rank 1),
    `trials` estimates of `draws` draws each, under every mode of SEED_MODES."""
    world_size: int
    trials: int = 2_000
    draws: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if require_int("world_size", self.world_size, 1) < 2:
            raise ValueError(f"seeds_demo needs world_size >= 2 (it correlates rank 0 with rank 1), "
                             f"got {self.world_size!r}")
        require_int("trials", self.trials, 3)
        require_int("draws", self.draws, 1)


@dataclass(frozen=True)
class SeedRuns:
    """One rank's estimates under each seeding mode, in SEED_MODES order."""
    runs: tuple[SeededEstimates, ...]


def seeds_rank(ctx: Context, spec: SeedsSpec) -> SeedRuns:
    """Rank function: `seeded_estimates` under every seeding mode in turn."""
    return SeedRuns(tuple(seeded_estimates(ctx, spec.trials, spec.draws, mode=mode, seed=spec.seed)
                          for mode in SEED_MODES))


def compare_seeds(spec: SeedsSpec, results: list[SeedRuns]) -> Verdict:
    """Per mode: correlation of ranks 0 and 1, variance of one rank and of the average, against what each
    seeding predicts (shared: identical; independent: uncorrelated; antithetic: negatively correlated)."""
    world_size, trials = spec.world_size, spec.trials
    runs = {mode: [r.runs[i] for r in results] for i, mode in enumerate(SEED_MODES)}
    stats, checks = {}, []
    for mode, res in runs.items():
        a, b = res[0].mine, res[1].mine
        corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        per_rank = [_moments(r.mine) for r in res]
        single, single_rse = sum(v for v, _ in per_rank) / world_size, per_rank[0][1]
        avg, avg_rse = _moments(res[0].average)
        stats[mode] = SeedStats(mode=mode, corr_rank0_rank1=corr, var_one_rank=single, var_average=avg, var_ratio=avg * world_size / single,
                                rse=math.hypot(single_rse, avg_rse))
    s, i, t = stats["shared"], stats["independent"], stats["antithetic"]
    corr_tol = 4 / math.sqrt(trials)    # a sample correlation of R independent pairs has SE ~ 1/sqrt(R)
    checks.append(exact_check("shared seeds: every rank's estimates are identical",
                              [r.mine for r in runs["shared"]], [runs["shared"][0].mine] * world_size,
                              "same stream, same operations: bitwise equal"))
    checks.append(Check(name="shared seeds: var(average) / var(one rank) == 1",
                        error=abs(s.var_average / s.var_one_rank - 1),
                        tolerance=1e-9, reason="averaging N identical float64 values changes them by a few ulps at most"))
    checks.append(Check(name="independent seeds: |corr(rank 0, rank 1)|", error=abs(i.corr_rank0_rank1), tolerance=corr_tol,
                        reason=f"no correlation: within 4/sqrt(R) = {corr_tol:.3g} of 0 for R = {trials} trials"))
    checks.append(Check(name="independent seeds: N var(average) / var(one rank) == 1",
                        error=abs(i.var_ratio - 1), tolerance=4 * i.rse,
                        reason="variances add: within 4 relative standard errors of two sample variances"))
    ratio = s.var_average / i.var_average
    checks.append(Check(name=f"shared / independent var(average) == N = {world_size}",
                        error=abs(ratio / world_size - 1), tolerance=4 * math.hypot(s.rse, i.rse),
                        reason="identical draws: no averaging benefit; within 4 relative standard errors"))
    checks.append(Check(name="antithetic pairs: -corr(rank 0, rank 1) (must be significantly > 0)",
                        error=-t.corr_rank0_rank1, tolerance=corr_tol,
                        reason="f'(mu + s e) and f'(mu - s e) covary as 9(2s^4 - 4mu^2 s^2) < 0 here; "
                        "beyond 4/sqrt(R) of 0", must_differ=True))
    checks.append(Check(name="antithetic var(average) / independent var(average) (< 1)", error=t.var_average / i.var_average,
                        tolerance=1.0 - 4 * math.hypot(t.rse, i.rse), reason="lower by more than 4 relative standard errors"))
    return Verdict(checks=checks, params={"trials": trials, "draws": spec.draws, "mu": MU, "sigma": SIGMA},
                   data=stats)


SEEDS_DEMO = Experiment(name="latent-seeds", chapter="02", world_sizes=(2, 4),
                        title="Shared, independent and antithetic seeds: covariance and the variance of the average",
                        spec=lambda n: SeedsSpec(world_size=n), ranks=seeds_rank, compare=compare_seeds)


def seeds_demo(world_size: int, *, trials: int = 2_000, draws: int = 8, seed: int = 0) -> Report:
    """Covariance between ranks' estimates, and the variance of their average, per seeding mode."""
    return SEEDS_DEMO.run_spec(SeedsSpec(world_size=world_size, trials=trials, draws=draws, seed=seed))


DEMOS = [ESTIMATORS_DEMO, SEEDS_DEMO]


# --- exercise: the score-function estimate, averaged over ranks -----------------------------

def score_exercise_inputs(rank: int, world_size: int) -> tuple[float, float, torch.Tensor]:
    """(mu, sigma, z): 256 draws of z ~ N(mu, sigma^2) from this rank's own stream."""
    return MU, SIGMA, MU + SIGMA * torch.randn(256, generator=rank_generator(7, rank), dtype=torch.float64)


def score_exercise_solution(ctx: Context, mu: float, sigma: float, z: torch.Tensor) -> torch.Tensor:
    """Mean over every rank's draws of f(z) [(z-mu)/sigma^2, ((z-mu)^2 - sigma^2)/sigma^3]: shape (2,)."""
    d = z - mu
    per_draw = cubic(z)[:, None] * torch.stack([d / sigma ** 2, (d ** 2 - sigma ** 2) / sigma ** 3], dim=1)  # (M, 2)
    return ring_all_reduce(ctx, per_draw.sum(0), phase="score sums") / (z.numel() * ctx.world_size)


SCORE_FUNCTION = Exercise(
    name="score-function estimate",
    task="Given mu, sigma and this rank's draws z (float64, shape (M,)), return the score-function "
         "estimate of (dJ/dmu, dJ/dsigma) for J = E[z^3 - 2z], averaged over the draws of ALL ranks: "
         "a tensor of shape (2,), the same on every rank.",
    reference=score_exercise_solution,
    make_inputs=score_exercise_inputs,
    world_sizes=(1, 4),
    tolerance=1e-9,
    reason="float64 sums of 1,024 terms below 1e3 in another order: errors near 1e-12, a wrong formula is off by >0.1",
    hint="every rank must join the same collectives: sum locally, all-reduce the (2,) sum, divide by M * N.",
)
EXERCISES = [SCORE_FUNCTION]
