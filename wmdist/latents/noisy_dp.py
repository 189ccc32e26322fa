"""Data-parallel training with stochastic latents: every rank draws its own latent noise.

A small stochastic-latent model (a Gaussian encoder over frames, a decoder
from the sampled latent and the action to the next frame) trained by plain
SGD. On ranks each one takes its shard of the batch and draws its latent
noise from its own stream (estimators.rank_generator); the gradient
all-reduce still hands every rank the same update, so parameters stay
identical without synchronizing any random numbers. `noisy_single_process`
is the one-process run that draws every rank's noise, in rank order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from wmdist.comm import Context, ring_all_reduce
from wmdist.latents.estimators import SeedMode, rank_generator
from wmdist.models.world import WorldModelConfig, flat_params, make_batch, shard_batch
from wmdist.models import seeded


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
    model = seeded(lambda: StochasticLatentModel(cfg), seed)
    return model, make_batch(rows, seq_len=4, seed=seed, cfg=cfg)


def _sgd(model: nn.Module, flat_grad: torch.Tensor, lr: float) -> None:
    """theta <- theta - lr * g, with g given as one (P,) buffer."""
    with torch.no_grad():
        vector_to_parameters(flat_params(model) - lr * flat_grad, model.parameters())


@dataclass(frozen=True)
class NoisyDPRun:
    """One rank's parameters after the all-reduced steps, and the bytes its ledger sent."""
    params: torch.Tensor        # (P,) flat
    bytes_sent: int


def noisy_dp_train(ctx: Context, steps: int, rows_per_rank: int, *, seed: int = 0, lr: float = 0.1,
                   mode: SeedMode = "independent") -> NoisyDPRun:
    """Rank function: SGD on this rank's shard with its own latent noise; gradients ring-all-reduced."""
    model, batch = _setup(seed, rows_per_rank * ctx.world_size)
    shard = shard_batch(batch, [rows_per_rank] * ctx.world_size, ctx.rank)
    gen = rank_generator(seed, ctx.rank, mode=mode)
    for _ in range(steps):
        eps = torch.randn(rows_per_rank, 4, model.latent_dim, generator=gen)         # (b, T, Z)
        grads = torch.autograd.grad(model.loss(shard, eps), list(model.parameters()))
        flat = parameters_to_vector(grads)                                           # (P,)
        _sgd(model, ring_all_reduce(ctx, flat, phase="gradients") / ctx.world_size, lr)
    return NoisyDPRun(flat_params(model), ctx.ledger.totals()["bytes_sent"])


def noisy_single_process(world_size: int, steps: int, rows_per_rank: int, *, seed: int = 0, lr: float = 0.1,
                         mode: SeedMode = "independent") -> torch.Tensor:
    """One process, the whole batch, every rank's noise drawn from every rank's stream, in rank order."""
    model, batch = _setup(seed, rows_per_rank * world_size)
    gens = [rank_generator(seed, r, mode=mode) for r in range(world_size)]
    for _ in range(steps):
        eps = torch.cat([torch.randn(rows_per_rank, 4, model.latent_dim, generator=g) for g in gens])  # (B, T, Z)
        grads = torch.autograd.grad(model.loss(batch, eps), list(model.parameters()))
        _sgd(model, parameters_to_vector(grads), lr)
    return flat_params(model)
