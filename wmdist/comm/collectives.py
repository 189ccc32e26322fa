"""Counted built-in collectives: torch.distributed's own algorithms, recorded by payload.

gloo (or NCCL) chooses how the bytes travel, which Python cannot observe, so
each record holds this rank's *payload*: what it contributes and what it ends
up with. The hand-written rings in `wmdist.comm.ring` record exact wire bytes
instead. Payload conventions (n = bytes of this rank's input tensor, N = group size):

    all_reduce      sent n,                recv n
    all_gather      sent n,                recv (N-1) n   (the other ranks' pieces)
    reduce_scatter  sent n (the full input), recv n / N  (this rank's reduced piece)
    broadcast       source sends n, every other rank receives n
    all_to_all      sent n - n/N (pieces for others), recv the same
    all_to_all_single (uneven splits) sent the rows for other ranks, recv the rows from them (exact: the
                    split sizes say which rows go where; the rows a rank keeps for itself are not counted)
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from wmdist.comm.context import Context
from wmdist.comm.ledger import counted
from wmdist.comm.p2p import Pending, global_rank, nbytes, resolve


def _split_dim0(op: str, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """The tensor, contiguous, after checking that its dim 0 splits into n equal pieces."""
    if tensor.dim() == 0 or tensor.shape[0] % n:
        raise ValueError(f"{op} needs dim 0 divisible by the group size {n}, got shape {tuple(tensor.shape)}")
    return tensor.contiguous()


def all_reduce(ctx: Context, tensor: torch.Tensor, *, phase: str = "all_reduce",
               group: dist.ProcessGroup | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Sum `tensor` over the group in place; with async_op, return a Pending handle at once."""
    group, _, _ = resolve(ctx, group)
    n = nbytes(tensor)
    with counted(ctx, "all_reduce" + (" (async)" if async_op else ""), phase, sent=n, recv=n):
        work = dist.all_reduce(tensor, group=group, async_op=async_op)
    return Pending(ctx, work, tensor, f"all_reduce {n} B [phase {phase!r}]") if async_op else tensor


def all_gather(ctx: Context, tensor: torch.Tensor, *, phase: str = "all_gather",
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's equally shaped `tensor` along dim 0: (N * d0, ...)."""
    group, _, n = resolve(ctx, group)
    data = tensor.contiguous()
    out = data.new_empty((n * data.shape[0], *data.shape[1:]) if data.dim() else (n,))
    with counted(ctx, "all_gather", phase, sent=nbytes(data), recv=(n - 1) * nbytes(data)):
        dist.all_gather_single(out, data.reshape(-1) if data.dim() == 0 else data, group=group)
    return out


def reduce_scatter(ctx: Context, tensor: torch.Tensor, *, phase: str = "reduce_scatter",
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` over the group and keep this rank's 1/N of it along dim 0 (dim 0 must divide by N)."""
    group, _, n = resolve(ctx, group)
    data = _split_dim0("reduce_scatter", tensor, n)
    out = data.new_empty((data.shape[0] // n, *data.shape[1:]))
    with counted(ctx, "reduce_scatter", phase, sent=nbytes(data), recv=nbytes(out)):
        dist.reduce_scatter_single(out, data, group=group)
    return out


def broadcast(ctx: Context, tensor: torch.Tensor, src: int, *, phase: str = "broadcast",
              group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Copy the source rank's `tensor` into every rank's `tensor` (in place); `src` is a group rank."""
    group, me, _ = resolve(ctx, group)
    n = nbytes(tensor)
    with counted(ctx, "broadcast", phase, sent=n if me == src else 0, recv=0 if me == src else n):
        dist.broadcast(tensor, global_rank(group, src), group=group)
    return tensor


def all_to_all(ctx: Context, tensor: torch.Tensor, *, phase: str = "all_to_all",
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Piece j of `tensor` (dim 0 split in N equal pieces) goes to rank j; piece i of the result came from rank i."""
    group, _, n = resolve(ctx, group)
    data = _split_dim0("all_to_all", tensor, n)
    out = torch.empty_like(data)
    moved = nbytes(data) - nbytes(data) // n
    with counted(ctx, "all_to_all", phase, sent=moved, recv=moved):
        dist.all_to_all_single(out, data, group=group)
    return out


def all_to_all_single(ctx: Context, tensor: torch.Tensor, *, send_splits: Sequence[int], recv_splits: Sequence[int],
                      phase: str = "all_to_all_single", group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Uneven all-to-all along dim 0: the next send_splits[j] rows go to group rank j, in rank order; the result
    holds recv_splits[i] rows from rank i, in rank order (torch's all_to_all_single with split sizes).

    Every rank must pass splits that agree (rank i's send_splits[j] == rank j's recv_splits[i]): exchange the
    counts first. Counted exactly: sent = rows for the other ranks x row bytes, recv = rows from them.
    """
    group, me, n = resolve(ctx, group)
    send, got = [int(s) for s in send_splits], [int(s) for s in recv_splits]
    if tensor.dim() == 0 or len(send) != n or len(got) != n or min(send + got) < 0 or sum(send) != tensor.shape[0]:
        rows = tensor.shape[0] if tensor.dim() else "of a 0-dim tensor's"
        raise ValueError(f"all_to_all_single on {n} ranks needs {n} split sizes >= 0 each way, sending all "
                         f"{rows} rows; got send {send}, recv {got}")
    data = tensor.contiguous()
    row = math.prod(data.shape[1:]) * data.element_size()         # bytes of one row
    out = data.new_empty((sum(got), *data.shape[1:]))
    with counted(ctx, "all_to_all_single", phase, sent=(sum(send) - send[me]) * row, recv=(sum(got) - got[me]) * row):
        dist.all_to_all_single(out, data, output_split_sizes=got, input_split_sizes=send, group=group)
    return out


def barrier(ctx: Context, *, phase: str = "barrier", group: dist.ProcessGroup | None = None) -> None:
    """torch.distributed.barrier, recorded so that a rank stuck inside it is named."""
    group, _, _ = resolve(ctx, group)
    with counted(ctx, "barrier", phase, messages=0):
        dist.barrier(group=group)
