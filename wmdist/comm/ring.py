"""Ring reduce-scatter, all-gather and all-reduce, written out round by round and counted.

The teaching version of the collectives: N-1 rounds per phase, in each round
every rank sends one chunk to its right neighbour and receives one from its
left, so the ledger holds the exact wire bytes, 2(N-1)G/N per rank for an
all-reduce. Chunks follow `costs.ring_chunk_sizes` (torch.tensor_split's
layout): rank r owns chunk r after the reduce-scatter, for any N and any
length. The rounds run on views of one flat buffer, and received partial sums
land in a receive buffer the rank process keeps between calls (ctx.scratch),
because first-touch page faults on fresh memory cost as much as the sending.

Receives are posted before the left neighbour sends, two rounds ahead, and
an all-reduce posts its all-gather's first receives before its reduce-scatter
starts and sends each piece of its finished chunk on as soon as it is summed
(ring_rounds.py). With `chunk_bytes`, a chunk larger than that travels as
several messages (pieces), so adding one piece overlaps receiving the next;
the bytes and the rounds stay as above and the result keeps every bit, only
the message count grows (`costs.ring_allreduce_messages`). The default,
`costs.DEFAULT_RING_CHUNK_BYTES`, is None (one message per chunk, the
2(N-1) the text counts): cutting was measured slower on this course's
machines (the numbers are next to the constant).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from wmdist import costs
from wmdist.comm.context import Context
from wmdist.comm.p2p import resolve
from wmdist.comm.ring_rounds import AllGather, reduce_scatter_rounds

DEFAULT_CHUNK_BYTES = costs.DEFAULT_RING_CHUNK_BYTES


def _chunk_elems(chunk_bytes: int | None, tensor: torch.Tensor) -> int | None:
    """Elements per piece of `tensor`'s dtype (None: no cutting); a clear error for a bad `chunk_bytes`."""
    return costs.collectives.ring_chunk_elems(chunk_bytes, elem_size=tensor.element_size())


def ring_reduce_scatter(ctx: Context, flat: torch.Tensor, *, phase: str = "reduce-scatter",
                        group: dist.ProcessGroup | None = None, sizes: list[int] | None = None,
                        chunk_bytes: int | None = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """Sum a tensor (flattened) across the ring; return this rank's chunk of the sum (chunk r).

    N-1 rounds. The input is not modified. The result owns its memory (a copy
    of chunk r), so the full-size working buffer is freed on return: what a
    ZeRO rank holds afterwards is really only its shard. Chunks follow
    torch.tensor_split's layout unless `sizes` (one element count per rank,
    e.g. whole sequence rows) says otherwise, as in ring_all_gather.
    """
    group, r, n = resolve(ctx, group)
    elems = _chunk_elems(chunk_bytes, flat)
    data = flat.reshape(-1).clone()
    if sizes is not None and (len(sizes) != n or sum(sizes) != data.numel()):
        raise ValueError(f"rank {r}: sizes {sizes} do not split {data.numel()} elements over {n} ranks")
    chunks = list(torch.split(data, sizes) if sizes is not None else torch.tensor_split(data, n))  # N views
    reduce_scatter_rounds(ctx, chunks, r, n, phase, group, elems)
    return chunks[r].clone()


def ring_all_gather(ctx: Context, chunk: torch.Tensor, sizes: list[int], *, phase: str = "all-gather",
                    group: dist.ProcessGroup | None = None,
                    chunk_bytes: int | None = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """Concatenate every rank's 1-D chunk (rank r holds chunk r of `sizes`); returns (sum(sizes),)."""
    group, r, n = resolve(ctx, group)
    elems = _chunk_elems(chunk_bytes, chunk)
    if len(sizes) != n or chunk.numel() != sizes[r]:
        raise ValueError(f"rank {r}: chunk of {chunk.numel()} elements does not match sizes {sizes}")
    out = chunk.new_empty(sum(sizes))                                     # (sum(sizes),)
    chunks = list(torch.split(out, sizes))
    chunks[r].copy_(chunk.reshape(-1))
    AllGather(ctx, chunks, r, n, phase, group, elems).run()
    return out


def ring_all_reduce(ctx: Context, tensor: torch.Tensor, *, phase: str = "all-reduce",
                    group: dist.ProcessGroup | None = None, inplace: bool = False,
                    chunk_bytes: int | None = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """Sum `tensor` over all ranks with a ring: reduce-scatter, then all-gather.

    Each rank sends 2(N-1)G/N bytes (exactly costs.ring_allreduce_bytes), in
    2(N-1) rounds and costs.ring_allreduce_messages(..., chunk_bytes=chunk_bytes)
    messages. Returns a new tensor of the input's shape, or, with `inplace=True`,
    writes the sum into `tensor` (which must be contiguous) and returns it, as
    dist.all_reduce does. The result does not depend on `chunk_bytes`, bit for bit.
    """
    group, r, n = resolve(ctx, group)
    elems = _chunk_elems(chunk_bytes, tensor)
    if inplace and not tensor.is_contiguous():
        raise ValueError("ring_all_reduce(inplace=True) needs a contiguous tensor")
    out = tensor if inplace else tensor.clone(memory_format=torch.contiguous_format)
    chunks = list(torch.tensor_split(out.view(-1), n))                     # N views of (~G/N,)
    gather = AllGather(ctx, chunks, r, n, f"{phase}/all-gather", group, elems)    # its receives wait already
    reduce_scatter_rounds(ctx, chunks, r, n, f"{phase}/reduce-scatter", group, elems, then=gather)
    gather.run(own_sent=True)
    return out
