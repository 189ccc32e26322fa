"""How far blockwise (or ring) attention may be from SDPA in floating point, derived, not guessed.

Two implementations of attention round differently: different tile sizes,
merge counts, exp routines and summation orders. Each is within a first-order
bound of the exact result (wmdist.costs.ring_attention.lse_rounding_bound and
weight_rounding_bound say term by term why), so two of them are within the
SUM of their bounds of each other. The bounds are elementwise: a row with
large |v| or a large gradient gets a large allowance, a quiet row a small one.

`exact_attention` computes the float64 reference and the magnitudes the
bounds need; `rounding_bounds` turns them into elementwise bounds for one
implementation; `attention_tolerance` adds ours (tiles of `block_keys`, `key_blocks`
merges, 1-ulp exp) to SDPA's taken at its worst (every key its own block,
a 2-ulp vectorised exp); `wmdist.course.compare.bound_ratio` reports max |got - want| / bound,
so a Check passes when it is at most 1.
Shapes: q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv), dout like the output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from wmdist.course.compare import ROUNDOFF
from wmdist.costs.ring_attention import lse_rounding_bound, weight_rounding_bound

SECOND_ORDER = 1.01   # the bounds are first order in u; E^2 terms are < 1% of them while E < 0.01 (checked)
REASON = ("first-order rounding bound, elementwise: ours (tiles, merges, 1-ulp exp) plus SDPA's worst case "
          "(every key its own block, 2-ulp exp); in units of that bound")


@dataclass(kw_only=True, frozen=True)
class ExactAttention:
    """Attention and its gradients in float64, with the three magnitudes the rounding bounds need."""
    q: torch.Tensor          # (B, H, Sq, D) float64
    k: torch.Tensor          # (B, H, Sk, D)
    v: torch.Tensor          # (B, H, Sk, Dv)
    dout: torch.Tensor       # (B, H, Sq, Dv)
    scale: float
    p: torch.Tensor          # (B, H, Sq, Sk) probabilities, 0 where masked
    o: torch.Tensor          # (B, H, Sq, Dv)
    lse: torch.Tensor        # (B, H, Sq)
    dp: torch.Tensor         # (B, H, Sq, Sk) dout v^T
    delta: torch.Tensor      # (B, H, Sq, 1) rowsum(dout * o)
    ds: torch.Tensor         # (B, H, Sq, Sk) gradient of the scores (before the scale)
    score_abs: float         # A: max over unmasked pairs of scale * sum_d |q_d k_d|
    exponent_range: float    # R: max over unmasked pairs of lse - score
    lse_abs: float           # M: max |lse| and |score| over unmasked pairs


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, *,
                    causal: bool) -> ExactAttention:
    """Float64 attention of the full sequence (SDPA's is_causal mask: key j visible to query i when j <= i)."""
    q, k, v, dout = (x.detach().double() for x in (q, k, v, dout))
    scale = q.shape[-1] ** -0.5
    s = scale * q @ k.transpose(-2, -1)                                     # (B, H, Sq, Sk)
    live = torch.ones(s.shape[-2:], dtype=torch.bool)
    if causal:
        live = torch.tril(live)
    lse = torch.logsumexp(s.masked_fill(~live, -math.inf), -1)            # (B, H, Sq)
    p = torch.exp(s - lse[..., None]) * live
    o = p @ v
    dp = dout @ v.transpose(-2, -1)
    delta = (dout * o).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    a = (scale * q.abs() @ k.abs().transpose(-2, -1))[..., live].max().item()
    r = (lse[..., None] - s)[..., live].max().item()
    m = max(lse.abs().max().item(), s[..., live].abs().max().item())
    return ExactAttention(q=q, k=k, v=v, dout=dout, scale=scale, p=p, o=o, lse=lse, dp=dp, delta=delta, ds=ds, score_abs=a, exponent_range=r, lse_abs=m)


@dataclass(kw_only=True, frozen=True)
class AttentionBounds:
    """Elementwise bounds on |computed - exact| for the output, the lse and the three gradients."""
    out: torch.Tensor        # (B, H, Sq, Dv)
    lse: float
    dq: torch.Tensor | None  # (B, H, Sq, D); the gradients' bounds are None when only the forward was bounded
    dk: torch.Tensor | None  # (B, H, Sk, D)
    dv: torch.Tensor | None  # (B, H, Sk, Dv)

    def plus(self, other: AttentionBounds, *, factor: float = 1.0) -> AttentionBounds:
        """factor * (self + other): the gap two implementations can have."""
        def add(a: Any, b: Any) -> Any:
            return None if a is None or b is None else factor * (a + b)
        return AttentionBounds(**{n: add(getattr(self, n), getattr(other, n)) for n in ("out", "lse", "dq", "dk", "dv")})


def rounding_bounds(ex: ExactAttention, unit_roundoff: float, block_keys: int, key_blocks: int,
                    exp_ulps: float, *, grads: bool = True) -> AttentionBounds:
    """First-order elementwise bounds of one blockwise implementation (see costs.weight_rounding_bound).

    Forward: |d out| <= E sum_j p |v|, |d lse| <= L. Backward recomputes
    P from the saved lse (relative error E_P), then each product and sum adds
    its own roundings: dP (Dv u), rowsum(dO * out) (Dv u plus out's error),
    dS = P (dP - delta) scaled (3 u), and the sums over S rows (S + 1) u, in
    any order (a ring adds a block's dK, dV shares rank after rank).
    `grads=False` bounds the forward only (cheaper: no S x S products).
    """
    u = unit_roundoff
    d, dv_dim, s_q, s_k = ex.q.shape[-1], ex.v.shape[-1], ex.q.shape[-2], ex.k.shape[-2]
    args = (d, block_keys, key_blocks, ex.score_abs, ex.exponent_range, ex.lse_abs, u)
    lse_err = lse_rounding_bound(*args, exp_ulps=exp_ulps)
    weight_err = weight_rounding_bound(*args, exp_ulps=exp_ulps)
    if weight_err >= 0.01:
        raise ValueError(f"relative weight error bound {weight_err:.3g} is not small: the first-order bound does "
                         "not hold (use float64 or smaller scores)")
    p, q, k, v, dout = ex.p, ex.q.abs(), ex.k.abs(), ex.v.abs(), ex.dout
    out_err = weight_err * (p @ v)
    if not grads:
        return AttentionBounds(out=out_err, lse=lse_err, dq=None, dk=None, dv=None)
    p_err = (d + 1) * u * ex.score_abs + lse_err + u * (ex.exponent_range + 2 * exp_ulps)
    dv_err = (p.transpose(-2, -1) @ dout.abs()) * (p_err + (s_q + 1) * u)
    delta_err = (dout.abs() * out_err).sum(-1, keepdim=True) + dv_dim * u * (dout * ex.o).abs().sum(-1, True)
    ds_err = p * (dv_dim * u * (dout.abs() @ v.transpose(-2, -1)) + delta_err
                  + (ex.dp - ex.delta).abs() * (p_err + 3 * u))
    dq_err = ex.scale * (ds_err @ k + (s_k + 1) * u * (ex.ds.abs() @ k))
    dk_err = ex.scale * (ds_err.transpose(-2, -1) @ q + (s_q + 1) * u * (ex.ds.abs().transpose(-2, -1) @ q))
    return AttentionBounds(out=out_err, lse=lse_err, dq=dq_err, dk=dk_err, dv=dv_err)


def sdpa_bounds(ex: ExactAttention, dtype: torch.dtype, *, grads: bool = True) -> AttentionBounds:
    """SDPA's (or any fused kernel's) bounds taken at their worst: every key its own block, a 2-ulp exp."""
    s_k = ex.k.shape[-2]
    return rounding_bounds(ex, ROUNDOFF[dtype], s_k, s_k, 2.0, grads=grads)


def attention_tolerance(ex: ExactAttention, dtype: torch.dtype, block_keys: int, key_blocks: int, *,
              grads: bool = True) -> AttentionBounds:
    """Allowed gap between ours (tiles of block_keys keys, key_blocks merges a row) and SDPA: the sum of both bounds."""
    ours = rounding_bounds(ex, ROUNDOFF[dtype], block_keys, key_blocks, 1.0, grads=grads)
    return ours.plus(sdpa_bounds(ex, dtype, grads=grads), factor=SECOND_ORDER)
