"""Estimators and seeds on real ranks: draws spread over ranks, sums all-reduced, checked statistically.

- latent-estimators: bias and variance of the pathwise, score-function and
  straight-through estimators against the exact gradient (straight-through's
  bias is shown significant).
- latent-seeds: shared, independent and antithetic seeds: the covariance
  between ranks' estimates decides the variance of their average, which can
  go up or down. Seeding is a variance question, not a synchronization fix.

Statistics use float64; tolerances are multiples of the standard error the
same draws give (4 SE: a false alarm about 1 in 16,000).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.comm import Context, ring_all_reduce
from wmdist.costs import require_int
from wmdist.exercises import Exercise
from wmdist.latents.estimators import (ESTIMATES, LOGIT, MU, SEED_MODES, SIGMA, TARGET, bernoulli_score_grads, cubic,
                                       draw_normal, exact_values, pathwise_grads, rank_generator,
                                       score_function_grads, straight_through_expectation, straight_through_grads)
from wmdist.report import Check, Demo, Report, counts_per_rank, exact_check
from wmdist.runtime import run


@dataclass(frozen=True)
class EstimatorStats:
    """One estimator over all draws: its exact expectation, sample mean, bias, variance per draw, standard error."""
    name: str
    exact: float
    mean: float
    bias: float
    variance: float
    se: float

    @property
    def bias_in_se(self) -> float:
        return self.bias / self.se


@dataclass(frozen=True)
class SeedStats:
    """One seeding mode: correlation of ranks 0 and 1, variances of one rank and of the rank average."""
    mode: str
    corr_rank0_rank1: float
    cov_rank0_rank1: float
    var_one_rank: float
    var_average: float
    var_ratio: float          # N var(average) / var(one rank): 1 for independent ranks
    rse: float                # relative standard error of that ratio


def estimator_sums(ctx: Context, draws: int, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """Rank function: this rank's draws of every estimator; sums and sums of squares all-reduced."""
    gen = rank_generator(seed, ctx.rank)
    eps = torch.randn(draws, generator=gen, dtype=torch.float64)          # (M,)
    u = torch.rand(draws, generator=gen, dtype=torch.float64)             # (M,)
    z = MU + SIGMA * eps
    cols = torch.cat([pathwise_grads(MU, SIGMA, eps), score_function_grads(MU, SIGMA, z),
                      bernoulli_score_grads(LOGIT, u)[:, None], straight_through_grads(LOGIT, u)[:, None],
                      cubic(z)[:, None]], dim=1)                          # (M, 7)
    sums = torch.cat([cols.sum(0), cols.pow(2).sum(0)])                   # (14,)
    return ring_all_reduce(ctx, sums, phase="estimator sums"), ctx.ledger.totals()


def estimators_demo(world_size: int, draws_per_rank: int = 20_000, seed: int = 0) -> Report:
    """Bias and variance of each estimator against the exact gradient, draws spread over ranks."""

    require_int("draws_per_rank", draws_per_rank, 2)
    start = time.perf_counter()
    results = run(estimator_sums, world_size, draws_per_rank, seed)
    seconds = time.perf_counter() - start
    total = results[0][0]
    count = draws_per_rank * world_size
    k = len(ESTIMATES)
    mean = total[:k] / count
    var = (total[k:] / count - mean ** 2) * count / (count - 1)
    se = (var / count).sqrt()
    exact = torch.tensor(exact_values(), dtype=torch.float64)
    bias = mean - exact
    why = f"unbiased estimator: |mean - exact| within 4 standard errors of {count} draws"
    checks = [Check(f"{name}: |bias| vs exact {float(e):.4g}", abs(float(b)), 4 * float(s), why)
              for name, e, b, s in zip(ESTIMATES, exact, bias, se) if name != "straight-through"]
    st = ESTIMATES.index("straight-through")
    checks.append(Check("straight-through: |bias| vs exact (must be significant)", abs(float(bias[st])),
                        4 * float(se[st]), "biased estimator: its mean sits outside 4 standard errors of the exact "
                        "gradient", must_differ=True))
    checks.append(Check("straight-through: mean vs its biased expectation 2(p-t)p(1-p)",
                        abs(float(mean[st]) - straight_through_expectation(LOGIT)), 4 * float(se[st]),
                        "the bias is the predicted one: within 4 standard errors"))
    checks.append(exact_check("every rank holds the same all-reduced sums", [r[0] for r in results],
                              [total] * world_size, "the ring's all-gather copies one reduced chunk to all"))
    exact_counts = counts_per_rank("bytes sent", [r[1]["bytes_sent"] for r in results],
                            [costs.ring_allreduce_bytes(2 * k, world_size, r, elem_size=8) for r in range(world_size)])
    stats = {n: EstimatorStats(n, float(e), float(m), float(b), float(v), float(s))
             for n, e, m, b, v, s in zip(ESTIMATES, exact, mean, bias, var, se)}
    return Report("latent-estimators", world_size, checks, exact_counts, seconds,
                  {"draws_per_rank": draws_per_rank, "mu": MU, "sigma": SIGMA, "logit": LOGIT, "target": TARGET},
                  stats)


# --- shared vs independent seeds ------------------------------------------------------

def seeded_estimates(ctx: Context, mode: str, trials: int, draws: int,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank function: `trials` pathwise estimates of dJ/dmu, each a mean of `draws` draws,
    from this rank's stream under `mode`; and their average over ranks (all-reduced)."""
    eps = draw_normal(rank_generator(seed, ctx.rank, mode), (trials, draws), ctx.rank, mode)   # (R, m)
    mine = pathwise_grads(MU, SIGMA, eps.reshape(-1))[:, 0].reshape(trials, draws).mean(1)     # (R,)
    return mine, ring_all_reduce(ctx, mine, phase=f"average ({mode})") / ctx.world_size


def _moments(x: torch.Tensor) -> tuple[float, float]:
    """Sample variance and the relative standard error of that variance, sqrt((kurtosis - 1)/R)."""
    c = x - x.mean()
    var = float(c.pow(2).mean())
    kurt = float(c.pow(4).mean()) / var ** 2
    return var * len(x) / (len(x) - 1), math.sqrt(max(kurt - 1, 0.0) / len(x))


def seeds_demo(world_size: int, trials: int = 2_000, draws: int = 8, seed: int = 0) -> Report:
    """Covariance between ranks' estimates, and the variance of their average, per seeding mode."""

    if require_int("world_size", world_size, 1) < 2:
        raise ValueError(f"seeds_demo needs world_size >= 2 (it correlates rank 0 with rank 1), got {world_size!r}")
    require_int("trials", trials, 3)
    require_int("draws", draws, 1)
    start = time.perf_counter()
    runs = {mode: run(seeded_estimates, world_size, mode, trials, draws, seed) for mode in SEED_MODES}
    seconds = time.perf_counter() - start
    stats, checks = {}, []
    for mode, res in runs.items():
        a, b = res[0][0], res[1][0]
        corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        per_rank = [_moments(r[0]) for r in res]
        single, single_rse = sum(v for v, _ in per_rank) / world_size, per_rank[0][1]
        avg, avg_rse = _moments(res[0][1])
        stats[mode] = SeedStats(mode, corr, corr * single, single, avg, avg * world_size / single,
                                math.hypot(single_rse, avg_rse))
    s, i, t = stats["shared"], stats["independent"], stats["antithetic"]
    corr_tol = 4 / math.sqrt(trials)    # a sample correlation of R independent pairs has SE ~ 1/sqrt(R)
    checks.append(exact_check("shared seeds: every rank's estimates are identical",
                              [r[0] for r in runs["shared"]], [runs["shared"][0][0]] * world_size,
                              "same stream, same operations: bitwise equal"))
    checks.append(Check("shared seeds: var(average) / var(one rank) == 1",
                        abs(s.var_average / s.var_one_rank - 1),
                        1e-9, "averaging N identical float64 values changes them by a few ulps at most"))
    checks.append(Check("independent seeds: |corr(rank 0, rank 1)|", abs(i.corr_rank0_rank1), corr_tol,
                        f"no correlation: within 4/sqrt(R) = {corr_tol:.3g} of 0 for R = {trials} trials"))
    checks.append(Check("independent seeds: N var(average) / var(one rank) == 1",
                        abs(i.var_ratio - 1), 4 * i.rse,
                        "variances add: within 4 relative standard errors of two sample variances"))
    ratio = s.var_average / i.var_average
    checks.append(Check(f"shared / independent var(average) == N = {world_size}",
                        abs(ratio / world_size - 1), 4 * math.hypot(s.rse, i.rse),
                        "identical draws: no averaging benefit; within 4 relative standard errors"))
    checks.append(Check("antithetic pairs: -corr(rank 0, rank 1) (must be significantly > 0)",
                        -t.corr_rank0_rank1, corr_tol,
                        "f'(mu + s e) and f'(mu - s e) covary as 9(2s^4 - 4mu^2 s^2) < 0 here; "
                        "beyond 4/sqrt(R) of 0", must_differ=True))
    checks.append(Check("antithetic var(average) / independent var(average) (< 1)", t.var_average / i.var_average,
                        1.0 - 4 * math.hypot(t.rse, i.rse), "lower by more than 4 relative standard errors"))
    return Report("latent-seeds", world_size, checks, [], seconds,
                  {"trials": trials, "draws": draws, "mu": MU, "sigma": SIGMA}, stats)

DEMOS = [
    Demo("latent-estimators", "Pathwise, score-function and straight-through gradients vs the exact gradient",
         estimators_demo, world_sizes=(1, 2, 4), chapter="02"),
    Demo("latent-seeds", "Shared, independent and antithetic seeds: covariance and the variance of the average",
         seeds_demo, world_sizes=(2, 4), chapter="02", min_world_size=2),
]


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
