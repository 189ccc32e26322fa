"""torch's own implementations on your model, on the same ranks: DDP, ZeroRedundancyOptimizer, FSDP2.

Each runs the same workload (seed, batches, optimizer) with torch doing the distribution, and counts
what it sends in the ranks' ledgers:

* DistributedDataParallel: its buckets go through a comm hook that is our counted all_reduce (the
  payload: every gradient element once per step). DDP averages, so each rank's loss is the mean over its
  B/N examples, and your loss receives the DDP wrapper as its model (call it, as model(x)). Its
  constructor's broadcast of rank 0's parameters and buffers happens inside torch: recorded with bytes
  computed from their size, and the label says so. forward_sync_buffers=False: a forward leaves the
  buffers alone (workload.prepare_workload checks), so there is nothing to send each step.
* ZeroRedundancyOptimizer (ZeRO-1, whole parameters per rank): gradients summed with our counted
  all_reduce; its step's broadcast of the updated parameters is recorded as one collective with bytes
  computed from which parameters the rank owns.
* FSDP2 (`torch.distributed.fsdp.fully_shard`; it works on CPU and gloo in torch 2.13): each direct
  child with parameters is one unit, then the root (with its own parameters, if any). Its all-gathers
  and reduce-scatters go through `set_custom_all_gather` / `set_custom_reduce_scatter` objects that call
  our counted collectives, so their payload bytes are observed, not computed. reshard_after_forward=True
  frees a unit's gathered parameters after its forward and gathers them again in backward (ZeRO-3);
  False keeps them until after backward (one gather a step: ZeRO-2's volume, parameters sharded at
  rest). Each parameter is sharded along dim 0 in torch.chunk's layout (ceil(d0/N) rows a rank, the
  last padded), so the bytes follow that, not tensor_split's. The final parameters are each rank's local
  shards, joined in this process (`joined_shards`), not gathered by torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from wmdist.comm import Context, all_gather, all_reduce, counted, reduce_scatter
from wmdist.yours.refusals import digest
from wmdist.yours.training import workload_optimizer, workload_loss
from wmdist.yours.workload import WorkloadSpec, batch_size, build_model, flat, trainable_grads, frozen, shard, trainable


def _counted_average(ctx, bucket):   # no annotations: DDP rejects string (postponed) ones
    """DDP comm hook (ctx: Context, bucket: dist.GradBucket): DDP's own average, through our counted all_reduce."""
    buf = bucket.buffer().div_(ctx.world_size)
    pending = all_reduce(ctx, buf, phase="ddp/grads", async_op=True)
    return pending.future().then(lambda f: f.value()[0])


def _local_mean(spec: WorkloadSpec, model: nn.Module, batch: Any, world_size: int, rank: int, *, step: int,
                where: str) -> torch.Tensor:
    """torch's convention: the mean loss of this rank's B/N examples (DDP and FSDP2 then average over ranks)."""
    mine = shard(batch, world_size, rank)
    return workload_loss(spec.work, model, mine, batch_size(mine, where="batch"), step=step,
                      where=f"rank {rank}, {where}")


@dataclass(frozen=True, kw_only=True)
class TorchResult:
    """What one rank ends torch's run with."""
    params: tuple[torch.Tensor, ...]     # its parameters, whole (DDP, ZeroRedundancyOptimizer: rank 0 only, else ())
                                         # or its local shards (FSDP2, every rank)
    grad0: torch.Tensor | None           # (P,) the averaged step-0 gradient (DDP, rank 0), else None
    sent: dict[str, int]                 # payload bytes sent, by phase, all steps
    calls: dict[str, int]                # collectives called, by phase, all steps
    digest: str = ""                     # refusals.digest of its whole final parameters (DDP, ZeroRedundancyOptimizer)
    frozen: torch.Tensor | None = None   # its frozen parameters at the end, flat (DDP, ZeroRedundancyOptimizer: rank 0)


def _ledger(ctx: Context, phases: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    sent = {p: ctx.ledger.totals(phase=p, kind="collective")["bytes_sent"] for p in phases}
    calls = {p: ctx.ledger.totals(phase=p, kind="collective")["rounds"] for p in phases}
    return sent, calls


def workload_ddp_train(ctx: Context, spec: WorkloadSpec) -> TorchResult:
    """Rank function: the workload under torch's DistributedDataParallel."""
    work = spec.work
    model = build_model(work)
    state = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    with counted(ctx, "DDP constructor broadcast (not observed: bytes computed from the model state size)",
                 "ddp/init", sent=state, recv=state):
        ddp = nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False)
    ddp.register_comm_hook(ctx, _counted_average)
    opt = workload_optimizer(model, work)
    for step in range(work.steps):
        opt.zero_grad()
        _local_mean(spec, ddp, work.batch(step), ctx.world_size, ctx.rank, step=step,
                    where="torch's DDP").backward()                                      # through DDP: its hooks
        if step == 0:
            grad0 = trainable_grads(model)
        opt.step()
    sent, calls = _ledger(ctx, ("ddp/grads",))
    return _whole(ctx, model, grad0, sent, calls)


def _whole(ctx: Context, model: nn.Module, grad0: torch.Tensor | None, sent: dict[str, int],
           calls: dict[str, int]) -> TorchResult:
    """A whole-parameter run's result: the tensors from rank 0 (trainable, then frozen), the digest from every
    rank (of both)."""
    first = ctx.rank == 0
    final, still = flat(trainable(model)), flat(frozen(model))
    return TorchResult(params=(final,) if first else (), grad0=grad0 if first else None, sent=sent, calls=calls,
                       digest=digest(torch.cat([final, still])), frozen=still if first else None)


def zero_redundancy_train(ctx: Context, spec: WorkloadSpec) -> TorchResult:
    """Rank function: the workload with torch's ZeroRedundancyOptimizer (ZeRO-1) around the same optimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    work = spec.work
    model = build_model(work)
    options = {"lr": work.lr} if work.optimizer == "adam" else {"lr": work.lr, "momentum": work.momentum}
    opt = ZeroRedundancyOptimizer(trainable(model), optimizer_class=type(workload_optimizer(model, work)), **options)
    owned = sum(p.numel() * p.element_size() for g in opt.optim.param_groups for p in g["params"])
    total = sum(p.numel() * p.element_size() for p in trainable(model))
    for step in range(work.steps):
        batch = work.batch(step)
        opt.zero_grad()
        workload_loss(work, model, shard(batch, ctx.world_size, ctx.rank), batch_size(batch, where="batch"), step=step,
                   where=f"rank {ctx.rank}, torch's ZeroRedundancyOptimizer").backward()
        summed = all_reduce(ctx, trainable_grads(model), phase="gradient all-reduce")
        torch.nn.utils.vector_to_parameters(summed, [p.grad for p in trainable(model)])
        with counted(ctx, "ZeroRedundancyOptimizer.step (not observed: bytes computed from parameter ownership)",
                     "parameter broadcast", sent=owned, recv=total - owned):
            opt.step()
    sent, calls = _ledger(ctx, ("gradient all-reduce", "parameter broadcast"))
    return _whole(ctx, model, None, sent, calls)


class _CountedGather(AllGather):
    """FSDP2's all-gather, through wmdist.comm.all_gather (counted: this rank's shard sent, the others' received)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        output_tensor.copy_(all_gather(self.ctx, input_tensor, phase="fsdp2/all-gather", group=group))


class _CountedScatter(ReduceScatter):
    """FSDP2's reduce-scatter, through wmdist.comm.reduce_scatter (a sum; FSDP2's average divides it by N)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        summed = reduce_scatter(self.ctx, input_tensor, phase="fsdp2/reduce-scatter", group=group)
        kind = str(op).rsplit(".", 1)[-1]
        if kind not in ("SUM", "AVG"):
            raise ValueError(f"FSDP2 asked for a {op} reduce-scatter; this counted one sums or averages only")
        output_tensor.copy_(summed / self.ctx.world_size if kind == "AVG" else summed)


def fsdp2_train(ctx: Context, spec: WorkloadSpec, *, reshard: bool) -> TorchResult:
    """Rank function: the workload under FSDP2's fully_shard (spec.units: each child whose parameters are its own
    a unit, then the root with the rest, tied ones included)."""
    from torch.distributed.device_mesh import init_device_mesh
    work = spec.work
    model = build_model(work)
    mesh = init_device_mesh("cpu", (ctx.world_size,))             # the default gloo group: no new one
    units = [getattr(model, name) for name, _ in spec.units if name != "(root)"]
    for unit in [*units, model]:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        unit.set_custom_all_gather(_CountedGather(ctx))
        unit.set_custom_reduce_scatter(_CountedScatter(ctx))
    opt = workload_optimizer(model, work)
    for step in range(work.steps):
        opt.zero_grad()
        _local_mean(spec, model, work.batch(step), ctx.world_size, ctx.rank, step=step, where="torch's FSDP2").backward()
        opt.step()
    local = tuple(p.to_local().detach().clone() for p in model.parameters())     # this rank's dim-0 shards
    sent, calls = _ledger(ctx, ("fsdp2/all-gather", "fsdp2/reduce-scatter"))
    return TorchResult(params=local, grad0=None, sent=sent, calls=calls)


def joined_shards(results: list[TorchResult], spec: WorkloadSpec, *, trainable: bool = True) -> torch.Tensor:
    """FSDP2's local dim-0 shards of every rank joined back into whole parameters, flattened in order: the
    trainable ones (P,), or with trainable=False the frozen ones."""
    per_param = zip(*(r.params for r in results), spec.trainable, strict=True)
    return flat([torch.cat(shards, dim=0) for *shards, t in per_param if t == trainable])


def fsdp2_unit_shard(spec: WorkloadSpec, indices: tuple[int, ...]) -> int:
    """Elements one rank holds of an FSDP2 unit: each parameter's ceil(d0/N) rows, padded (torch.chunk layout)."""
    n, total = spec.world_size, 0
    for i in indices:
        shape = spec.shapes[i] or (1,)
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += -(-shape[0] // n) * rest
    return total


@dataclass(frozen=True, kw_only=True)
class FsdpTraffic:
    """What one FSDP2 rank sends in one training step (payload, as our counted collectives record it)."""
    gathers: int                 # all-gather calls
    gather_bytes: int            # its shard of each gathered unit, spec.element_bytes an element
    scatters: int                # reduce-scatter calls: one per unit with a trainable parameter
    scatter_bytes: int           # the whole padded gradient of each such unit's trainable parameters (N shards)


def fsdp2_step_traffic(spec: WorkloadSpec, *, reshard: bool) -> FsdpTraffic:
    """One step's FSDP2 traffic: every unit (the root's own parameters too, measured on torch 2.13) is gathered
    before forward and, when resharded after it, again before backward; one reduce-scatter each; none on one rank.
    A unit's reduce-scatter carries its trainable parameters only, and a unit of frozen ones has none; it is
    gathered as any other, again before backward too (measured on torch 2.13 with a frozen first layer,
    whose backward computes nothing)."""
    n = spec.world_size
    if n == 1:
        return FsdpTraffic(gathers=0, gather_bytes=0, scatters=0, scatter_bytes=0)
    gathers = gather = scatters = scatter = 0
    times = 2 if reshard else 1
    for _, idx in spec.units:
        gathers += times
        gather += times * fsdp2_unit_shard(spec, idx)
        grads = tuple(i for i in idx if spec.trainable[i])
        scatters += bool(grads)
        scatter += fsdp2_unit_shard(spec, grads)
    size = spec.element_bytes
    return FsdpTraffic(gathers=gathers, gather_bytes=size * gather, scatters=scatters,
                       scatter_bytes=size * n * scatter)
