"""The pruned causal ring: a rank stops forwarding a K, V block once no rank further along reads it.

The uniform ring (ring.py) moves every block N-1 hops. Under a causal mask
on the contiguous layout, block s is read only by ranks s..N-1, so its hops
from rank N-1 on to ranks 0..s-1 carry keys that every query there would
mask: N(N-1)/2 of the N(N-1) forward sends are dead. Here each block
travels `layout.block_reach` hops and no more. Nothing else changes: the
same tiles are merged in the same order, so the output equals the uniform
ring's bit for bit; only the sends that fed skipped steps are gone.

The bytes saved are not spread evenly. Rank r sends r+1 blocks and the last
rank none (costs.pruned_kv_sends): the link from rank N-2 to N-1 still
carries N-1 blocks, as every link of the uniform ring does, and the last
rank still does the most arithmetic. Zigzag balances that arithmetic, but
every rank reads every block there, so it has nothing to prune
(block_reach is N-1 for each block and this ring sends what ring.py sends).

Backward prunes the same way. K, V travel their reach again; a block's
dK, dV partial sum trails it one step behind, and the last rank on its path
sends the finished sum straight to the owner (a ring hop when the path is
the whole ring). Adding a skipped step's zero share is exact, so the
gradients equal the uniform ring's bit for bit too.
Shapes: q (B, H, c, D), k (B, H, c, D), v (B, H, c, Dv), c = S / N tokens per rank.
"""
from __future__ import annotations

import math

import torch

from wmdist.comm import Context, Pending, irecv, isend
from wmdist.ring_attention.blockwise import block_is_future, check_shapes
from wmdist.ring_attention.layout import Layout, block_reach, ring_source
from wmdist.ring_attention.ring import (BACKWARD_GRAD, BACKWARD_KV, FORWARD, RingTrace, _Clock, _forward_step,
                                        _grad_step, _layout_args, _trace, _wait_all, positions)


def _checked_reach(reach: list[int], world_size: int) -> list[int]:
    """A given reach, refused unless it is N hop counts in 0..N-1."""
    hops = list(reach)
    if len(hops) != world_size or any(not isinstance(h, int) or not 0 <= h < world_size for h in hops):
        raise ValueError(f"reach must be {world_size} hop counts in 0..{world_size - 1}, got {reach!r}")
    return hops


def _kv_moves(ctx: Context, reach: list[int], t: int, kv: torch.Tensor, spare: torch.Tensor,
              phase: str) -> tuple[list[Pending], bool]:
    """Post step t's K, V send (if the held block goes further) and receive (if the next one reaches this rank)."""
    n, rank = ctx.world_size, ctx.rank
    pending: list[Pending] = []
    if t < reach[(rank - t) % n]:
        pending.append(isend(ctx, kv, (rank + 1) % n, phase=phase))
    receives = t + 1 < n and t + 1 <= reach[(rank - t - 1) % n]
    if receives:
        pending.append(irecv(ctx, spare, (rank - 1) % n, phase=phase))
    return pending, receives


def _setup(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, layout: Layout,
           block_size: int, causal: bool, reach: list[int] | None) -> tuple:
    """What both directions start from, checked before any message: N, rank, query positions, tile, each block's
    reach, the softmax scale, the key width and the packed K, V block (B, H, c, Dk + Dv)."""
    check_shapes(q, k, v)
    n = ctx.world_size
    q_pos, block = _layout_args(ctx, q, seq_len, layout, block_size)
    reach = block_reach(seq_len, n, layout=layout, causal=causal) if reach is None else _checked_reach(reach, n)
    return (n, ctx.rank, q_pos, block, reach, 1.0 / math.sqrt(q.shape[-1]), k.shape[-1],
            torch.cat([k, v], dim=-1).contiguous())


def pruned_forward(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seq_len: int, layout: Layout,
                   causal: bool, block_size: int,
                   reach: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, RingTrace]:
    """This rank's attention output (B, H, c, Dv) and lse (B, H, c), sending each block only as far as it is read.

    Ledger phase "ring kv", like ring_forward; a step whose block never
    reaches this rank is recorded as skipped, like an all-future one.
    `reach` overrides layout.block_reach (an experiment: cut a block's trip
    one hop short and a rank that needed it answers without its keys).
    """
    n, rank, q_pos, block, reach, scale, dk, kv = _setup(ctx, q, k, v, seq_len, layout, block_size, causal, reach)
    spare = torch.empty_like(kv)
    out = q.new_zeros(q.shape[:3] + v.shape[3:])                      # (B, H, c, Dv)
    lse = q.new_full(q.shape[:3], -math.inf)                          # (B, H, c)
    clock, work, skipped = _Clock(rank), [], []
    for t in range(n):
        source = ring_source(rank, t, n)
        k_pos = positions(seq_len, n, source, layout=layout)
        pending, receives = _kv_moves(ctx, reach, t, kv, spare, FORWARD)
        _forward_step(clock, work, skipped, t, t > reach[source] or (causal and block_is_future(q_pos, k_pos)),
                      q, q_pos, kv, k_pos, dk, block, causal, scale, out, lse)
        if pending:
            clock.timed("comm", f"kv {t}", _wait_all, tuple(pending))
        if receives:
            kv, spare = spare, kv
    return out, lse, _trace(work, skipped, clock)


def pruned_backward(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, dout: torch.Tensor, *, seq_len: int, layout: Layout, causal: bool,
                    block_size: int,
                    reach: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RingTrace]:
    """(dq, dk, dv) of this rank's rows from the forward's final (out, lse); K, V and dK, dV go only as far as needed.

    Phases "backward kv" and "backward dkv", like ring_backward. Messages
    between two ranks are matched in posting order, so receives from the
    left neighbour are posted in the order it sends (dK, dV of step t-1,
    then K, V of step t); the owner's finished sum comes from the block's
    last rank, which sends this rank nothing else unless it is the left
    neighbour (then it is the last message from there, received last).
    `reach` as in pruned_forward; every rank must be given the same one.
    """
    n, rank, q_pos, block, reach, scale, dk, kv = _setup(ctx, q, k, v, seq_len, layout, block_size, causal, reach)
    spare, incoming, home = torch.empty_like(kv), torch.empty_like(kv), torch.empty_like(kv)
    dq = torch.zeros_like(q)
    clock, work, skipped = _Clock(rank), [], []
    last, left = (rank + reach[rank]) % n, (rank - 1) % n             # the last rank that reads this rank's block
    home_recv = irecv(ctx, home, last, phase=BACKWARD_GRAD) if reach[rank] and last != left else None
    own = grad_send = None
    for t in range(n):
        source = ring_source(rank, t, n)
        k_pos = positions(seq_len, n, source, layout=layout)
        holds = t <= reach[source]
        grad_recv = irecv(ctx, incoming, left, phase=BACKWARD_GRAD) if holds and t >= 2 else None
        pending, receives = _kv_moves(ctx, reach, t, kv, spare, BACKWARD_KV)
        if holds and not (causal and block_is_future(q_pos, k_pos)):
            share, tiles, pairs = clock.timed("compute", f"step {t}", _grad_step, q, q_pos, kv, k_pos, dk, block,
                                              causal, scale, out, lse, dout, dq)
        else:
            share, tiles, pairs = torch.zeros_like(kv), 0, 0
            skipped.append(t)
        work.append((tiles, pairs))
        if t == 0:
            own = share                                               # this rank's share of its own block
        elif holds:
            if grad_recv is not None:
                share += clock.timed("comm", f"dkv in {t}", grad_recv.wait)
            if grad_send is not None:
                clock.timed("comm", f"dkv out {t - 1}", grad_send.wait)
            onward = (rank + 1) % n if t < reach[source] else source  # the block's last reader sends the sum home
            grad_send = isend(ctx, share, onward, phase=BACKWARD_GRAD)
        if pending:
            clock.timed("comm", f"kv {t}", _wait_all, tuple(pending))
        if receives:
            kv, spare = spare, kv
    if reach[rank]:
        done = home_recv if home_recv is not None else irecv(ctx, home, left, phase=BACKWARD_GRAD)
        own += clock.timed("comm", "dkv home", done.wait)
    if grad_send is not None:
        clock.timed("comm", "dkv out", grad_send.wait)
    return dq, own[..., :dk], own[..., dk:], _trace(work, skipped, clock)
