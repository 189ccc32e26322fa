"""Ring reduce-scatter, all-gather and all-reduce, written out round by round and counted.

The teaching version of the collectives: N-1 rounds per phase, in each round
every rank sends one chunk to its right neighbour and receives one from its
left, so the ledger holds the exact wire bytes, 2(N-1)G/N per rank for an
all-reduce. Chunks follow `costs.ring_chunk_sizes` (torch.tensor_split's
layout): rank r owns chunk r after the reduce-scatter, for any N and any
length. The rounds run on views of one flat buffer, and received partial sums
land in a receive buffer the rank process keeps between calls (ctx.scratch),
because first-touch page faults on fresh memory cost as much as the sending.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from wmdist.comm.context import Context
from wmdist.comm.ledger import counted
from wmdist.comm.p2p import global_rank, nbytes, resolve


class _Ring:
    """One rank's place in a ring for one phase: its neighbours, and the sends still in flight.

    Each round receives into a buffer whose receive was posted before the
    round began, sends without waiting for the send to finish, and waits only
    for the incoming chunk; the sends are waited for together when the phase
    ends. So a rank never idles on its own outgoing bytes, and a neighbour's
    chunk can land as soon as it is sent: this is what brings the hand-written
    ring close to gloo's own (pipelined) all-reduce.
    """

    def __init__(self, ctx: Context, rank: int, n: int, phase: str, group: dist.ProcessGroup | None):
        self.ctx, self.phase, self.group = ctx, phase, group
        self.right, self.left = (rank + 1) % n, (rank - 1) % n
        self.sends: list = []

    def post_recv(self, tensor: torch.Tensor) -> object:
        """Start receiving the left neighbour's next chunk into `tensor`."""
        return dist.irecv(tensor, global_rank(self.group, self.left), group=self.group)

    def round(self, out: torch.Tensor, pending: object, incoming: torch.Tensor) -> None:
        """One counted round: send `out` right, wait for `incoming` (received by `pending`) from the left."""
        with counted(self.ctx, "ring round", self.phase, sent=nbytes(out), recv=nbytes(incoming), kind="p2p",
                     peer=self.right, src=self.left, messages=1):
            self.sends.append(dist.isend(out, global_rank(self.group, self.right), group=self.group))
            pending.wait()

    def finish(self) -> None:
        """Wait until every chunk this rank sent has left."""
        self.ctx.ledger.enter(f"wait for {len(self.sends)} ring send(s) [phase {self.phase!r}]")
        for work in self.sends:
            work.wait()
        self.ctx.ledger.leave()


def _reduce_scatter_rounds(ctx: Context, chunks: list[torch.Tensor], rank: int, n: int, phase: str,
                           group: dist.ProcessGroup | None) -> None:
    """Round s sends partial chunk (r-s-1) right, receives chunk (r-s-2) from the left and adds it."""
    ring = _Ring(ctx, rank, n, phase, group)
    scratch = ctx.scratch(max(c.numel() for c in chunks), dtype=chunks[0].dtype)
    incoming = lambda s: scratch[: chunks[(rank - s - 2) % n].numel()]     # noqa: E731 - round s's landing place
    pending = ring.post_recv(incoming(0)) if n > 1 else None
    for s in range(n - 1):
        ring.round(chunks[(rank - s - 1) % n], pending, incoming(s))
        chunks[(rank - s - 2) % n] += incoming(s)
        if s + 1 < n - 1:
            pending = ring.post_recv(incoming(s + 1))                      # the scratch is free again
    ring.finish()


def _all_gather_rounds(ctx: Context, chunks: list[torch.Tensor], rank: int, n: int, phase: str,
                       group: dist.ProcessGroup | None) -> None:
    """Round s forwards chunk (r-s) right and receives chunk (r-s-1) from the left, in place."""
    ring = _Ring(ctx, rank, n, phase, group)
    pending = ring.post_recv(chunks[(rank - 1) % n]) if n > 1 else None
    for s in range(n - 1):
        ring.round(chunks[(rank - s) % n], pending, chunks[(rank - s - 1) % n])
        if s + 1 < n - 1:
            pending = ring.post_recv(chunks[(rank - s - 2) % n])
    ring.finish()


def ring_reduce_scatter(ctx: Context, flat: torch.Tensor, *, phase: str = "reduce-scatter",
                        group: dist.ProcessGroup | None = None, sizes: list[int] | None = None) -> torch.Tensor:
    """Sum a tensor (flattened) across the ring; return this rank's chunk of the sum (chunk r).

    N-1 rounds. The input is not modified. The result owns its memory (a copy
    of chunk r), so the full-size working buffer is freed on return: what a
    ZeRO rank holds afterwards is really only its shard. Chunks follow
    torch.tensor_split's layout unless `sizes` (one element count per rank,
    e.g. whole sequence rows) says otherwise, as in ring_all_gather.
    """
    group, r, n = resolve(ctx, group)
    data = flat.reshape(-1).clone()
    if sizes is not None and (len(sizes) != n or sum(sizes) != data.numel()):
        raise ValueError(f"rank {r}: sizes {sizes} do not split {data.numel()} elements over {n} ranks")
    chunks = list(torch.split(data, sizes) if sizes is not None else torch.tensor_split(data, n))  # N views
    _reduce_scatter_rounds(ctx, chunks, r, n, phase, group)
    return chunks[r].clone()


def ring_all_gather(ctx: Context, chunk: torch.Tensor, sizes: list[int], *, phase: str = "all-gather",
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's 1-D chunk (rank r holds chunk r of `sizes`); returns (sum(sizes),)."""
    group, r, n = resolve(ctx, group)
    if len(sizes) != n or chunk.numel() != sizes[r]:
        raise ValueError(f"rank {r}: chunk of {chunk.numel()} elements does not match sizes {sizes}")
    out = chunk.new_empty(sum(sizes))                                     # (sum(sizes),)
    chunks = list(torch.split(out, sizes))
    chunks[r].copy_(chunk.reshape(-1))
    _all_gather_rounds(ctx, chunks, r, n, phase, group)
    return out


def ring_all_reduce(ctx: Context, tensor: torch.Tensor, *, phase: str = "all-reduce",
                    group: dist.ProcessGroup | None = None, inplace: bool = False) -> torch.Tensor:
    """Sum `tensor` over all ranks with a ring: reduce-scatter, then all-gather.

    Each rank sends 2(N-1)G/N bytes (exactly costs.ring_allreduce_bytes). Returns
    a new tensor of the input's shape, or, with `inplace=True`, writes the sum
    into `tensor` (which must be contiguous) and returns it, as dist.all_reduce does.
    """
    group, r, n = resolve(ctx, group)
    if inplace and not tensor.is_contiguous():
        raise ValueError("ring_all_reduce(inplace=True) needs a contiguous tensor")
    out = tensor if inplace else tensor.clone(memory_format=torch.contiguous_format)
    chunks = list(torch.tensor_split(out.view(-1), n))                     # N views of (~G/N,)
    _reduce_scatter_rounds(ctx, chunks, r, n, f"{phase}/reduce-scatter", group)
    _all_gather_rounds(ctx, chunks, r, n, f"{phase}/all-gather", group)
    return out
