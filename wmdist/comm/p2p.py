"""Counted point-to-point communication: blocking and non-blocking sends and receives.

Ranks are *group* ranks when a group is given (as in torch.distributed's
`group_dst`), global ranks otherwise. Non-blocking ops are counted when they
are posted (the bytes are committed then) and return a `Pending` handle whose
`wait()` is noted in the ledger too, so a rank stuck waiting is reported with
the transfer it waits for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from wmdist.comm.context import Context
from wmdist.comm.ledger import counted


def nbytes(t: torch.Tensor) -> int:
    """Payload bytes of a tensor: numel * element size."""
    return t.numel() * t.element_size()


def resolve(ctx: Context, group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup | None, int, int]:
    """(group, this rank's rank in it, its size), defaulting to ctx.group, then the world."""
    group = ctx.group if group is None else group
    if group is None:
        return None, ctx.rank, ctx.world_size
    return group, dist.get_rank(group), dist.get_world_size(group)


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


@dataclass
class Pending:
    """A posted non-blocking op. `wait()` blocks until it is done and returns its tensor."""
    ctx: Context
    work: Any                       # torch.distributed Work
    tensor: torch.Tensor            # the buffer being sent from or received into (kept alive)
    description: str

    def wait(self) -> torch.Tensor:
        self.ctx.ledger.enter(f"wait for {self.description}")
        self.work.wait()
        self.ctx.ledger.leave()
        return self.tensor

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def future(self) -> torch.futures.Future:
        """The op's future (e.g. to chain a callback, as a DDP comm hook must return)."""
        return self.work.get_future()


def send(ctx: Context, tensor: torch.Tensor, dst: int, *, phase: str = "send",
         group: dist.ProcessGroup | None = None) -> None:
    """Blocking send to rank `dst`, counted."""
    group, _, _ = resolve(ctx, group)
    with counted(ctx, "send", phase, sent=nbytes(tensor), kind="p2p", peer=dst, messages=1):
        dist.send(tensor.contiguous(), global_rank(group, dst), group=group)


def recv(ctx: Context, tensor: torch.Tensor, src: int, *, phase: str = "recv",
         group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Blocking receive into `tensor` from rank `src`, counted; returns `tensor`."""
    group, _, _ = resolve(ctx, group)
    with counted(ctx, "recv", phase, recv=nbytes(tensor), kind="p2p", src=src, messages=0):
        dist.recv(tensor, global_rank(group, src), group=group)
    return tensor


def isend(ctx: Context, tensor: torch.Tensor, dst: int, *, phase: str = "isend",
          group: dist.ProcessGroup | None = None) -> Pending:
    """Post a send to rank `dst` and return at once; call `.wait()` before reusing `tensor`."""
    group, _, _ = resolve(ctx, group)
    data = tensor.contiguous()
    with counted(ctx, "isend", phase, sent=nbytes(data), kind="p2p", peer=dst, messages=1):
        work = dist.isend(data, global_rank(group, dst), group=group)
    return Pending(ctx, work, data, f"isend {nbytes(data)} B to rank {dst} [phase {phase!r}]")


def irecv(ctx: Context, tensor: torch.Tensor, src: int, *, phase: str = "irecv",
          group: dist.ProcessGroup | None = None) -> Pending:
    """Post a receive into `tensor` from rank `src`; `.wait()` returns the filled tensor."""
    group, _, _ = resolve(ctx, group)
    with counted(ctx, "irecv", phase, recv=nbytes(tensor), kind="p2p", src=src, messages=0):
        work = dist.irecv(tensor, global_rank(group, src), group=group)
    return Pending(ctx, work, tensor, f"irecv {nbytes(tensor)} B from rank {src} [phase {phase!r}]")


def exchange(ctx: Context, send_tensor: torch.Tensor, dst: int, recv_tensor: torch.Tensor, src: int,
             *, phase: str = "exchange", group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send to `dst` while receiving from `src`: one round of a ring.

    The send is posted asynchronously first, so a ring in which every rank
    sends and receives at once cannot deadlock.
    """
    group, _, _ = resolve(ctx, group)
    data = send_tensor.contiguous()
    with counted(ctx, "exchange", phase, sent=nbytes(data), recv=nbytes(recv_tensor), kind="p2p",
                 peer=dst, src=src, messages=1):
        request = dist.isend(data, global_rank(group, dst), group=group)
        dist.recv(recv_tensor, global_rank(group, src), group=group)
        request.wait()
    return recv_tensor
