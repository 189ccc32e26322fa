"""Expert parallelism: each of N ranks holds E/N experts; two all-to-alls take tokens to them and back.

On each rank, for its own T_r tokens (`ep_forward`):
  1. route them locally and sort the assignments by expert (`moe.dispatch_order`); the blocks for
     rank 0's experts come first, then rank 1's, ...;
  2. tell every rank how many rows it will get for each of its experts: an even all-to-all of an
     (N, E/N) table of counts. Now every rank knows the uneven split sizes of the next step;
  3. dispatch: `all_to_all_single` with those split sizes sends each block to its expert's rank;
  4. the rows arrive source by source; a second local sort (by local expert, stably) makes each
     expert's rows one block in source order, which is token order, since rank s holds the tokens
     after rank s-1's. Each expert runs on its block (its first `cap` rows: capacity is applied
     here, where all of an expert's rows meet); the sort is undone;
  5. combine: the reverse all-to-all brings each result back to its token's rank, where the
     inverse of step 1's permutation puts it beside its token and the gates combine.

Backward goes the same way in reverse. `AllToAll` is an autograd Function whose backward is the
all-to-all with the split sizes swapped, both counted. torch ships the same thing
(`torch.distributed.nn.functional.all_to_all_single`, which takes uneven splits on gloo); we write
it out so that both directions go through the ledger (`wmdist.comm.all_to_all_single`).

With data parallelism too (`sync_gradients`): ep x dp ranks, rank r = (dp index r // ep, ep index
r % ep). The ep ranks of one dp index form an expert-parallel group and share their tokens' experts;
the dense parameters (everything but the experts) are replicated on all ranks and all-reduced over
all of them, an expert's parameters only over the dp ranks that hold a copy of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from wmdist.comm import Context, all_reduce, all_to_all, all_to_all_single
from wmdist.experts.moe import MoEMLP, MoEOut, combine, dispatch_order, route, run_experts


@dataclass(frozen=True, kw_only=True)
class ExpertLayout:
    """ep x dp ranks: rank r is expert-parallel rank r % ep of data-parallel replica r // ep."""
    ep: int
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.ep * self.dp

    def ep_ranks(self, rank: int) -> list[int]:
        """The ranks that share their tokens' experts with `rank` (one replica of all E experts)."""
        first = rank // self.ep * self.ep
        return list(range(first, first + self.ep))

    def replica_ranks(self, rank: int) -> list[int]:
        """The ranks that hold the same experts as `rank` (its expert parameters are all-reduced over these)."""
        return list(range(rank % self.ep, self.world_size, self.ep))


@dataclass(frozen=True, kw_only=True)
class ExpertGroup:
    """One rank's place in an expert-parallel group: who it talks to and which experts it holds."""
    ctx: Context
    group: Any               # the ep ranks' process group
    rank: int                # this rank's index in the group
    size: int                # N = ep
    experts: int             # E (all of them, over the group)

    @property
    def per_rank(self) -> int:
        return self.experts // self.size


def expert_group(ctx: Context, layout: ExpertLayout, experts: int) -> ExpertGroup:
    """This rank's expert-parallel group in `layout` (every rank calls it, in the same order)."""
    ranks = layout.ep_ranks(ctx.rank)
    return ExpertGroup(ctx=ctx, group=ctx.group_of(ranks), rank=ranks.index(ctx.rank), size=layout.ep, experts=experts)


class AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes as an autograd op: its backward sends the gradients back the other way."""

    @staticmethod
    def forward(fctx: Any, rows: torch.Tensor, ep: ExpertGroup, send: list[int], recv: list[int],
                phase: str) -> torch.Tensor:
        fctx.ep, fctx.send, fctx.recv, fctx.phase = ep, send, recv, phase
        return all_to_all_single(ep.ctx, rows, send_splits=send, recv_splits=recv, phase=f"{phase} forward",
                                 group=ep.group)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        back = all_to_all_single(fctx.ep.ctx, grad.contiguous(), send_splits=fctx.recv, recv_splits=fctx.send,
                                 phase=f"{fctx.phase} backward", group=fctx.ep.group)
        return back, None, None, None, None


@dataclass(frozen=True, kw_only=True)
class EPOut:
    """What one rank computed: the layer's output for its tokens, and what its experts received."""
    out: MoEOut              # y (T_r, d), routing, counts (E,) of this rank's assignments per expert
    table: torch.Tensor      # (N, E/N) int64: rows each source rank sent to each of this rank's experts
    inputs: torch.Tensor     # (rows, d) what this rank's experts received, expert by expert, in token order
    sent: list[int]          # rows this rank sent to each rank of the group
    received: list[int]      # rows it received from each
    dropped: list[int]       # per local expert: rows past its capacity (zero output)


def ep_forward(moe: MoEMLP, x: torch.Tensor, ep: ExpertGroup, *, cap: int | None = None) -> EPOut:
    """The MoE layer on this rank's tokens x (T_r, d), its experts spread over the group (see the module doc)."""
    T, k, n, per = x.shape[0], moe.k, ep.size, ep.per_rank
    routing = route(moe.router, x, k=k)
    ids = routing.experts.reshape(-1)                                    # (T k,) assignments, token by token
    order, inverse = dispatch_order(ids)
    counts = torch.bincount(ids, minlength=ep.experts)                   # (E,)
    table = all_to_all(ep.ctx, counts.view(n, per), phase="counts", group=ep.group)    # row s: from rank s
    send, recv = counts.view(n, per).sum(1).tolist(), table.sum(1).tolist()
    rows = AllToAll.apply(x[order // k], ep, send, recv, "dispatch")    # (sum recv, d), source by source
    local = torch.arange(per).repeat(n).repeat_interleave(table.reshape(-1))   # each received row's local expert
    regroup, undo = dispatch_order(local)
    per_expert = table.sum(0).tolist()
    inputs = rows[regroup]
    done = run_experts(moe.experts, ep.rank * per, inputs, per_expert, cap)[undo]
    back = AllToAll.apply(done, ep, recv, send, "combine")              # (T k, d), in this rank's sorted order
    y = combine(routing.gates, back[inverse].view(T, k, -1))
    dropped = [0 if cap is None else max(0, c - cap) for c in per_expert]
    return EPOut(out=MoEOut(y, routing, counts), table=table, inputs=inputs.detach(), sent=send, received=recv,
                 dropped=dropped)


def global_counts(ctx: Context, counts: torch.Tensor) -> torch.Tensor:
    """Assignments per expert over every rank's tokens (for the balancing loss's f_e): an all-reduce of E ints."""
    return all_reduce(ctx, counts.clone(), phase="balance counts")


def is_expert(name: str) -> bool:
    """Whether a parameter belongs to an expert (else it is dense: replicated on every rank)."""
    return ".experts." in f".{name}"


def sync_gradients(ctx: Context, model: nn.Module, layout: ExpertLayout) -> None:
    """Sum the gradients of every rank's loss share: dense ones over all ranks, expert ones over their replicas.

    Each rank's loss is its tokens' share of the batch's mean, so summed gradients are the batch's.
    """
    replicas = layout.replica_ranks(ctx.rank)
    group = ctx.group_of(replicas) if len(replicas) > 1 else None
    for name, p in model.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        if not is_expert(name):
            all_reduce(ctx, grad, phase="dense grads")
        elif group is not None:
            all_reduce(ctx, grad, phase="expert grads", group=group)
        p.grad = grad
