"""Attention one (query block, key/value block) pair at a time, merged by online softmax.

A block pair yields a partial output, normalised over that block's keys only,
and the log-sum-exp (lse) of its scores. Two partials combine exactly: the
merged lse is logaddexp of the two, and each partial output is reweighted by
exp(its lse - merged lse). Keeping (out, lse) per query row is the running
maximum and normaliser of online softmax written as one number, and it is all
a ring rank has to keep between steps while key/value blocks pass through.

Causal masks use GLOBAL token positions (`q_pos`, `k_pos`), so a rank holding
any set of positions (contiguous or zigzag) masks correctly, and a pair whose
keys all lie after its queries (`block_is_future`) is skipped before any work.

Backward: flash-style recomputation, not autograd through the loop. Autograd
would keep every block pair's probabilities alive until backward, i.e. the
full S x S matrix spread over tiles, which defeats the point of blocking.
`attend_block_backward` rebuilds one pair's probabilities from the final
(out, lse) and returns that pair's share of dq, dk, dv, so temporary score
memory stays a couple of tiles in backward too, and a ring rank can send
dk, dv of a visiting block on to the next rank.
Shapes: q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv), lse (B, H, Sq).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from wmdist.costs.ring_attention import full_scores_bytes, score_tile_bytes
from wmdist.costs.validate import require_bool, require_int
from wmdist.ring_attention.profiling import Allocations, measure_allocations


def block_is_future(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """True when every key position is after every query position, so a causal mask removes the whole block.

    Costs one min and one max over the positions, not a score tile: this is
    how a ring rank decides to skip a step (the block still travels on).
    """
    if q_pos.ndim != 1 or k_pos.ndim != 1 or q_pos.numel() == 0 or k_pos.numel() == 0:
        raise ValueError(f"q_pos and k_pos must be non-empty 1-D tensors, got shapes "
                         f"{tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
    return bool(k_pos.min() > q_pos.max())


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One ValueError naming what is wrong with q, k, v, before any score is computed (checks shared with ring.py)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(f"q, k, v must be tensors, got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one floating-point dtype (float32, float64, bfloat16 or float16): "
                         f"softmax needs real numbers; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, S, D), got {q.ndim}, {k.ndim}, {v.ndim} dims")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[3] < 1 or v.shape[3] < 1:
        raise ValueError(f"head_dim (the last dimension of q, k and v) must be an integer >= 1, got q/k "
                         f"{q.shape[3]} and v {v.shape[3]}: the scores are scaled by 1/sqrt(head_dim)")


def _check_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 q_pos: torch.Tensor, k_pos: torch.Tensor) -> None:
    check_shapes(q, k, v)
    if q_pos.shape != (q.shape[2],) or k_pos.shape != (k.shape[2],):
        raise ValueError(f"q_pos must have shape ({q.shape[2]},) and k_pos ({k.shape[2]},), "
                         f"got {tuple(q_pos.shape)} and {tuple(k_pos.shape)}")


def _probabilities(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                   causal: bool, scale: float, lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(scores - lse) for one tile, in place in the score tile; lse from this tile unless given.

    A row with every key masked has lse = -inf; it is shifted by 0 instead,
    so its probabilities are exp(-inf) = 0 rather than NaN.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)           # (B, H, Sq, Sk)
    if causal:
        scores.masked_fill_(k_pos[None, :] > q_pos[:, None], -math.inf)
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)                            # (B, H, Sq)
    shift = lse.masked_fill(lse == -math.inf, 0.0)
    return scores.sub_(shift[..., None]).exp_(), lse


@torch.no_grad()
def attend_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, *,
                 causal: bool, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attention of one query block over one key/value block: (output, log-sum-exp of scores).

    The output is softmax over THIS block's keys times v; fully masked rows
    give output 0 and lse -inf (an empty block, which `merge` absorbs
    exactly). Runs without autograd: gradients come from attend_block_backward.
    """
    _check_block(q, k, v, q_pos, k_pos)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    probs, lse = _probabilities(q, k, q_pos, k_pos, require_bool("causal", causal), scale, None)
    return torch.matmul(probs, v), lse                                   # (B, H, Sq, Dv), (B, H, Sq)


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
          lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attentions of the same queries over disjoint key sets (log-sum-exp rule).

    lse = logaddexp(lse_a, lse_b); out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
    Both weights are <= 1, so nothing overflows. An empty block (lse -inf,
    finite output) leaves the other side exactly unchanged, and two empty
    blocks stay empty (output 0, lse -inf) instead of NaN. Swapping the
    arguments gives the same bits; regrouping three merges agrees up to rounding.
    """
    lse = torch.logaddexp(lse_a, lse_b)                                  # (B, H, Sq)
    shift = lse.masked_fill(lse == -math.inf, 0.0)
    w_a = torch.exp(lse_a - shift)[..., None]
    w_b = torch.exp(lse_b - shift)[..., None]
    return out_a * w_a + out_b * w_b, lse


@torch.no_grad()
def attend_block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          grad_out: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, *, causal: bool,
                          scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block pair's share of (dq, dk, dv), recomputed from the FINAL output and lse of the query rows.

    `out` and `lse` must be the merged results over all keys (not this block's
    partials): then P = exp(scores - lse) are the true probabilities and
    dv = P^T dO, dS = P * (dO v^T - rowsum(dO * out)), dq = scale dS k,
    dk = scale dS^T q. Summing the shares over all key blocks gives dq;
    summing over all query blocks gives dk, dv.
    """
    _check_block(q, k, v, q_pos, k_pos)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    probs, _ = _probabilities(q, k, q_pos, k_pos, require_bool("causal", causal), scale, lse)
    grad_v = torch.matmul(probs.transpose(-2, -1), grad_out)             # (B, H, Sk, Dv)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)                   # (B, H, Sq, 1)
    grad_p = torch.matmul(grad_out, v.transpose(-2, -1)).sub_(delta)     # (B, H, Sq, Sk)
    grad_s = probs.mul_(grad_p).mul_(scale)                              # in place: P becomes dS
    del grad_p
    return torch.matmul(grad_s, k), torch.matmul(grad_s.transpose(-2, -1), q), grad_v


def _tiles(length: int, block_size: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """Consecutive row slices of `block_size` (the last shorter when it does not divide `length`) and their positions.

    Positions are made one tile at a time, so no O(S) index vector is ever alive.
    """
    for start in range(0, length, block_size):
        stop = min(start + block_size, length)
        yield slice(start, stop), torch.arange(start, stop)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    out = q.new_zeros(q.shape[:3] + v.shape[3:])                         # (B, H, Sq, Dv)
    lse = q.new_full(q.shape[:3], -math.inf)                             # (B, H, Sq)
    largest = 0
    for qs, q_pos in _tiles(q.shape[2], block_size):
        acc: tuple[torch.Tensor, torch.Tensor] | None = None
        for ks, k_pos in _tiles(k.shape[2], block_size):
            if causal and block_is_future(q_pos, k_pos):
                continue
            part = attend_block(q[:, :, qs], k[:, :, ks], v[:, :, ks], q_pos, k_pos, causal=causal, scale=scale)
            largest = max(largest, math.prod(q.shape[:2]) * (qs.stop - qs.start) * (ks.stop - ks.start)
                          * q.element_size())
            acc = part if acc is None else merge(*acc, *part)
            del part                        # free the partial before the next tile is scored
        if acc is not None:
            out[:, :, qs], lse[:, :, qs] = acc
    return out, lse, largest


class _BlockwiseAttention(torch.autograd.Function):
    """Tile-by-tile forward; backward recomputes each tile's probabilities from the saved (out, lse)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, causal: bool,
                scale: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        out, lse, largest = _forward(q, k, v, block_size, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)   # no (B, H, S) zeros for lse's unused gradient
        return out, lse, largest

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any, _grad_largest: Any) -> tuple[Any, ...]:
        if grad_out is None:                # the output took no part in the loss
            return None, None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for qs, q_pos in _tiles(q.shape[2], ctx.block_size):
            for ks, k_pos in _tiles(k.shape[2], ctx.block_size):
                if ctx.causal and block_is_future(q_pos, k_pos):
                    continue
                gq, gk, gv = attend_block_backward(q[:, :, qs], k[:, :, ks], v[:, :, ks], out[:, :, qs],
                                                   lse[:, :, qs], grad_out[:, :, qs], q_pos, k_pos,
                                                   causal=ctx.causal, scale=ctx.scale)
                dq[:, :, qs] += gq
                dk[:, :, ks] += gk
                dv[:, :, ks] += gv
                del gq, gk, gv              # free the shares before the next tile is scored
        return dq, dk, dv, None, None, None


@dataclass(frozen=True)
class BlockwiseResult:
    """Output of blockwise_attention: the attention, its row log-sum-exp, and the largest score tile it made."""
    out: torch.Tensor            # (B, H, Sq, Dv), differentiable with respect to q, k, v
    lse: torch.Tensor            # (B, H, Sq), log of the softmax normaliser of each query row
    largest_score_bytes: int     # bytes of the biggest (B, H, q-tile, k-tile) score tensor the forward allocated


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_size: int, causal: bool,
                        scale: float | None = None) -> BlockwiseResult:
    """Full softmax attention computed block pair by block pair, equal to scaled_dot_product_attention.

    Query and key rows are cut into tiles of `block_size` (the last shorter
    when it does not divide the length); causal masking is SDPA's is_causal
    (key j visible to query i when j <= i), and tiles entirely in the future
    are skipped. Temporary memory is a fixed number of score tiles of at
    most block_size x block_size per (batch, head) (two at a time: the
    scores and softmax's exponentials, or P and dP in backward) plus a few
    block_size-row tensors, whatever the sequence length (peak_score_bytes
    measures it).
    """
    check_shapes(q, k, v)
    block_size = require_int("block_size", block_size, 1)
    require_bool("causal", causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, lse, largest = _BlockwiseAttention.apply(q, k, v, block_size, causal, scale)
    return BlockwiseResult(out, lse, largest)


@dataclass(kw_only=True, frozen=True)
class ScoreMemory:
    """Measured working memory of blockwise attention next to the formulas it should obey (bytes)."""
    forward: Allocations     # blockwise_attention(...)
    backward: Allocations    # torch.autograd.grad of its output: temporary excludes dq, dk, dv
    tile: int                # one score tile, batch * heads * block^2 * elem_size (costs.score_tile_bytes)
    block_rows: int          # one (batch, heads, block, head_dim) tensor: a partial output or gradient share
    full_scores: int         # the S x S scores unblocked attention holds (costs.full_scores_bytes)


def peak_score_bytes(batch: int, heads: int, seq_len: int, head_dim: int, block_size: int, *, causal: bool,
                     dtype: torch.dtype = torch.float32, seed: int = 0) -> ScoreMemory:
    """Measure forward and backward working memory of blockwise_attention on seeded random inputs.

    The claim to check: the temporary bytes do not depend on seq_len, only
    on the block size (a couple of score tiles plus a few block-row tensors).
    """
    gen = torch.Generator().manual_seed(require_int("seed", seed, 0))
    shape = (require_int("batch", batch, 1), require_int("heads", heads, 1), require_int("seq_len", seq_len, 1),
             require_int("head_dim", head_dim, 1))
    q, k, v, grad_out = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    result, forward = measure_allocations(lambda: blockwise_attention(q, k, v, block_size=block_size, causal=causal))
    _, backward = measure_allocations(lambda: torch.autograd.grad(result.out, (q, k, v), grad_out))
    b = min(block_size, seq_len)
    elem = q.element_size()
    return ScoreMemory(forward=forward, backward=backward,
                       tile=score_tile_bytes(b, b, heads=heads, batch=batch, elem_size=elem),
                       block_rows=batch * heads * b * head_dim * elem,
                       full_scores=full_scores_bytes(seq_len, heads=heads, batch=batch, elem_size=elem))
