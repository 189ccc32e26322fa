"""Stochastic latents across data-parallel ranks.

Three claims, each run on real ranks and checked:

1. Ranks may draw their latent noise from independent random streams: the
   gradient all-reduce still gives every rank the same update, so parameters
   stay identical (bitwise), and equal a single process that drew all the
   ranks' noise itself.
2. Gradient estimators for E[f(z)] differ: pathwise (reparameterized) and
   score-function estimates are unbiased under their assumptions, straight-
   through on a discrete latent is biased. Measured against exact gradients
   (closed form for a Gaussian and a cubic f, enumeration for a Bernoulli),
   with draws spread over ranks and their sums all-reduced.
3. Shared seeds correlate ranks' estimates; the variance of the average then
   depends on that covariance and can go up (identical draws) or down
   (antithetic draws). Seeding is a variance question, not a sync fix.

Plus mean substitution: f(E[z]) differs from E[f(z)] for the cubic, agrees for
an affine f. Statistics use float64; tolerances are multiples of the standard
error the same draws give (4 SE: a false alarm about 1 in 16,000).
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from wmdist import costs
from wmdist.costs import require_int
from wmdist.comm import Context, ring_all_reduce
from wmdist.exercises import Exercise
from wmdist.launch import run
from wmdist.models import WorldModelConfig, flat_params, make_batch, shard_batch
from wmdist.report import Check, Demo, Report, close_check, comm_rows, exact_check

MU, SIGMA = 1.0, 0.5            # z ~ N(MU, SIGMA^2)
LOGIT, TARGET = 1.0, 0.3        # b ~ Bernoulli(sigmoid(LOGIT)), cost (b - TARGET)^2
SEED_MODES = ("independent", "shared", "antithetic")


def rank_generator(seed: int, rank: int, mode: str = "independent") -> torch.Generator:
    """This rank's random stream: its own (independent), everyone's (shared), or its pair's (antithetic)."""
    if mode not in SEED_MODES:
        raise ValueError(f"mode must be one of {SEED_MODES}, got {mode!r}")
    stream = {"independent": rank + 1, "shared": 0, "antithetic": rank // 2 + 1}[mode]
    return torch.Generator().manual_seed(seed * 10_007 + stream)


def draw_normal(gen: torch.Generator, shape: tuple[int, ...], rank: int, mode: str) -> torch.Tensor:
    """Standard normal draws; in antithetic mode odd ranks negate their pair's draws.

    With an odd world size the last rank has no pair and keeps its own stream.
    """
    eps = torch.randn(shape, generator=gen, dtype=torch.float64)
    return -eps if mode == "antithetic" and rank % 2 else eps


# --- exact objectives ---------------------------------------------------------------

def cubic(z: torch.Tensor) -> torch.Tensor:
    """f(z) = z^3 - 2z: nonlinear, with E[f] known in closed form for a Gaussian z."""
    return z ** 3 - 2 * z


def gaussian_objective(mu: float, sigma: float) -> float:
    """E[f(z)], z ~ N(mu, sigma^2): E z^3 = mu^3 + 3 mu sigma^2, so mu^3 + 3 mu sigma^2 - 2 mu."""
    return mu ** 3 + 3 * mu * sigma ** 2 - 2 * mu


def gaussian_exact_grad(mu: float, sigma: float) -> tuple[float, float]:
    """(dJ/dmu, dJ/dsigma) of gaussian_objective."""
    return 3 * mu ** 2 + 3 * sigma ** 2 - 2, 6 * mu * sigma


def bernoulli_cost(b: torch.Tensor, target: float = TARGET) -> torch.Tensor:
    return (b - target) ** 2


def bernoulli_exact_grad(logit: float, target: float = TARGET) -> float:
    """dJ/dlogit by enumerating both outcomes: J = p g(1) + (1 - p) g(0), p = sigmoid(logit)."""
    w = torch.tensor(logit, dtype=torch.float64, requires_grad=True)
    p = torch.sigmoid(w)
    one, zero = torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    (p * bernoulli_cost(one, target) + (1 - p) * bernoulli_cost(zero, target)).backward()
    return float(w.grad)


def straight_through_expectation(logit: float, target: float = TARGET) -> float:
    """What straight-through averages to: E[g'(b)] p(1-p) = 2(p - t) p(1-p), since g' is affine."""
    p = 1 / (1 + math.exp(-logit))
    return 2 * (p - target) * p * (1 - p)


# --- per-draw gradient estimators (autograd, one row per draw) --------------------------

def _leaves(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, value).requires_grad_()      # one copy per draw: per-draw gradients


def pathwise_grads(mu: float, sigma: float, eps: torch.Tensor) -> torch.Tensor:
    """z = mu + sigma eps, differentiate f(z) through the sample: (M,) -> (M, 2)."""
    m, s = _leaves(mu, eps), _leaves(sigma, eps)
    cubic(m + s * eps).sum().backward()
    return torch.stack([m.grad, s.grad], dim=1)


def score_function_grads(mu: float, sigma: float, z: torch.Tensor) -> torch.Tensor:
    """f(z) d log p(z)/d(mu, sigma) with z held fixed (REINFORCE): (M,) -> (M, 2)."""
    m, s = _leaves(mu, z), _leaves(sigma, z)
    log_p = torch.distributions.Normal(m, s).log_prob(z.detach())
    (cubic(z.detach()) * log_p).sum().backward()
    return torch.stack([m.grad, s.grad], dim=1)


def detached_sample_grads(mu: float, sigma: float, z: torch.Tensor) -> torch.Tensor:
    """The pitfall: differentiate f of a sample that has no path back to (mu, sigma): (M,) -> (M, 2).

    Normal(mu, sigma).sample() returns such a tensor; autograd then reports
    gradient 0, which is not an estimate of anything but 0.
    """
    m, s = _leaves(mu, z), _leaves(sigma, z)
    sample = z.detach()                                         # what .sample() hands back: no graph
    rest = 0.0 * (m + s).sum()      # stands in for the rest of a model's loss: it keeps a graph, so nothing errors
    grads = torch.autograd.grad(cubic(sample).sum() + rest, [m, s])
    return torch.stack(grads, dim=1)


def bernoulli_score_grads(logit: float, u: torch.Tensor) -> torch.Tensor:
    """g(b) d log p(b)/dlogit, b = [u < p]: (M,) -> (M,)."""
    w = _leaves(logit, u)
    p = torch.sigmoid(w)
    b = (u < p).to(u.dtype).detach()
    (bernoulli_cost(b) * (b * torch.log(p) + (1 - b) * torch.log1p(-p))).sum().backward()
    return w.grad


def straight_through_grads(logit: float, u: torch.Tensor) -> torch.Tensor:
    """Forward the hard sample b, backward as if db/dp = 1: (M,) -> (M,). Biased."""
    w = _leaves(logit, u)
    p = torch.sigmoid(w)
    b = (u < p).to(u.dtype) + p - p.detach()
    bernoulli_cost(b).sum().backward()
    return w.grad


ESTIMATES = ("pathwise d/dmu", "pathwise d/dsigma", "score d/dmu", "score d/dsigma",
             "Bernoulli score", "straight-through", "f(z)")


def exact_values(mu: float = MU, sigma: float = SIGMA, logit: float = LOGIT) -> tuple[float, ...]:
    """The exact expectation of each column of ESTIMATES."""
    gm, gs = gaussian_exact_grad(mu, sigma)
    gb = bernoulli_exact_grad(logit)
    return gm, gs, gm, gs, gb, gb, gaussian_objective(mu, sigma)


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
    comm = comm_rows("bytes sent", [r[1]["bytes_sent"] for r in results],
                     [costs.ring_allreduce_bytes(2 * k, world_size, r, elem_size=8) for r in range(world_size)])
    stats = {n: {"exact": float(e), "mean": float(m), "bias": float(b), "variance": float(v), "se": float(s)}
             for n, e, m, b, v, s in zip(ESTIMATES, exact, mean, bias, var, se)}
    return Report("latent-estimators", world_size, checks, comm, seconds,
                  {"draws_per_rank": draws_per_rank, "mu": MU, "sigma": SIGMA, "logit": LOGIT, "target": TARGET},
                  {"stats": stats})


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

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
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
        stats[mode] = {"corr_rank0_rank1": corr, "cov_rank0_rank1": corr * single, "var_one_rank": single,
                       "var_average": avg, "var_average_x_N_over_var_one": avg * world_size / single,
                       "rse": math.hypot(single_rse, avg_rse)}
    s, i, t = stats["shared"], stats["independent"], stats["antithetic"]
    corr_tol = 4 / math.sqrt(trials)    # a sample correlation of R independent pairs has SE ~ 1/sqrt(R)
    checks.append(exact_check("shared seeds: every rank's estimates are identical",
                              [r[0] for r in runs["shared"]], [runs["shared"][0][0]] * world_size,
                              "same stream, same operations: bitwise equal"))
    checks.append(Check("shared seeds: var(average) / var(one rank) == 1",
                        abs(s["var_average"] / s["var_one_rank"] - 1),
                        1e-9, "averaging N identical float64 values changes them by a few ulps at most"))
    checks.append(Check("independent seeds: |corr(rank 0, rank 1)|", abs(i["corr_rank0_rank1"]), corr_tol,
                        f"no correlation: within 4/sqrt(R) = {corr_tol:.3g} of 0 for R = {trials} trials"))
    checks.append(Check("independent seeds: N var(average) / var(one rank) == 1",
                        abs(i["var_average_x_N_over_var_one"] - 1), 4 * i["rse"],
                        "variances add: within 4 relative standard errors of two sample variances"))
    ratio = s["var_average"] / i["var_average"]
    checks.append(Check(f"shared / independent var(average) == N = {world_size}",
                        abs(ratio / world_size - 1), 4 * math.hypot(s["rse"], i["rse"]),
                        "identical draws: no averaging benefit; within 4 relative standard errors"))
    checks.append(Check("antithetic pairs: -corr(rank 0, rank 1) (must be significantly > 0)",
                        -t["corr_rank0_rank1"], corr_tol,
                        "f'(mu + s e) and f'(mu - s e) covary as 9(2s^4 - 4mu^2 s^2) < 0 here; "
                        "beyond 4/sqrt(R) of 0", must_differ=True))
    checks.append(Check("antithetic var(average) / independent var(average) (< 1)", t["var_average"] / i["var_average"],
                        1.0 - 4 * math.hypot(t["rse"], i["rse"]), "lower by more than 4 relative standard errors"))
    return Report("latent-seeds", world_size, checks, [], seconds,
                  {"trials": trials, "draws": draws, "mu": MU, "sigma": SIGMA}, {"stats": stats})


# --- data-parallel training with per-rank latent noise ---------------------------------------

class StochasticLatentModel(nn.Module):
    """q(z|o) = N(mu(o), sigma(o)^2) per frame, decoder predicts the next frame from (z, a)."""

    def __init__(self, cfg: WorldModelConfig, latent_dim: int = 6):
        super().__init__()
        self.latent_dim = latent_dim
        self.encoder = nn.Linear(cfg.obs_dim, 2 * latent_dim)
        self.decoder = nn.Linear(latent_dim + cfg.action_dim, cfg.obs_dim)

    def loss(self, batch: dict[str, torch.Tensor], eps: torch.Tensor) -> torch.Tensor:
        """Reconstruction of next_obs plus 0.1 KL to N(0, 1); eps (B, T, Z) is the latent noise."""
        mu, log_std = self.encoder(batch["obs"]).chunk(2, dim=-1)                   # (B, T, Z) each
        z = mu + log_std.exp() * eps                                                # (B, T, Z)
        pred = self.decoder(torch.cat([z, batch["actions"]], dim=-1))               # (B, T, O)
        kl = 0.5 * (mu ** 2 + (2 * log_std).exp() - 1 - 2 * log_std).sum(-1)        # (B, T)
        return (pred - batch["next_obs"]).pow(2).mean() + 0.1 * kl.mean()


def _setup(seed: int, rows: int):
    cfg = WorldModelConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = StochasticLatentModel(cfg)
    return model, make_batch(rows, steps=4, seed=seed, cfg=cfg)


def _sgd(model: nn.Module, flat_grad: torch.Tensor, lr: float) -> None:
    """theta <- theta - lr * g, with g given as one (P,) buffer."""
    with torch.no_grad():
        vector_to_parameters(flat_params(model) - lr * flat_grad, model.parameters())


def dp_train(ctx: Context, steps: int, rows_per_rank: int, seed: int = 0, lr: float = 0.1,
             mode: str = "independent") -> tuple[torch.Tensor, dict]:
    """Rank function: SGD on this rank's shard with its own latent noise; gradients ring-all-reduced."""
    model, batch = _setup(seed, rows_per_rank * ctx.world_size)
    shard = shard_batch(batch, [rows_per_rank] * ctx.world_size, ctx.rank)
    gen = rank_generator(seed, ctx.rank, mode)
    for _ in range(steps):
        eps = torch.randn(rows_per_rank, 4, model.latent_dim, generator=gen)         # (b, T, Z)
        grads = torch.autograd.grad(model.loss(shard, eps), list(model.parameters()))
        flat = parameters_to_vector(grads)                                           # (P,)
        _sgd(model, ring_all_reduce(ctx, flat, phase="gradients") / ctx.world_size, lr)
    return flat_params(model), ctx.ledger.totals()


def dp_reference(world_size: int, steps: int, rows_per_rank: int, seed: int = 0, lr: float = 0.1,
                 mode: str = "independent") -> torch.Tensor:
    """One process, the whole batch, every rank's noise drawn from every rank's stream, in rank order."""
    model, batch = _setup(seed, rows_per_rank * world_size)
    gens = [rank_generator(seed, r, mode) for r in range(world_size)]
    for _ in range(steps):
        eps = torch.cat([torch.randn(rows_per_rank, 4, model.latent_dim, generator=g) for g in gens])  # (B, T, Z)
        grads = torch.autograd.grad(model.loss(batch, eps), list(model.parameters()))
        _sgd(model, parameters_to_vector(grads), lr)
    return flat_params(model)


def dp_latents_demo(world_size: int, steps: int = 3, rows_per_rank: int = 2, seed: int = 0) -> Report:
    """Independent latent streams per rank, identical parameters after every all-reduced step."""

    require_int("steps", steps, 1)
    require_int("rows_per_rank", rows_per_rank, 1)
    start = time.perf_counter()
    results = run(dp_train, world_size, steps, rows_per_rank, seed)
    seconds = time.perf_counter() - start
    expected = dp_reference(world_size, steps, rows_per_rank, seed)
    numel = expected.numel()
    checks = [exact_check("parameters identical on every rank", [r[0] for r in results], [results[0][0]] * world_size,
                          "every rank applies the same all-reduced gradient")]
    checks.append(close_check("rank 0 == one process drawing every rank's noise", results[0][0], expected, 1e-5,
                              "float32 means taken in another order (shard means then ring sum vs one batch "
                              "mean): ~1e-7 relative per step on O(1) weights, 3 steps of lr 0.1"))
    comm = comm_rows("bytes sent", [r[1]["bytes_sent"] for r in results],
                     [steps * costs.ring_allreduce_bytes(numel, world_size, r) for r in range(world_size)])
    return Report("latent-dp", world_size, checks, comm, seconds,
                  {"steps": steps, "rows_per_rank": rows_per_rank, "parameters": numel, "mode": "independent"})


DEMOS = [
    Demo("latent-dp", "Independent latent noise per rank: identical parameters after all-reduced steps",
         dp_latents_demo, world_sizes=(1, 2, 4), chapter="02"),
    Demo("latent-estimators", "Pathwise, score-function and straight-through gradients vs the exact gradient",
         estimators_demo, world_sizes=(1, 2, 4), chapter="02"),
    Demo("latent-seeds", "Shared, independent and antithetic seeds: covariance and the variance of the average",
         seeds_demo, world_sizes=(2, 4), chapter="02", min_world_size=2),
]


# --- exercise: the score-function estimate, averaged over ranks -----------------------------

def score_exercise_inputs(rank: int, world_size: int) -> tuple[float, float, torch.Tensor]:
    """(mu, sigma, z): 256 draws of z ~ N(mu, sigma^2) from this rank's own stream."""
    return MU, SIGMA, MU + SIGMA * torch.randn(256, generator=rank_generator(7, rank), dtype=torch.float64)


def score_exercise_reference(ctx: Context, mu: float, sigma: float, z: torch.Tensor) -> torch.Tensor:
    """Mean over every rank's draws of f(z) [(z-mu)/sigma^2, ((z-mu)^2 - sigma^2)/sigma^3]: shape (2,)."""
    d = z - mu
    per_draw = cubic(z)[:, None] * torch.stack([d / sigma ** 2, (d ** 2 - sigma ** 2) / sigma ** 3], dim=1)  # (M, 2)
    return ring_all_reduce(ctx, per_draw.sum(0), phase="score sums") / (z.numel() * ctx.world_size)


SCORE_FUNCTION = Exercise(
    name="score-function estimate",
    task="Given mu, sigma and this rank's draws z (float64, shape (M,)), return the score-function "
         "estimate of (dJ/dmu, dJ/dsigma) for J = E[z^3 - 2z], averaged over the draws of ALL ranks: "
         "a tensor of shape (2,), the same on every rank.",
    reference=score_exercise_reference,
    make_inputs=score_exercise_inputs,
    world_sizes=(1, 4),
    tolerance=1e-9,
    reason="float64 sums of 1,024 terms below 1e3 in another order: errors near 1e-12, a wrong formula is off by >0.1",
    hint="every rank must join the same collectives: sum locally, all-reduce the (2,) sum, divide by M * N.",
)
