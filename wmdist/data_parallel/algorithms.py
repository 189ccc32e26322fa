"""Three more ways to all-reduce, written out with the counted sends of wmdist.comm (the ring is in comm/ring.py).

Each function sums a tensor over all ranks and returns the sum on every rank, as ring_all_reduce
does; they differ in who talks to whom and how much:

    tree_all_reduce              binomial tree: whole vectors flow up to rank 0, which then sends
                                 the sum back down: few rounds (2 ceil(log2 N) at the root), many bytes
    halving_doubling_all_reduce  Rabenseifner: partners at distance N/2, N/4, ..., 1 swap halves of
                                 what they still sum (reduce-scatter), then at 1, 2, ..., N/2 swap
                                 what they have (all-gather): few rounds and the ring's bytes
    direct_all_reduce            every rank sends chunk j straight to rank j, then its summed chunk
                                 to everyone: the ring's bytes, and no chunk is ever forwarded

Every message goes through wmdist.comm's counted send, recv and exchange, so the ledger holds the
exact bytes and rounds that wmdist.costs.allreduce predicts. Each adds the same N vectors in a
different order, so their float32 results differ from each other at rounding level.
"""
from __future__ import annotations

import torch

from wmdist.comm import Context, exchange, recv, send


def tree_all_reduce(ctx: Context, tensor: torch.Tensor, *, phase: str = "tree") -> torch.Tensor:
    """Sum over the ranks by a binomial tree: reduce to rank 0, then broadcast from it. Returns a new tensor.

    Level k = 0, 1, ...: a rank whose lowest set bit is 2^k sends its partial sum to rank - 2^k and
    is done; a rank with its low k+1 bits zero receives from rank + 2^k (if there is one) and adds.
    The broadcast runs the same edges backwards, so every rank ends with rank 0's bits.
    """
    r, n = ctx.rank, ctx.world_size
    out = tensor.reshape(-1).clone()                                  # (G,)
    incoming = torch.empty_like(out)
    levels = (n - 1).bit_length()                                      # ceil(log2 N)
    for k in range(levels):
        m = 1 << k
        if r & m:                                                      # m is r's lowest set bit: send up
            send(ctx, out, r - m, phase=f"{phase}/reduce")
            break
        if r + m < n:
            out += recv(ctx, incoming, r + m, phase=f"{phase}/reduce")
    top = r & -r if r else 1 << levels                                 # children sit below this distance
    if r:
        recv(ctx, out, r - top, phase=f"{phase}/broadcast")
    for k in reversed(range(top.bit_length() - 1)):
        if r + (1 << k) < n:
            send(ctx, out, r + (1 << k), phase=f"{phase}/broadcast")
    return out.view(tensor.shape)


def halving_doubling_all_reduce(ctx: Context, tensor: torch.Tensor, *,
                                phase: str = "halving-doubling") -> torch.Tensor:
    """Sum over the ranks by recursive halving then doubling (Rabenseifner). Returns a new tensor.

    Runs on the largest power of two p <= N ranks. When N is not a power of two the first N - p even
    ranks fold first: each sends its whole vector to rank + 1, waits, and receives the sum at the end.
    The p core ranks cut the vector into p chunks (torch.tensor_split's layout); core rank q ends the
    halving holding the full sum of chunk q, and the doubling spreads the chunks back. (MPICH halves
    from distance 1 upwards instead; starting at p/2 is what leaves chunk q, in order, on core rank q.)
    """
    r, n = ctx.rank, ctx.world_size
    out = tensor.reshape(-1).clone()                                  # (G,)
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    if r < 2 * extra and r % 2 == 0:                                   # folded: hand the vector in, wait
        send(ctx, out, r + 1, phase=f"{phase}/fold")
        recv(ctx, out, r + 1, phase=f"{phase}/unfold")
        return out.view(tensor.shape)
    if r < 2 * extra:                                                  # partner: add the folded vector
        out += recv(ctx, torch.empty_like(out), r - 1, phase=f"{phase}/fold")
    q = r // 2 if r < 2 * extra else r - extra                         # rank among the p core ranks
    real = lambda c: 2 * c + 1 if c < extra else c + extra             # noqa: E731 - core rank -> rank
    sizes = [t.numel() for t in torch.tensor_split(out, p)]
    starts = [sum(sizes[:i]) for i in range(p + 1)]                    # chunk i is out[starts[i]:starts[i+1]]
    span = lambda lo, width: (starts[lo], starts[lo + width])          # noqa: E731 - elements of chunks lo..
    lo, width = 0, p                                                   # the chunks this rank still sums
    while width > 1:                                                   # halving: distance p/2, p/4, ..., 1
        width //= 2
        keep, give = (lo + width, lo) if q & width else (lo, lo + width)
        (a, b), (c, d) = span(keep, width), span(give, width)
        incoming = torch.empty(b - a, dtype=out.dtype)
        exchange(ctx, out[c:d], real(q ^ width), incoming, real(q ^ width), phase=f"{phase}/reduce-scatter")
        out[a:b] += incoming
        lo = keep
    while width < p:                                                   # doubling: distance 1, 2, ..., p/2
        other = lo ^ width                                             # the partner's block of chunks
        (a, b), (c, d) = span(lo, width), span(other, width)
        exchange(ctx, out[a:b], real(q ^ width), out[c:d], real(q ^ width), phase=f"{phase}/all-gather")
        lo, width = min(lo, other), 2 * width
    if r < 2 * extra:
        send(ctx, out, r - 1, phase=f"{phase}/unfold")
    return out.view(tensor.shape)


def direct_all_reduce(ctx: Context, tensor: torch.Tensor, *, phase: str = "direct") -> torch.Tensor:
    """Sum over the ranks by an all-to-all reduce-scatter and a direct all-gather. Returns a new tensor.

    In step s = 1..N-1 rank r sends chunk r+s of its own vector to rank r+s and receives rank r-s's
    copy of chunk r (pairwise exchange: one peer each way per round); then, in N-1 more steps, it
    sends its summed chunk r to rank r+s and receives chunk r-s from its owner.
    """
    r, n = ctx.rank, ctx.world_size
    mine = tensor.reshape(-1)                                          # (G,) the input, read only
    out = mine.clone()
    chunks, inputs = torch.tensor_split(out, n), torch.tensor_split(mine, n)
    incoming = torch.empty_like(chunks[r])
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        exchange(ctx, inputs[dst], dst, incoming, src, phase=f"{phase}/reduce-scatter")
        chunks[r].add_(incoming)
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        exchange(ctx, chunks[r], dst, chunks[src], src, phase=f"{phase}/all-gather")
    return out.view(tensor.shape)
