"""Tiny world-model parts that every technique runs on.

Small enough to train in milliseconds on one CPU core, shaped like the real
thing: a frame encoder, a recurrent latent dynamics cell driven by actions,
and heads that predict the next frame and the reward. Shapes use B (batch),
T (time steps), O (observation features), A (action features), Z (latent).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from wmdist.costs.validate import require_fields
from wmdist.models import seeded


@dataclass(frozen=True, kw_only=True)
class WorldModelConfig:
    """Sizes of the tiny world model (defaults give 2,105 parameters)."""
    obs_dim: int = 16        # O: features of one (flattened, tiny) frame
    action_dim: int = 4      # A: action features
    latent_dim: int = 24     # Z: encoder output and recurrent state width
    batchnorm: bool = False  # put a BatchNorm in the encoder (for the local-statistics pitfall)

    def __post_init__(self) -> None:
        require_fields(self, ("obs_dim", "action_dim", "latent_dim"), 1)


class FrameEncoder(nn.Module):
    """Frame features -> latent: Linear, optional BatchNorm, tanh."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.obs_dim, cfg.latent_dim)
        self.norm = nn.BatchNorm1d(cfg.latent_dim) if cfg.batchnorm else nn.Identity()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:      # (B, O) -> (B, Z)
        return torch.tanh(self.norm(self.proj(obs)))


class DynamicsCell(nn.Module):
    """h_t = tanh(W [h_{t-1}, z_t, a_t] + b): a nonlinear recurrence, as in Dreamer-style models."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.step = nn.Linear(2 * cfg.latent_dim + cfg.action_dim, cfg.latent_dim)

    def forward(self, h: torch.Tensor, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:  # (B, Z) each -> (B, Z)
        return torch.tanh(self.step(torch.cat([h, z, a], dim=-1)))


class TinyWorldModel(nn.Module):
    """Encode each frame, roll the latent state forward, predict next frame and reward."""

    def __init__(self, cfg: WorldModelConfig | None = None):
        super().__init__()
        self.cfg = cfg or WorldModelConfig()
        self.encoder = FrameEncoder(self.cfg)
        self.dynamics = DynamicsCell(self.cfg)
        self.decoder = nn.Linear(self.cfg.latent_dim, self.cfg.obs_dim)
        self.reward = nn.Linear(self.cfg.latent_dim, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (B, T, O), actions (B, T, A) -> predicted next frames (B, T, O), rewards (B, T)."""
        B, T, _ = obs.shape
        z = self.encoder(obs.reshape(B * T, -1)).reshape(B, T, -1)     # (B, T, Z)
        h = obs.new_zeros(B, self.cfg.latent_dim)                     # (B, Z)
        states = []
        for t in range(T):
            h = self.dynamics(h, z[:, t], actions[:, t])
            states.append(h)
        hs = torch.stack(states, dim=1)                               # (B, T, Z)
        return self.decoder(hs), self.reward(hs).squeeze(-1)

    def per_example_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared error of next-frame and reward predictions, one value per sequence: (B,)."""
        pred_obs, pred_rew = self(batch["obs"], batch["actions"])
        frame_err = (pred_obs - batch["next_obs"]).pow(2).mean(dim=(1, 2))   # (B,)
        reward_err = (pred_rew - batch["reward"]).pow(2).mean(dim=1)         # (B,)
        return frame_err + reward_err

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean of per_example_loss over the batch: a scalar."""
        return self.per_example_loss(batch).mean()


def make_model(*, seed: int = 0, cfg: WorldModelConfig | None = None) -> TinyWorldModel:
    """A TinyWorldModel whose initial weights depend only on `seed` (same on every rank)."""
    return seeded(lambda: TinyWorldModel(cfg), seed)


def make_batch(batch_size: int, *, seq_len: int = 6, seed: int = 0,
               cfg: WorldModelConfig | None = None) -> dict[str, torch.Tensor]:
    """A synthetic, deterministic batch of trajectories from a fixed random linear system.

    Keys: obs (B, T, O), actions (B, T, A), next_obs (B, T, O), reward (B, T).
    Row i of a batch depends only on (seed, i), so a shard is a slice.
    """
    cfg = cfg or WorldModelConfig()
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    g = torch.Generator().manual_seed(1234)                     # the "environment": same for every seed
    A = torch.randn(cfg.obs_dim, cfg.obs_dim, generator=g) * (0.9 / cfg.obs_dim ** 0.5)
    Bm = torch.randn(cfg.action_dim, cfg.obs_dim, generator=g) * 0.5
    w_r = torch.randn(cfg.obs_dim, generator=g) / cfg.obs_dim ** 0.5
    rows = []
    for i in range(batch_size):
        gi = torch.Generator().manual_seed(seed * 100_003 + i)
        x = torch.randn(cfg.obs_dim, generator=gi)
        acts = torch.randn(seq_len + 1, cfg.action_dim, generator=gi)
        frames = [x]
        for t in range(seq_len):
            x = torch.tanh(x @ A + acts[t] @ Bm)
            frames.append(x)
        rows.append((torch.stack(frames), acts[:seq_len]))
    frames = torch.stack([r[0] for r in rows])                  # (B, T+1, O)
    actions = torch.stack([r[1] for r in rows])                 # (B, T, A)
    return {"obs": frames[:, :-1], "actions": actions, "next_obs": frames[:, 1:],
            "reward": frames[:, 1:] @ w_r}


def shard_batch(batch: dict[str, torch.Tensor], sizes: list[int], rank: int) -> dict[str, torch.Tensor]:
    """Rows of `batch` that rank `rank` gets when rank r takes sizes[r] consecutive rows."""
    if sum(sizes) != batch["obs"].shape[0]:
        raise ValueError(f"shard sizes {sizes} do not add up to the batch size {batch['obs'].shape[0]}")
    start = sum(sizes[:rank])
    return {k: v[start:start + sizes[rank]] for k, v in batch.items()}


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters in parameter order, detached, as one buffer: (P,)."""
    return parameters_to_vector(model.parameters()).detach()


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All gradients in parameter order, as one buffer: (P,)."""
    return parameters_to_vector(p.grad for p in model.parameters())


def set_flat_grads(model: nn.Module, flat: torch.Tensor) -> None:
    """Write a (P,) buffer back into the .grad of each parameter."""
    params = list(model.parameters())
    for p, piece in zip(params, torch.split(flat, [p.numel() for p in params])):
        p.grad.copy_(piece.view_as(p))


def on_meta(model: nn.Module) -> nn.Module:
    """`model` moved to the meta device (code and shapes, no numbers), its tied parameters still tied.

    Module.to("meta") makes a new Parameter for each place a parameter appears, so a weight shared by two
    layers (tied embeddings) would become two, and functional_call would fill in only the first: the second
    would stay a meta tensor. The aliases are pointed back at the first parameter by name.
    """
    first: dict[int, str] = {}
    aliases: list[tuple[str, str]] = []                         # (alias name, name of the first occurrence)
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases.append((name, first[id(p)]))
        else:
            first[id(p)] = name
    model = model.to("meta")
    for alias, name in aliases:
        owner, _, attr = alias.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(name))
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def linear_term_sums(model: nn.Module, loss: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
    """Run loss(model).backward() and return, per parameter entry, the sum of |terms| its gradient adds up: (P,).

    Every nn.Linear gradient is a sum over the rows its input had (batch x
    time, and one block of rows per call of a module used at every time
    step): the weight entry (j, i) adds x[row, i] * dy[row, j], the bias
    entry j adds dy[row, j]. Summing |x| |dy| (float64) instead gives the
    partial-sum bound that `costs.reordered_sum_bound` needs for "the same
    gradient summed in another order" (per shard, then across ranks). The
    gradients themselves are left in .grad as usual. Entries of parameters
    that are not in an nn.Linear (e.g. BatchNorm's) are 0: not covered.
    """
    sums = {id(p): torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()}
    inputs: dict[int, list[torch.Tensor]] = {}

    def keep_input(mod: nn.Module, args: tuple, _out: torch.Tensor) -> None:
        inputs.setdefault(id(mod), []).append(args[0].detach().reshape(-1, args[0].shape[-1]).abs().double())

    def add_terms(mod: nn.Module, _grad_in: tuple, grad_out: tuple) -> None:
        x = inputs[id(mod)].pop()                                           # (rows, in): backward runs calls in reverse
        dy = grad_out[0].detach().reshape(-1, grad_out[0].shape[-1]).abs().double()   # (rows, out)
        sums[id(mod.weight)] += dy.T @ x
        if mod.bias is not None:
            sums[id(mod.bias)] += dy.sum(0)

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    handles = [h for m in linears for h in (m.register_forward_hook(keep_input), m.register_full_backward_hook(add_terms))]
    try:
        with warnings.catch_warnings():      # the first layer's input needs no gradient: torch says so, that is fine
            warnings.simplefilter("ignore", UserWarning)
            loss(model).backward()
    finally:
        for h in handles:
            h.remove()
    return torch.cat([sums[id(p)].reshape(-1) for p in model.parameters()])
