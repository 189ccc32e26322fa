"""Gradient estimators for stochastic latents, and the random streams ranks draw from.

Pure single-process math (torch, no communication): the exact gradients of
E[f(z)] for a Gaussian z and a cubic f (closed form) and for a Bernoulli
latent (enumeration), and per-draw estimates from the pathwise
(reparameterized), score-function (REINFORCE) and straight-through
estimators, plus the pitfall of differentiating a detached sample. Pathwise
and score-function estimates are unbiased under their assumptions;
straight-through is biased. The demos in wmdist.latents.demos spread the
draws over ranks and all-reduce the sums.
"""
from __future__ import annotations

import math
from typing import Literal, get_args

import torch

MU, SIGMA = 1.0, 0.5            # z ~ N(MU, SIGMA^2)
LOGIT, TARGET = 1.0, 0.3        # b ~ Bernoulli(sigmoid(LOGIT)), cost (b - TARGET)^2
SeedMode = Literal["independent", "shared", "antithetic"]
SEED_MODES: tuple[SeedMode, ...] = get_args(SeedMode)


def rank_generator(seed: int, rank: int, *, mode: SeedMode = "independent") -> torch.Generator:
    """This rank's random stream: its own (independent), everyone's (shared), or its pair's (antithetic)."""
    if mode not in SEED_MODES:
        raise ValueError(f"mode must be one of {SEED_MODES}, got {mode!r}")
    stream = {"independent": rank + 1, "shared": 0, "antithetic": rank // 2 + 1}[mode]
    return torch.Generator().manual_seed(seed * 10_007 + stream)


def draw_normal(gen: torch.Generator, shape: tuple[int, ...], rank: int, *, mode: SeedMode) -> torch.Tensor:
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


def bernoulli_cost(b: torch.Tensor, *, target: float = TARGET) -> torch.Tensor:
    """g(b) = (b - target)^2 for a 0/1 (or relaxed) sample b: a cost whose gradient in b is affine."""
    return (b - target) ** 2


def bernoulli_exact_grad(logit: float, *, target: float = TARGET) -> float:
    """dJ/dlogit by enumerating both outcomes: J = p g(1) + (1 - p) g(0), p = sigmoid(logit)."""
    w = torch.tensor(logit, dtype=torch.float64, requires_grad=True)
    p = torch.sigmoid(w)
    one, zero = torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    (p * bernoulli_cost(one, target=target) + (1 - p) * bernoulli_cost(zero, target=target)).backward()
    return float(w.grad)


def straight_through_expectation(logit: float, *, target: float = TARGET) -> float:
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


def exact_values(*, mu: float = MU, sigma: float = SIGMA, logit: float = LOGIT) -> tuple[float, ...]:
    """The exact expectation of each column of ESTIMATES."""
    gm, gs = gaussian_exact_grad(mu, sigma)
    gb = bernoulli_exact_grad(logit)
    return gm, gs, gm, gs, gb, gb, gaussian_objective(mu, sigma)
