"""Data parallelism and ZeRO 1-3 on any nn.Module: chapter 01's and 03's algorithms with your model in them.

Data parallel (`replica_train`): every rank builds the whole model (the same seed, the same weights),
takes its B/N examples of each step's batch, backpropagates sum(losses) / B (so that the sum over ranks
is the whole batch's mean-loss gradient), flattens its gradients into one (P,) buffer, sums the buffers
with the counted ring all-reduce, and every rank takes the same optimizer step.

ZeRO (`zero_train`): all parameters are one flat float32 vector of P elements, as in chapter 03, and rank
r owns chunk r of torch.tensor_split's layout (a layer may straddle two ranks). Your module is moved to
the meta device (shapes and code, no numbers) and run with torch.func.functional_call on views into the
flat vector, so a rank holds only what its stage keeps between steps:

    stage 1: parameters P, gradients P, optimizer state of its chunk
    stage 2: parameters P, gradient chunk, optimizer state of its chunk
    stage 3: parameter chunk, gradient chunk, optimizer state of its chunk

A step reduce-scatters the gradient (each rank receives the sum of its chunk), updates its chunk with
Adam or SGD elementwise (the same operations as torch.optim on CPU, so a chunk needs no communication),
and all-gathers the updated chunks (stages 1, 2). Stage 3 all-gathers the parameters before forward,
frees them, and gathers them again before backward (as FSDP does; the whole model is one unit here).
Buffers (non-trainable state) and frozen parameters (requires_grad=False) stay whole on every rank,
outside the flat vector: P counts the trainable elements, and only they are reduced, sharded and stepped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from wmdist.comm import Context, ring_all_reduce
from wmdist.memory.zero import Update, ZeroConfig, ZeroRankState, adam_update, shard_range, zero_step
from wmdist.models.world import on_meta
from wmdist.yours.refusals import digest, require_finite
from wmdist.yours.workload import (Workload, WorkloadSpec, batch_size, build_model, flat, trainable_grads, frozen,
                                   set_trainable_grads, shard, trainable)


def workload_optimizer(model: nn.Module, work: Workload) -> torch.optim.Optimizer:
    """torch's SGD (with work.momentum) or Adam (its default betas and eps) on the model's parameters."""
    if work.optimizer == "sgd":
        return torch.optim.SGD(trainable(model), lr=work.lr, momentum=work.momentum)
    return torch.optim.Adam(trainable(model), lr=work.lr)


def workload_loss(work: Workload, model: nn.Module, mine: Any, global_batch: int, *, step: int,
               where: str) -> torch.Tensor:
    """sum(this rank's per-example losses) / B: summed over ranks, the whole batch's mean loss. A NaN or inf
    loss raises FloatingPointError naming the step and `where` (the rank, whose run)."""
    losses = work.loss(model, mine)
    require_finite(losses, step=step, where=where)
    return losses.sum() / global_batch


@dataclass(frozen=True, kw_only=True)
class ReplicaResult:
    """What one data-parallel rank ends with: the tensors from rank 0 only (each other rank's would be a copy the
    parent holds just to compare bytes), and from every rank the digest of its final parameters."""
    grad0: torch.Tensor | None           # (P,) the summed step-0 gradient it applied (rank 0)
    params: torch.Tensor | None          # (P,) its trainable parameters after the last step (rank 0)
    digest: str                          # refusals.digest of its final parameters, frozen ones too
    bytes_per_step: tuple[int, ...]      # ring bytes it sent in each step's gradient all-reduce
    rounds_per_step: tuple[int, ...]     # ring rounds of each step
    frozen: torch.Tensor | None = None   # its frozen parameters after the last step, flat (rank 0)


def replica_train(ctx: Context, spec: WorkloadSpec) -> ReplicaResult:
    """Rank function: your model trained spec.work.steps steps, gradients summed by the counted ring all-reduce."""
    work = spec.work
    model = build_model(work)
    opt = workload_optimizer(model, work)
    sent, rounds = [], []
    for step in range(work.steps):
        batch = work.batch(step)
        opt.zero_grad()
        workload_loss(work, model, shard(batch, ctx.world_size, ctx.rank), batch_size(batch, where="batch"), step=step,
                   where=f"rank {ctx.rank}, our data parallelism").backward()
        phase = f"step {step}/gradient all-reduce"
        synced = ring_all_reduce(ctx, trainable_grads(model), phase=phase)                 # (P,) summed over ranks
        totals = ctx.ledger.totals(phase=phase, prefix=True)
        sent.append(totals["bytes_sent"])
        rounds.append(totals["rounds"])
        set_trainable_grads(model, synced)
        opt.step()
        if step == 0:
            grad0 = synced
    final, still = flat(trainable(model)), flat(frozen(model))
    first = ctx.rank == 0
    return ReplicaResult(grad0=grad0 if first else None, params=final if first else None,
                         frozen=still if first else None, digest=digest(torch.cat([final, still])),
                         bytes_per_step=tuple(sent),
                         rounds_per_step=tuple(rounds))


# --- ZeRO ------------------------------------------------------------------------------

class _YourLoss(nn.Module):
    """Your model and loss as one module, so functional_call can run loss(model, batch) on other parameters."""

    def __init__(self, model: nn.Module, loss: Any, where: str):
        super().__init__()
        self.model = model
        self.loss = loss
        self.where = where
        self.step = 0                 # set by zero_train before each step: named if the loss is NaN or inf

    def forward(self, batch: Any) -> torch.Tensor:
        losses = self.loss(self.model, batch)
        require_finite(losses, step=self.step, where=self.where)
        return losses


def init_zero(ctx: Context, spec: WorkloadSpec) -> ZeroRankState:
    """Build your model from the seed, flatten it, keep what this rank's stage keeps (chapter 03's state)."""
    work, stage = spec.work, spec.stage
    model = build_model(work)
    layout, offset = trainable_layout(model)
    vector = flat(trainable(model))                                            # (P,)
    start, stop = shard_range(offset, ctx.world_size, ctx.rank)
    slots = 2 if work.optimizer == "adam" else (1 if work.momentum else 0)
    buffers = {f"model.{name}": b.detach().clone() for name, b in model.named_buffers()}
    buffers.update({f"model.{name}": p.detach().clone() for name, p in model.named_parameters()
                    if not p.requires_grad})                                   # frozen: whole, as buffers are
    return ZeroRankState(stage=stage, numel=offset, start=start, stop=stop,
                         params=vector[start:stop].clone() if stage == 3 else vector,
                         grads=torch.zeros(offset if stage == 1 else stop - start, dtype=vector.dtype),
                         moments=[torch.zeros(stop - start, dtype=vector.dtype) for _ in range(slots)], step=0,
                         loss_module=_YourLoss(on_meta(model), work.loss, f"rank {ctx.rank}, our ZeRO-{stage}"), layout=layout, buffers=buffers)


def trainable_layout(model: nn.Module) -> tuple[list[tuple[str, torch.Size, int, int]], int]:
    """memory.zero.flat_layout over the trainable parameters only: (name, shape, start, stop) each, and P."""
    layout, offset = [], 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            layout.append((f"model.{name}", p.shape, offset, offset + p.numel()))
            offset += p.numel()
    return layout, offset


def sgd_update(param: torch.Tensor, grad: torch.Tensor, moments: list[torch.Tensor], step: int,
               work: Workload) -> None:
    """One torch.optim.SGD step in place (its CPU operations): the momentum buffer starts as the first gradient."""
    if not moments:
        param.add_(grad, alpha=-work.lr)
        return
    buf = moments[0]
    if step == 1:
        buf.copy_(grad)
    else:
        buf.mul_(work.momentum).add_(grad)
    param.add_(buf, alpha=-work.lr)


def your_update(work: Workload) -> Update:
    """The elementwise step of your optimizer: torch.optim.Adam's (default betas and eps) or SGD's."""
    if work.optimizer == "adam":
        cfg = ZeroConfig(lr=work.lr)
        return lambda p, g, moments, step: adam_update(p, g, moments[0], moments[1], step, cfg)
    return lambda p, g, moments, step: sgd_update(p, g, moments, step, work)


@dataclass(kw_only=True, frozen=True)
class ZeroResult:
    """What one ZeRO rank ends with: its chunk of the weights and of the step-0 gradient, what it held and sent."""
    chunk: torch.Tensor                           # this rank's element range of the final flat parameters
    grad0: torch.Tensor                           # its chunk of the summed step-0 gradient
    held: dict[str, int]                          # bytes by kind, between steps ("frozen": the frozen parameters)
    phases: tuple[dict[str, dict[str, int]], ...]  # per step: ledger totals by phase
    frozen: torch.Tensor | None = None            # its frozen parameters after the last step, flat


def zero_train(ctx: Context, spec: WorkloadSpec) -> ZeroResult:
    """Rank function: ZeRO-spec.stage on your model for spec.work.steps steps (chapter 03's zero_step)."""
    work, state, phases = spec.work, init_zero(ctx, spec), []
    update = your_update(work)
    for step in range(work.steps):
        before = len(ctx.ledger.records)
        batch = work.batch(step)
        state.loss_module.step = step
        grad = zero_step(ctx, state, shard(batch, ctx.world_size, ctx.rank), batch_size(batch, where="batch"),
                         update).clone()
        if step == 0:
            grad0 = grad
        phases.append(ctx.ledger.by_phase(since=before))
    names = [f"model.{name}" for name, t in zip(spec.names, spec.trainable) if not t]
    still = [state.buffers[name] for name in names]
    held = {**state.held_bytes(), "frozen": sum(t.numel() * t.element_size() for t in still)}
    return ZeroResult(chunk=state.chunk.clone(), grad0=grad0, held=held, frozen=flat(still), phases=tuple(phases))
