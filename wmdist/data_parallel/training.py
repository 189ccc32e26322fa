"""Replicated data parallelism for the tiny world model: the rank function and its single-process reference.

Every rank holds the whole model and gets a shard of the global batch. After
backward each rank flattens its gradients into one buffer, the ranks sum the
buffers with the counted ring all-reduce, and every rank takes the same
optimizer step. Done right, that step is the full-batch step up to float32
rounding (the sums happen in another order), never bitwise.

How the local losses are scaled decides what the sum means (`weighting`):
  "mean"         local mean loss, sum / N: the plain mean of worker gradients,
                 right only when every shard has as many examples
  "examples"     local summed loss / global example count: right for any shards
  "tokens-local" masked sequences, local per-token mean, sum / N: wrong when
                 ranks hold different numbers of valid time steps
  "tokens"       masked sequences, local token sum / global valid-token count
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn

from wmdist import costs
from wmdist.comm import Context, all_reduce, ring_all_reduce
from wmdist.models.world import (WorldModelConfig, flat_grads, flat_params, linear_term_sums, make_batch, make_model,
                           set_flat_grads, shard_batch)

Weighting = Literal["mean", "examples", "tokens-local", "tokens"]
Optimizer = Literal["sgd", "adam"]
WEIGHTINGS: tuple[Weighting, ...] = get_args(Weighting)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """One data-parallel training run: global batch, its split over ranks, optimizer, steps."""
    steps: int = 3
    batch_size: int = 16                 # global examples per step
    seq_len: int = 6                  # T of every sequence
    sizes: tuple[int, ...] | None = None  # examples per rank; None splits evenly
    weighting: Weighting = "mean"
    optimizer: Optimizer = "sgd"             # "sgd" (momentum 0.9) or "adam"
    lr: float = 0.05
    seed: int = 0
    batchnorm: bool = False              # local BatchNorm in the encoder (a pitfall)
    skew_momentum: bool = False          # ranks > 0 start with nonzero momentum (a pitfall)

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("batch_size", 1), ("seq_len", 1), ("seed", 0)):
            costs.require_int(name, getattr(self, name), low)
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if costs.require_real("lr", self.lr) == 0:
            raise ValueError("lr must be > 0")
        if self.sizes is not None:
            if not isinstance(self.sizes, tuple) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                        for s in self.sizes):
                raise TypeError(f"sizes must be a tuple of integers >= 0, got {self.sizes!r}")
            if sum(self.sizes) != self.batch_size:
                raise ValueError(f"sizes {self.sizes} must add up to batch_size {self.batch_size}")
        if self.skew_momentum and self.optimizer != "sgd":
            raise ValueError("skew_momentum needs optimizer='sgd'")

    def shard_sizes(self, world_size: int) -> list[int]:
        """Examples per rank; an even split puts the remainder on the first ranks."""
        costs.require_int("world_size", world_size, 1)
        if self.sizes is None:
            return costs.ring_chunk_sizes(self.batch_size, world_size)
        if len(self.sizes) != world_size:
            raise ValueError(f"sizes {self.sizes} has {len(self.sizes)} entries, world_size is {world_size}")
        return list(self.sizes)


def descending_sizes(world_size: int) -> tuple[int, ...]:
    """Unequal shards 2N-1, 2N-3, ..., 1 (7/5/3/1 on 4 ranks); they add up to N^2."""
    n = costs.require_int("world_size", world_size, 1)
    return tuple(2 * (n - r) - 1 for r in range(n))


def valid_lengths(batch_size: int, seq_len: int) -> torch.Tensor:
    """Valid time steps of each sequence: full at the front of the batch, short at the back."""
    i = torch.arange(batch_size)
    return (seq_len - (i * seq_len) // batch_size).clamp(min=1)                # (B,)


def token_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Frame + reward squared error per (sequence, time step): (B, T)."""
    pred_obs, pred_rew = model(batch["obs"], batch["actions"])
    return (pred_obs - batch["next_obs"]).pow(2).mean(-1) + (pred_rew - batch["reward"]).pow(2)


def make_optimizer(model: nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=spec.lr)


def step_batch(spec: TrainSpec, step: int) -> dict[str, torch.Tensor]:
    """The global batch of one step (every rank and the reference draw the same)."""
    batch = make_batch(spec.batch_size, seq_len=spec.seq_len, seed=spec.seed * 1000 + step)
    if spec.weighting.startswith("tokens"):
        batch["lengths"] = valid_lengths(spec.batch_size, spec.seq_len)
    return batch


def shard_loss(model: nn.Module, shard: dict[str, torch.Tensor], spec: TrainSpec,
               n_total: float) -> torch.Tensor:
    """This rank's loss, scaled so that summing gradients over ranks means what `weighting` says.

    `n_total` is the global count the weighting divides by (examples or valid
    tokens); the "mean" and "tokens-local" weightings ignore it and divide the
    sum by N afterwards instead.
    """
    if spec.weighting in ("mean", "examples"):
        per_example = model.per_example_loss(shard)                          # (b,)
        return per_example.mean() if spec.weighting == "mean" else per_example.sum() / n_total
    mask = torch.arange(spec.seq_len) < shard["lengths"][:, None]           # (b, T)
    total = (token_losses(model, shard) * mask).sum()
    return total / mask.sum() if spec.weighting == "tokens-local" else total / n_total


def global_count(ctx: Context, shard: dict[str, torch.Tensor], spec: TrainSpec, step: int) -> float:
    """Examples or valid tokens in the whole batch, summed over ranks by a counted all-reduce."""
    if spec.weighting == "examples":
        local = float(shard["obs"].shape[0])
    elif spec.weighting == "tokens":
        local = float(shard["lengths"].sum())
    else:
        return 1.0
    count = all_reduce(ctx, torch.tensor([local], dtype=torch.float64), phase=f"step {step}/count")
    return float(count.item())


def _skew_momentum(model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    """Give ranks > 0 a nonzero momentum buffer, as if restored from another checkpoint."""
    if rank == 0:
        return
    g = torch.Generator().manual_seed(rank)
    for p in model.parameters():
        opt.state[p]["momentum_buffer"] = 0.01 * torch.randn(p.shape, generator=g)


@dataclass(kw_only=True, frozen=True)
class DPRun:
    """What one rank of a data-parallel run ends with."""
    grad0: torch.Tensor                  # (P,) the synchronized step-0 gradient it applied
    params: torch.Tensor                 # (P,) its parameters after the last step
    running_mean: torch.Tensor | None    # its BatchNorm running mean (None without BatchNorm)
    bytes_per_step: tuple[int, ...]      # ring bytes it sent in each step's gradient all-reduce


def dp_train(ctx: Context, spec: TrainSpec) -> DPRun:
    """Rank function: train `spec.steps` steps with gradients summed by the counted ring all-reduce."""
    model = make_model(seed=spec.seed, cfg=WorldModelConfig(batchnorm=spec.batchnorm))
    opt = make_optimizer(model, spec)
    if spec.skew_momentum:
        _skew_momentum(model, opt, ctx.rank)
    sizes, sent = spec.shard_sizes(ctx.world_size), []
    for step in range(spec.steps):
        shard = shard_batch(step_batch(spec, step), sizes, ctx.rank)
        n_total = global_count(ctx, shard, spec, step)
        opt.zero_grad()
        shard_loss(model, shard, spec, n_total).backward()
        local = flat_grads(model)                                              # (P,)
        before = ctx.ledger.totals()["bytes_sent"]
        synced = ring_all_reduce(ctx, local, phase=f"step {step}/grads")      # (P,) sum over ranks
        sent.append(ctx.ledger.totals()["bytes_sent"] - before)
        if spec.weighting in ("mean", "tokens-local"):
            synced = synced / ctx.world_size
        set_flat_grads(model, synced)
        opt.step()
        if step == 0:
            grad0 = synced
    norm = model.encoder.norm
    running_mean = norm.running_mean.clone() if isinstance(norm, nn.BatchNorm1d) else None
    return DPRun(grad0=grad0, params=flat_params(model), running_mean=running_mean, bytes_per_step=tuple(sent))


@dataclass(frozen=True, kw_only=True)
class DPSpecs:
    """Data-parallel runs decided before any process starts: each TrainSpec, on `world_size` ranks, checked."""
    world_size: int
    runs: tuple[TrainSpec, ...]

    def __post_init__(self) -> None:
        for spec in self.runs:
            spec.shard_sizes(self.world_size)        # a size list that does not fit N is refused here


@dataclass(frozen=True)
class DPRuns:
    """What one rank ends each run of a DPSpecs with, in order."""
    runs: tuple[DPRun, ...]


def dp_runs(ctx: Context, specs: DPSpecs) -> DPRuns:
    """Rank function: every run of `specs`, one after the other."""
    return DPRuns(tuple(dp_train(ctx, spec) for spec in specs.runs))


def by_run(results: list[DPRuns]) -> list[list[DPRun]]:
    """The ranks' results regrouped: for each run, every rank's DPRun in rank order."""
    return [list(runs) for runs in zip(*(r.runs for r in results), strict=True)]


@dataclass(frozen=True, kw_only=True)
class SingleProcessRun:
    """The one-process reference's result: what every data-parallel run is compared with."""
    grad0: torch.Tensor                  # (P,) the full-batch gradient of step 0
    params: torch.Tensor                 # (P,) the parameters after the last step
    grad_bounds: list[torch.Tensor]      # per step, (P,) float64: how far rounding may move a DP gradient


def single_process_train(spec: TrainSpec, *,
                         perturb: tuple[list[torch.Tensor], int] | None = None) -> SingleProcessRun:
    """The reference: one process, the whole batch, the loss the weighting is meant to compute.

    Also returns, per step, the elementwise bound on how far a data-parallel
    gradient may differ from this one by rounding (`gradient_bound`).
    `perturb=(bounds, seed)` adds +-bounds[step] (random signs from `seed`) to
    each step's gradient before the optimizer sees it: what `param_tolerance`
    measures with.
    """
    model = make_model(seed=spec.seed, cfg=WorldModelConfig(batchnorm=spec.batchnorm))
    opt, bounds = make_optimizer(model, spec), []
    signs = torch.Generator().manual_seed(perturb[1]) if perturb else None
    for step in range(spec.steps):
        batch = step_batch(spec, step)
        opt.zero_grad()
        bounds.append(gradient_bound(spec, linear_term_sums(model, lambda m: reference_loss(m, batch, spec))))
        if step == 0:
            grad0 = flat_grads(model)
        if perturb is not None:
            sign = torch.randint(0, 2, bounds[-1].shape, generator=signs) * 2 - 1          # (P,) of +-1
            set_flat_grads(model, (flat_grads(model).double() + sign * perturb[0][step]).float())
        opt.step()
    return SingleProcessRun(grad0=grad0, params=flat_params(model), grad_bounds=bounds)


def reference_loss(model: nn.Module, batch: dict[str, torch.Tensor], spec: TrainSpec) -> torch.Tensor:
    """The whole batch's loss: mean over examples, or over valid tokens for the token weightings."""
    if spec.weighting.startswith("tokens"):
        mask = torch.arange(spec.seq_len) < batch["lengths"][:, None]   # (B, T)
        return (token_losses(model, batch) * mask).sum() / mask.sum()
    return model.loss(batch)


GRAD_EXTRA_ROUNDINGS = 3   # the loss scale rounded in each run (2), the division by N after the sum (1)


def gradient_bound(spec: TrainSpec, term_sums: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on |data-parallel gradient - full-batch gradient|: (P,), float64.

    Both add up the same B*T row terms of every weight's gradient (each row
    computed by the same float32 operations), one in a single pass, the other
    per shard and then across ranks: `costs.reordered_sum_bound` with the
    sum of |terms| as the partial-sum bound (`models.linear_term_sums`), plus
    GRAD_EXTRA_ROUNDINGS roundings of the loss scale. No heuristic: what
    reordering a float32 sum can do at most.
    """
    terms = spec.batch_size * spec.seq_len
    return costs.reordered_sum_bound(terms, 1.0, extra_roundings=GRAD_EXTRA_ROUNDINGS) * term_sums


PROBE_SEEDS = (1, 2)   # sign patterns param_tolerance perturbs the reference with


def param_tolerance(spec: TrainSpec, reference: SingleProcessRun) -> float:
    """Allowed max |difference| of the final parameters: a measured bound, not a proof.

    The gradient errors rounding can cause are bounded entry by entry
    (`reference.grad_bounds`, one per step). How far they can carry
    through the optimizer depends on the curvature and, for Adam, on 1/sqrt(v)
    of each entry, which no short formula bounds usefully. So we measure it:
    the reference is run again with every gradient entry of every step moved
    by its full bound, with random signs (PROBE_SEEDS), and the largest
    parameter displacement is the tolerance, plus one float32 rounding of
    |theta| per step for the update itself. Actual rounding errors sit far
    inside their bounds (a few percent of them), so the real difference is
    typically hundreds of times smaller than this.
    """
    moved = max(float((single_process_train(spec, perturb=(reference.grad_bounds, seed)).params
                       - reference.params).abs().max()) for seed in PROBE_SEEDS)
    return moved + spec.steps * costs.FLOAT32_ROUNDOFF * float(reference.params.abs().max())
