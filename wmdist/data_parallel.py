"""Replicated data parallelism for the tiny world model, checked against one process and DDP.

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

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from wmdist import costs
from wmdist.comm import Context, Record, all_reduce, ring_all_reduce
from wmdist.exercises import Exercise
from wmdist.launch import run
from wmdist.models import (WorldModelConfig, flat_grads, flat_params, make_batch, make_model, set_flat_grads,
                           shard_batch)
from wmdist.report import Demo, Report, close_check, comm_rows, exact_check, max_abs_error

WEIGHTINGS = ("mean", "examples", "tokens-local", "tokens")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class TrainSpec:
    """One data-parallel training run: global batch, its split over ranks, optimizer, steps."""
    steps: int = 3
    batch_size: int = 16                 # global examples per step
    time_steps: int = 6                  # T of every sequence
    sizes: tuple[int, ...] | None = None  # examples per rank; None splits evenly
    weighting: str = "mean"
    optimizer: str = "sgd"               # "sgd" (momentum 0.9) or "adam"
    lr: float = 0.05
    seed: int = 0
    batchnorm: bool = False              # local BatchNorm in the encoder (a pitfall)
    skew_momentum: bool = False          # ranks > 0 start with nonzero momentum (a pitfall)

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("batch_size", 1), ("time_steps", 1), ("seed", 0)):
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


def valid_lengths(batch_size: int, steps: int) -> torch.Tensor:
    """Valid time steps of each sequence: full at the front of the batch, short at the back."""
    i = torch.arange(batch_size)
    return (steps - (i * steps) // batch_size).clamp(min=1)                # (B,)


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
    batch = make_batch(spec.batch_size, spec.time_steps, seed=spec.seed * 1000 + step)
    if spec.weighting.startswith("tokens"):
        batch["lengths"] = valid_lengths(spec.batch_size, spec.time_steps)
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
    mask = torch.arange(spec.time_steps) < shard["lengths"][:, None]           # (b, T)
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


def dp_train(ctx: Context, spec: TrainSpec) -> dict:
    """Rank function: train `spec.steps` steps with gradients summed by the counted ring all-reduce.

    Returns the step-0 local and synchronized gradients, the final parameters,
    the BatchNorm running mean (if any) and the ring bytes sent per step.
    """
    model = make_model(spec.seed, WorldModelConfig(batchnorm=spec.batchnorm))
    opt = make_optimizer(model, spec)
    if spec.skew_momentum:
        _skew_momentum(model, opt, ctx.rank)
    sizes, out, sent = spec.shard_sizes(ctx.world_size), {}, []
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
            out["local_grad0"], out["grad0"] = local, synced
    norm = model.encoder.norm
    out["running_mean"] = norm.running_mean.clone() if isinstance(norm, nn.BatchNorm1d) else None
    return {**out, "params": flat_params(model), "bytes_per_step": sent}


def _counted_allreduce_hook(ctx, bucket):   # no annotations: DDP rejects string (postponed) ones
    """DDP comm hook (ctx: Context, bucket: dist.GradBucket): DDP's default average, counted in the ledger."""
    buf = bucket.buffer().div_(ctx.world_size)
    n = buf.numel() * buf.element_size()
    ctx.ledger.enter(f"DDP bucket {bucket.index()} all_reduce {n} B")
    fut = dist.all_reduce(buf, async_op=True).get_future()
    ctx.ledger.add(Record("all_reduce (DDP bucket)", "ddp/grads", "collective", n, n, 1))
    return fut.then(lambda f: f.value()[0])


def ddp_train(ctx: Context, spec: TrainSpec) -> dict:
    """Rank function: the same run with torch's DistributedDataParallel doing the averaging."""
    model = make_model(spec.seed, WorldModelConfig(batchnorm=spec.batchnorm))
    state = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    ctx.ledger.add(Record("broadcast (DDP init)", "ddp/init", "collective", state, state, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(ctx, _counted_allreduce_hook)
    opt = make_optimizer(model, spec)
    sizes = spec.shard_sizes(ctx.world_size)
    for step in range(spec.steps):
        shard = shard_batch(step_batch(spec, step), sizes, ctx.rank)
        opt.zero_grad()
        pred_obs, pred_rew = ddp(shard["obs"], shard["actions"])    # forward through DDP: it arms the hooks
        loss = ((pred_obs - shard["next_obs"]).pow(2).mean(dim=(1, 2))
                + (pred_rew - shard["reward"]).pow(2).mean(dim=1)).mean()
        loss.backward()
        opt.step()
    return {"params": flat_params(model), "payload": ctx.ledger.totals("ddp/grads", kind="collective")}


def single_process_train(spec: TrainSpec) -> dict:
    """The reference: one process, the whole batch, the loss the weighting is meant to compute."""
    model = make_model(spec.seed, WorldModelConfig(batchnorm=spec.batchnorm))
    opt, out = make_optimizer(model, spec), {}
    for step in range(spec.steps):
        batch = step_batch(spec, step)
        opt.zero_grad()
        if spec.weighting.startswith("tokens"):
            mask = torch.arange(spec.time_steps) < batch["lengths"][:, None]   # (B, T)
            loss = (token_losses(model, batch) * mask).sum() / mask.sum()
        else:
            loss = model.loss(batch)
        loss.backward()
        if step == 0:
            out["grad0"] = flat_grads(model)
        opt.step()
    return {**out, "params": flat_params(model)}


def grad_tolerance(reference: torch.Tensor) -> float:
    """Allowed |DP - full batch| for one gradient: 2^-24 * 64 * max|g|.

    Both are float32 sums of the same B*T per-token terms in different orders
    (per shard, then across ranks, versus one pass). Rounding in such sums
    grows with the square root of the term count in practice; for these
    batches (B*T <= 400 terms, each through a dozen float32 ops) that is
    tens of ulps of the largest entry, and 64 ulps covers it.
    """
    return 64 * costs.FLOAT32_ROUNDOFF * float(reference.abs().max())


def param_tolerance(spec: TrainSpec, grad_tol: float, params: torch.Tensor) -> float:
    """Gradient disagreement carried through the optimizer for `steps` steps, plus rounding.

    SGD with momentum 0.9 moves a parameter by at most lr/(1-0.9) per unit of
    gradient error, per step. Adam divides by sqrt(v), so an entry's update
    changes by about lr times that entry's relative gradient error: ~1e-5 lr
    for entries well above rounding level (an entry whose gradient were itself
    at rounding level could flip sign; none is in these runs, and the check
    would say so). Doubled for the curvature feedback over a few steps, plus
    one ulp of |theta| per step of rounding.
    """
    per_step = spec.lr * (10 * grad_tol if spec.optimizer == "sgd" else 1e-5)
    return 2 * spec.steps * per_step + spec.steps * 2 * costs.FLOAT32_ROUNDOFF * float(params.abs().max())


def train_demo(world_size: int, spec: TrainSpec | None = None) -> Report:
    """DP with the ring all-reduce vs one process on the whole batch vs DDP, after several steps."""
    spec = spec or TrainSpec()
    if spec.weighting != "mean" or spec.sizes is not None or spec.batchnorm or spec.skew_momentum:
        raise ValueError("train_demo compares against DDP: use equal shards, weighting 'mean', no pitfalls")
    start = time.perf_counter()
    ours = run(dp_train, world_size, spec)
    theirs = run(ddp_train, world_size, spec)
    seconds = time.perf_counter() - start
    ref = single_process_train(spec)
    gtol = grad_tolerance(ref["grad0"])
    ptol = param_tolerance(spec, gtol, ref["params"])
    why_g = "float32 sums in another order: per shard, then across ranks (64 ulps of max|g|)"
    why_p = f"gradient rounding carried through {spec.steps} {spec.optimizer} steps"
    checks = [close_check("step-0 gradient == full-batch gradient", ours[0]["grad0"], ref["grad0"], gtol, why_g),
              close_check("final parameters == single process (rank 0)", ours[0]["params"], ref["params"], ptol, why_p),
              exact_check("every rank holds the same parameters", [o["params"] for o in ours],
                          [ours[0]["params"]] * world_size, "all ranks apply the same all-gathered sum"),
              close_check("final parameters == DDP (rank 0)", ours[0]["params"], theirs[0]["params"], ptol, why_p),
              close_check("DDP final parameters == single process", theirs[0]["params"], ref["params"], ptol, why_p)]
    numel = ref["params"].numel()
    comm = [row for s in range(spec.steps) for row in comm_rows(
        f"ring bytes sent, step {s}", [o["bytes_per_step"][s] for o in ours],
        [costs.ring_allreduce_bytes(numel, world_size, r) for r in range(world_size)])]
    comm += comm_rows("DDP bucket payload bytes (all steps)", [t["payload"]["bytes_sent"] for t in theirs],
                      [spec.steps * numel * 4] * world_size)
    diff = max_abs_error(ours[0]["params"], ref["params"])
    extra = {"diff_vs_single": diff, "bitwise_equal": diff == 0.0,
             "diff_ddp_vs_single": max_abs_error(theirs[0]["params"], ref["params"])}
    return Report("dp-train", world_size, checks, comm, seconds,
                  {"steps": spec.steps, "batch_size": spec.batch_size, "optimizer": spec.optimizer,
                   "numel": numel}, extra)


# --- exercise: the example-weighted mean --------------------------------------------

def weighted_mean_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r: a local mean gradient (10,) and its example count (1,), counts 2N-1, ..., 1."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(10, generator=g), torch.tensor([float(descending_sizes(world_size)[rank])])


def weighted_mean_reference(ctx: Context, grad: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """sum_r n_r g_r / sum_r n_r, the full-batch mean gradient, on every rank."""
    total = all_reduce(ctx, count.clone(), phase="count")
    return ring_all_reduce(ctx, grad * count, phase="weighted grads") / total


WEIGHTED_MEAN = Exercise(
    name="weighted mean of unequal shards",
    task="Each rank holds the mean gradient `grad` of its own shard and the shard's example count `count`. "
         "Return the gradient of the whole batch's mean loss, the same on every rank.",
    reference=weighted_mean_reference,
    make_inputs=weighted_mean_inputs,
    world_sizes=(2, 4),
    tolerance=1e-5,
    reason="scaling before or after the sum rounds differently: a few float32 ulps of values below 10",
    hint="ranks must agree on the total count before dividing: all-reduce the counts too.",
)

DEMOS = [Demo("dp-train", "Data parallel (ring all-reduce) vs one process vs DDP, 3 SGD steps",
              train_demo, world_sizes=(1, 2, 4), chapter="01")]
