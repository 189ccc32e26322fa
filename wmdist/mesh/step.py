"""One training step on a dp x tp x pp x cp mesh: the rank function, composed from the chapters' pieces.

Every rank sees the run through four axis views of its context
(`ctx.along(mesh, axis)`): the process group of that axis (cached on the
warm rank), its coordinate as the rank, and every byte it sends recorded
under "<axis>/...". So chapter 04's TP layers run on the tp view, chapter
06's ring attention on the cp view, chapter 05's mailbox and phases on the
pp view, and the ring all-reduce on the dp (and cp) view, unchanged.

The step:
  1. data: the global batch, this dp rank's trajectories, this cp rank's
     tokens, cut into M microbatches of whole trajectories;
  2. forward and backward of every microbatch, in the order the pipeline
     schedule (GPipe or 1F1B) gives this stage; activations go to the next
     stage and gradients come back through the pp view; the last stage's
     loss share is its squared errors / (B T O), so the shares add up to the
     single device's mean loss;
  3. the gradient, flattened and cut into buckets, summed over the cp ranks
     (their tokens) and then over the dp ranks (their trajectories);
  4. SGD with momentum on the rank's own parameters.
It returns what the rank computed, what its ledger shows per axis, and the
bytes it holds afterwards (parameters, gradients, optimizer state).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import time
from dataclasses import dataclass

import torch

from wmdist.comm import Context, barrier, isend, ring_all_reduce
from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.mesh import TRAFFIC_AXES, Traffic
from wmdist.mesh.stage import MeshStage, full_model
from wmdist.models.world import flat_grads, make_batch, set_flat_grads, shard_batch
from wmdist.pipeline.executor import PHASE, Mailbox, split_microbatches
from wmdist.pipeline.plan import Message, incoming
from wmdist.pipeline.schedules import BACKWARD, FORWARD, make_schedule
from wmdist.tensor_parallel.layers import TPGroup

if TYPE_CHECKING:                                    # annotations only: the spec is the harness's record
    from wmdist.mesh.spec import MeshSpec

HELD = ("parameters", "gradients", "optimizer_state")


@dataclass(kw_only=True, frozen=True)
class RankStep:
    """What one rank of the mesh did in one training step, measured."""
    rank: int
    coords: dict[str, int]
    loss: float | None                   # sum of this rank's loss shares (last stage), else None
    grads: dict[str, torch.Tensor]       # synchronized gradient of each parameter it holds (its slice), by model name
    params: dict[str, torch.Tensor]      # those parameters after the optimizer step
    traffic: dict[str, Traffic]          # ledger: bytes sent and messages per axis (phases "<axis>/...")
    phases: dict[str, dict[str, int]]    # ledger: totals of every phase, in first-seen order
    held: dict[str, int]                 # bytes held after the step, by kind (HELD)
    seconds: float                       # the step on this rank (after the ranks lined up)
    groups: int                          # process groups this rank's process holds afterwards (cached across calls)


def rank_microbatches(spec: MeshSpec, coords: dict[str, int]) -> list[dict[str, torch.Tensor]]:
    """This rank's microbatches: its dp share of trajectories, its cp block of tokens, whole trajectories per
    microbatch. Keys obs (b, c, O), actions (b, c, A), next_obs (b, c, O)."""
    batch = make_batch(spec.batch, seq_len=spec.seq_len, seed=spec.seed)
    mine = shard_batch(batch, ring_chunk_sizes(spec.batch, spec.dp), coords["dp"])
    c = spec.seq_len // spec.cp
    tokens = {k: v[:, coords["cp"] * c:(coords["cp"] + 1) * c] for k, v in mine.items() if k != "reward"}
    return split_microbatches(tokens, spec.microbatches)


def loss_share(out: torch.Tensor, next_obs: torch.Tensor, scale: int) -> torch.Tensor:
    """The last stage's share of the single device's mean loss: its squared errors / scale (B T O)."""
    return (out - next_obs).pow(2).sum() / scale


def run_schedule(pp: Context, spec: MeshSpec, stage: MeshStage, micro: list[dict[str, torch.Tensor]], tp: TPGroup,
                 cp: Context) -> float | None:
    """Forward and backward every microbatch in the schedule's order for this stage; the loss shares' sum, or None.

    Receives are posted up front by chapter 05's Mailbox (each peer's in its
    sending order); sends are non-blocking and waited for at the end.
    """
    schedule = make_schedule(spec.schedule, spec.pp, spec.microbatches)
    shapes = {m: (mb["obs"].shape[0], mb["obs"].shape[1], spec.width) for m, mb in enumerate(micro)}
    mailbox = Mailbox(pp, incoming(schedule, pp.rank), shapes)
    scale = spec.batch * spec.seq_len * stage.cfg.obs_dim           # B T O: the single device's mean
    held, sends, loss = {}, [], 0.0
    for a in schedule.ranks[pp.rank]:
        m, mb = a.microbatch, micro[a.microbatch]
        if a.kind == FORWARD:
            x = None if stage.first else mailbox.take(pp.rank - 1, Message(FORWARD, a.stage - 1, m)).requires_grad_(True)
            out = stage((mb["obs"], mb["actions"]) if stage.first else (x,), tp, cp)
            if stage.last:
                out = loss_share(out, mb["next_obs"], scale)
                loss += float(out.detach())
            else:
                sends.append(isend(pp, out.detach(), pp.rank + 1, phase=PHASE[FORWARD]))
            held[m] = (x, out)
        else:
            x, out = held.pop(m)
            grad = None if stage.last else mailbox.take(pp.rank + 1, Message(BACKWARD, a.stage + 1, m))
            torch.autograd.backward(out, grad)
            if not stage.first:
                sends.append(isend(pp, x.grad, pp.rank - 1, phase=PHASE[BACKWARD]))
    for pending in sends:
        pending.wait()
    return loss if stage.last else None


def sync_mesh_gradients(stage: MeshStage, views: dict[str, Context], buckets: int) -> None:
    """Sum the gradient over the cp ranks, then over the dp ranks: one ring all-reduce per bucket and axis."""
    flat = flat_grads(stage)                                          # (P_local,)
    pieces = []
    for k, piece in enumerate(torch.tensor_split(flat, buckets)):
        piece = ring_all_reduce(views["cp"], piece, phase=f"grads bucket {k}")
        pieces.append(ring_all_reduce(views["dp"], piece, phase=f"grads bucket {k}"))
    set_flat_grads(stage, torch.cat(pieces))


class Momentum:
    """SGD with momentum: torch.optim.SGD's update (no dampening, weight decay or Nesterov), written out.

    The same operations in the same order as torch's single-tensor SGD (the
    tests hold them bitwise equal); constructing torch's optimizer imports
    torch._dynamo, seconds per rank on a small machine, for three lines.
    """

    def __init__(self, params: list[torch.nn.Parameter], lr: float, momentum: float = 0.9):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.buffers: list[torch.Tensor] = []          # one per parameter after the first step

    @torch.no_grad()
    def step(self) -> None:
        """buf = g on the first step, then buf = momentum * buf + g; p -= lr * buf."""
        if not self.buffers:
            self.buffers = [p.grad.clone() for p in self.params]
        else:
            for buf, p in zip(self.buffers, self.params):
                buf.mul_(self.momentum).add_(p.grad)
        for buf, p in zip(self.buffers, self.params):
            p.add_(buf, alpha=-self.lr)


def held_bytes(stage: MeshStage, opt: Momentum) -> dict[str, int]:
    """Bytes of the distinct storages behind the rank's parameters, their gradients and the momentum buffers."""
    def total(tensors: list[torch.Tensor]) -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())
    params = list(stage.parameters())
    return {"parameters": total(params), "gradients": total([p.grad for p in params]),
            "optimizer_state": total(opt.buffers)}


def mesh_step(ctx: Context, spec: MeshSpec) -> RankStep:
    """Rank function: one training step of the transformer world model on `spec`'s mesh (module docstring)."""
    spec.check_world(ctx.world_size)
    mesh = spec.mesh
    coords = mesh.coords(ctx.rank)
    views = {axis: ctx.along(mesh, axis) for axis in TRAFFIC_AXES}            # groups made once, then cached
    tp = TPGroup(views["tp"], views["tp"].group, coords["tp"], spec.tp)
    model = full_model(spec)
    stage = MeshStage(model, spec, coords["tp"], coords["pp"])
    names = stage.full_names()
    del model                                                         # keep only this rank's share
    opt = Momentum(list(stage.parameters()), spec.lr)
    micro = rank_microbatches(spec, coords)
    barrier(ctx, phase="line up")
    ctx.ledger.reset()
    start = time.perf_counter()
    loss = run_schedule(views["pp"], spec, stage, micro, tp, views["cp"])
    sync_mesh_gradients(stage, views, spec.buckets)
    grads = {n: p.grad.clone() for n, p in zip(names, stage.parameters())}
    opt.step()
    seconds = time.perf_counter() - start
    traffic = {}
    for axis in TRAFFIC_AXES:
        t = ctx.ledger.totals(phase=f"{axis}/", kind="p2p", prefix=True)
        traffic[axis] = Traffic(t["bytes_sent"], t["messages"])
    params = {n: p.detach().clone() for n, p in zip(names, stage.parameters())}
    return RankStep(rank=ctx.rank, coords=coords, loss=loss, grads=grads, params=params, traffic=traffic, phases=ctx.ledger.by_phase(kind=None),
                    held=held_bytes(stage, opt), seconds=seconds, groups=len(ctx.resources.groups))
