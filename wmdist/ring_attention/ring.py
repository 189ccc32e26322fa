"""Ring attention on N ranks: queries stay, key/value blocks travel, every byte through wmdist.comm.

Forward. Rank r holds the rows of its positions (layout.rank_positions) of
q, k and v. K and V travel together as one (B, H, c, Dk + Dv) message. At
step t it holds the block that started on rank (r - t) mod N: it posts the
send of that block to r + 1 and the receive of the next one from r - 1,
computes on the block it holds while both are in flight, then waits. N-1
sends bring every block past every rank; `final_exchange=True` is the loop
of the paper's appendix, which sends after the last step too (N sends, the
last returning each block to its owner, which never needed it: it sent a
copy). Causal masks use global positions, tile by tile; a block entirely in
the rank's future is skipped but still passed on (pruned.py stops a block
after the last rank that reads it instead).

Backward: a second ring. Keeping every visiting K, V block from forward
would put the whole sequence on each rank, so K and V travel again (N-1
sends). Probabilities are recomputed tile by tile from the saved (out, lse),
as in blockwise.py. A block's dK, dV shares are summed on the way: rank r
starts the sum for the block it holds at step 1, each later rank adds its
share and passes the partial sum on, and at step N-1 it reaches the block's
owner, which adds its own step-0 share. That is N-1 sends of a dK, dV
message per rank (the same size as a K, V block), no return trip. torch's
own template sends dK, dV after every one of the N steps instead.
Shapes: q (B, H, c, D), k (B, H, c, D), v (B, H, c, Dv), c = S / N tokens per rank.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from wmdist.comm import Context, Pending, irecv, isend
from wmdist.ring_attention.blockwise import attend_block, attend_block_backward, block_is_future, check_shapes, merge
from wmdist.ring_attention.layout import Layout, rank_positions, ring_source
from wmdist.base.spans import Span

FORWARD, BACKWARD_KV, BACKWARD_GRAD = "ring kv", "backward kv", "backward dkv"


@dataclass(kw_only=True, frozen=True)
class RingTrace:
    """What one rank did in one ring pass: tiles computed per step, steps skipped, and its timeline."""
    tiles: tuple[int, ...]       # score tiles computed at each step t = 0..N-1
    pairs: tuple[int, ...]       # query-key pairs those tiles computed (unmasked entries), per step
    skipped: tuple[int, ...]     # steps whose whole K, V block was in this rank's future (causal)
    spans: tuple[Span, ...]      # "compute" (block work) and "comm" (waiting for a transfer) intervals
    compute_cpu_s: float         # this thread's CPU seconds in block work: proportional to work, not to contention


def positions(seq_len: int, world_size: int, rank: int, *, layout: Layout) -> torch.Tensor:
    """This rank's global token positions as a tensor (c,)."""
    return torch.tensor(rank_positions(seq_len, world_size, rank, layout=layout))


def _cuts(length: int, block: int) -> list[slice]:
    return [slice(i, min(i + block, length)) for i in range(0, length, block)]


def _live(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> int:
    """Query-key pairs of one tile the mask leaves: the work it really does."""
    return int((k_pos[None, :] <= q_pos[:, None]).sum()) if causal else q_pos.numel() * k_pos.numel()


class _Clock:
    """Collects spans and the compute thread's CPU time for a RingTrace."""

    def __init__(self, rank: int) -> None:
        self.rank, self.spans, self.cpu = rank, [], 0.0

    def timed(self, kind: str, label: str, fn: Any, *args: Any) -> Any:
        """fn(*args), timed as one span of `kind`."""
        start, cpu = time.perf_counter(), time.thread_time()
        result = fn(*args)
        if kind == "compute":
            self.cpu += time.thread_time() - cpu
        self.spans.append(Span(row=self.rank, start=start, end=time.perf_counter(), kind=kind, label=label))
        return result


def _attend_step(q: torch.Tensor, q_pos: torch.Tensor, kv: torch.Tensor, k_pos: torch.Tensor, dk: int,
                 block: int, causal: bool, scale: float, out: torch.Tensor, lse: torch.Tensor) -> tuple[int, int]:
    """Merge one visiting K, V block into (out, lse) in place, tile by tile; returns (tiles, pairs) computed."""
    tiles = pairs = 0
    for qs in _cuts(q.shape[2], block):
        acc = (out[:, :, qs], lse[:, :, qs])
        for ks in _cuts(kv.shape[2], block):
            if causal and block_is_future(q_pos[qs], k_pos[ks]):
                continue
            part = attend_block(q[:, :, qs], kv[:, :, ks, :dk], kv[:, :, ks, dk:], q_pos[qs], k_pos[ks],
                                causal=causal, scale=scale)
            acc = merge(*acc, *part)
            tiles, pairs = tiles + 1, pairs + _live(q_pos[qs], k_pos[ks], causal)
            del part
        out[:, :, qs], lse[:, :, qs] = acc
    return tiles, pairs


def _grad_step(q: torch.Tensor, q_pos: torch.Tensor, kv: torch.Tensor, k_pos: torch.Tensor, dk: int, block: int,
               causal: bool, scale: float, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
               dq: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """A visiting block's dK, dV share (packed like kv) and the (tiles, pairs) computed; adds the dq share in place."""
    share = torch.zeros_like(kv)                                      # (B, H, c, Dk + Dv)
    tiles = pairs = 0
    for qs in _cuts(q.shape[2], block):
        for ks in _cuts(kv.shape[2], block):
            if causal and block_is_future(q_pos[qs], k_pos[ks]):
                continue
            gq, gk, gv = attend_block_backward(q[:, :, qs], kv[:, :, ks, :dk], kv[:, :, ks, dk:], out[:, :, qs],
                                               lse[:, :, qs], dout[:, :, qs], q_pos[qs], k_pos[ks],
                                               causal=causal, scale=scale)
            dq[:, :, qs] += gq
            share[:, :, ks, :dk] += gk
            share[:, :, ks, dk:] += gv
            tiles, pairs = tiles + 1, pairs + _live(q_pos[qs], k_pos[ks], causal)
            del gq, gk, gv
    return share, tiles, pairs


def _wait_all(pending: tuple[Pending, ...]) -> None:
    for p in pending:
        p.wait()


def _forward_step(clock: _Clock, work: list[tuple[int, int]], skipped: list[int], t: int, skip: bool,
                  *step: Any) -> None:
    """Step t of a forward ring: recorded as skipped (no key it holds is visible), or one block attended (timed)."""
    if skip:
        skipped.append(t)
        work.append((0, 0))
    else:
        work.append(clock.timed("compute", f"step {t}", _attend_step, *step))


def _trace(work: list[tuple[int, int]], skipped: list[int], clock: _Clock) -> RingTrace:
    return RingTrace(tiles=tuple(w[0] for w in work), pairs=tuple(w[1] for w in work), skipped=tuple(skipped), spans=tuple(clock.spans),
                     compute_cpu_s=clock.cpu)


def _post(ctx: Context, send_buf: torch.Tensor, recv_buf: torch.Tensor, phase: str) -> tuple[Pending, Pending]:
    """Send to the right neighbour and receive from the left one, both posted, neither waited for."""
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    return isend(ctx, send_buf, right, phase=phase), irecv(ctx, recv_buf, left, phase=phase)


def _layout_args(ctx: Context, q: torch.Tensor, seq_len: int, layout: Layout,
                 block_size: int) -> tuple[torch.Tensor, int]:
    q_pos = positions(seq_len, ctx.world_size, ctx.rank, layout=layout)
    if q.shape[2] != q_pos.numel():
        raise ValueError(f"rank {ctx.rank} holds {q.shape[2]} query rows, the {layout} layout gives it {q_pos.numel()}")
    return q_pos, max(1, min(block_size, q_pos.numel()))


def ring_forward(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seq_len: int, layout: Layout,
                 causal: bool, block_size: int, final_exchange: bool = False,
                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, RingTrace]:
    """This rank's attention output (B, H, c, Dv) and row lse (B, H, c) over the whole sequence, and its trace.

    Sends N-1 K, V blocks (N with `final_exchange`, for N > 1; a one-rank
    ring has no neighbour to send to), each posted before the step's
    computation and waited for after it, under ledger phase "ring kv".
    """
    check_shapes(q, k, v)                               # dtype, shapes, head_dim >= 1: before any message
    n, rank = ctx.world_size, ctx.rank
    q_pos, block = _layout_args(ctx, q, seq_len, layout, block_size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dk = k.shape[-1]
    kv = torch.cat([k, v], dim=-1).contiguous()                       # (B, H, c, Dk + Dv): one message a step
    spare = torch.empty_like(kv)
    out = q.new_zeros(q.shape[:3] + v.shape[3:])                      # (B, H, c, Dv)
    lse = q.new_full(q.shape[:3], -math.inf)                          # (B, H, c)
    clock, work, skipped = _Clock(rank), [], []
    sends = (n if final_exchange else n - 1) if n > 1 else 0
    for t in range(n):
        k_pos = positions(seq_len, n, ring_source(rank, t, n), layout=layout)
        pending = _post(ctx, kv, spare, FORWARD) if t < sends else ()
        _forward_step(clock, work, skipped, t, causal and block_is_future(q_pos, k_pos),
                      q, q_pos, kv, k_pos, dk, block, causal, scale, out, lse)
        if pending:
            clock.timed("comm", f"kv {t}", _wait_all, pending)
            kv, spare = spare, kv
    return out, lse, _trace(work, skipped, clock)


def ring_backward(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dout: torch.Tensor, *, seq_len: int, layout: Layout, causal: bool,
                  block_size: int,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RingTrace]:
    """(dq, dk, dv) of this rank's rows, from the forward's FINAL (out, lse) and the output gradient dout.

    K, V travel again (phase "backward kv", N-1 sends); the partial dK, dV
    sums travel one step behind them (phase "backward dkv", N-1 sends),
    each receive posted before the share it is added to is computed.
    """
    check_shapes(q, k, v)                               # dtype, shapes, head_dim >= 1: before any message
    n, rank = ctx.world_size, ctx.rank
    q_pos, block = _layout_args(ctx, q, seq_len, layout, block_size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dk = k.shape[-1]
    kv = torch.cat([k, v], dim=-1).contiguous()
    spare, incoming = torch.empty_like(kv), torch.empty_like(kv)
    dq = torch.zeros_like(q)
    clock, work, skipped = _Clock(rank), [], []
    right, left = (rank + 1) % n, (rank - 1) % n
    grad_send: Pending | None = None
    for t in range(n):
        k_pos = positions(seq_len, n, ring_source(rank, t, n), layout=layout)
        # Same-size messages between the same two ranks are matched in the order they are posted, so each
        # rank posts its receives in the order its left neighbour sends: dK, dV of step t-1, then K, V of step t.
        grad_recv = irecv(ctx, incoming, left, phase=BACKWARD_GRAD) if t >= 2 else None
        pending = _post(ctx, kv, spare, BACKWARD_KV) if t < n - 1 else ()
        if causal and block_is_future(q_pos, k_pos):
            share, tiles, pairs = torch.zeros_like(kv), 0, 0
            skipped.append(t)
        else:
            share, tiles, pairs = clock.timed("compute", f"step {t}", _grad_step, q, q_pos, kv, k_pos, dk, block,
                                              causal, scale, out, lse, dout, dq)
        work.append((tiles, pairs))
        if t == 0:
            own = share                                       # this rank's share of its own block's dK, dV
        else:
            if grad_recv is not None:
                share += clock.timed("comm", f"dkv in {t}", grad_recv.wait)
            if grad_send is not None:
                clock.timed("comm", f"dkv out {t - 1}", grad_send.wait)
            grad_send = isend(ctx, share, right, phase=BACKWARD_GRAD)   # the partial sum, one step behind its block
        if pending:
            clock.timed("comm", f"kv {t}", _wait_all, pending)
            kv, spare = spare, kv
    if n > 1:
        own += clock.timed("comm", "dkv home", irecv(ctx, incoming, left, phase=BACKWARD_GRAD).wait)
        clock.timed("comm", "dkv out", grad_send.wait)
    return dq, own[..., :dk], own[..., dk:], _trace(work, skipped, clock)


class _RingAttention(torch.autograd.Function):
    """ring_forward in forward, ring_backward in backward: ring attention as one differentiable op on a rank."""

    @staticmethod
    def forward(fctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Context, seq_len: int,
                layout: Layout, causal: bool, block_size: int, final_exchange: bool) -> torch.Tensor:
        out, lse, _ = ring_forward(ctx, q, k, v, seq_len=seq_len, layout=layout, causal=causal,
                                   block_size=block_size, final_exchange=final_exchange)
        fctx.save_for_backward(q, k, v, out, lse)
        fctx.args = (ctx, seq_len, layout, causal, block_size)
        return out

    @staticmethod
    def backward(fctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = fctx.saved_tensors
        ctx, seq_len, layout, causal, block_size = fctx.args
        dq, dk, dv, _ = ring_backward(ctx, q, k, v, out, lse, dout.contiguous(), seq_len=seq_len, layout=layout,
                                      causal=causal, block_size=block_size)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seq_len: int, layout: Layout,
                   causal: bool, block_size: int, final_exchange: bool = False) -> torch.Tensor:
    """Differentiable ring attention of this rank's rows (B, H, c, Dv): the forward ring now, the backward one later."""
    return _RingAttention.apply(q, k, v, ctx, seq_len, layout, causal, block_size, final_exchange)
