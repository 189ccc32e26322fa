"""Bytes a DDP comm hook hands to the all-reduce per step, and the rounding bound of a half-precision hook.

Counted under the ledger's convention for an all-reduce (wmdist.comm.all_reduce): a rank that
all-reduces a B-byte tensor records B bytes sent and B received, the payload it hands to gloo;
how gloo moves it on the wire (ring, tree) is gloo's choice and is not what these formulas say.

  none         torch's allreduce_hook: the float32 bucket, 4 P bytes per step (P gradient entries)
  fp16, bf16   torch's fp16/bf16_compress_hook: the bucket cast to 2-byte floats, 2 P bytes
  powersgd     torch's powerSGD_hook at rank r: every gradient viewed as a matrix n x m
               (its first dimension by the rest; a bias of k entries is k x 1). It is compressed
               when (n + m) r' * min_compression_rate < n m, with r' = min(n, m, r): then P (n x r')
               and Q (m x r') are all-reduced in float32; otherwise it is all-reduced whole.
               Bytes = 4 (uncompressed entries + sum n r' + sum m r'). Before step
               `start_iter` the hook runs the plain float32 all-reduce (4 P bytes).

Pure functions of shapes (no torch), so a widget or a test can ask them without a process.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from wmdist.costs.validate import require_choice, require_int, require_real

Kind = Literal["none", "fp16", "bf16", "powersgd"]
KINDS: tuple[Kind, ...] = get_args(Kind)
FLOAT32_BYTES = 4
HALF_BYTES = 2                       # float16 and bfloat16 alike
# Unit roundoff u of the half formats (round to nearest: half a unit in the last place) and the most one
# rounding can move a value in their subnormal range (half the smallest subnormal).
HALF_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
HALF_TINY = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}


def _shapes(shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    out = []
    for i, shape in enumerate(shapes):
        dims = tuple(shape)
        if not dims:
            raise ValueError(f"shapes[{i}] must have at least one dimension, got {shape!r}")
        for d in dims:
            require_int(f"shapes[{i}] dimension", d, 1)
        out.append(dims)
    if not out:
        raise ValueError("shapes must name at least one gradient tensor")
    return out


def numel(shapes: Sequence[Sequence[int]]) -> int:
    """P: the gradient entries of all `shapes`."""
    total = 0
    for dims in _shapes(shapes):
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def powersgd_layout(shapes: Sequence[Sequence[int]], rank: int, *,
                    min_compression_rate: float = 2.0) -> tuple[int, int, int]:
    """(entries all-reduced uncompressed, entries of all P factors, entries of all Q factors) at `rank`.

    Follows torch's powerSGD_hook: each tensor is viewed as (shape[0], rest); see the module text.
    """
    require_int("rank", rank, 1)
    rate = require_real("min_compression_rate", min_compression_rate)
    plain = p = q = 0
    for dims in _shapes(shapes):
        n = dims[0]
        m = numel([dims]) // n
        r = min(n, m, rank)
        if (n + m) * r * rate < n * m:
            p, q = p + n * r, q + m * r
        else:
            plain += n * m
    return plain, p, q


def hook_bytes(kind: Kind, shapes: Sequence[Sequence[int]], *, rank: int = 1, step: int = 0, start_iter: int = 0,
               min_compression_rate: float = 2.0) -> int:
    """Bytes one rank's comm hook all-reduces in training step `step` (the ledger's payload convention)."""
    require_choice("kind", kind, KINDS)
    require_int("step", step, 0)
    require_int("start_iter", start_iter, 0)
    total = numel(shapes)
    if kind == "none" or (kind == "powersgd" and step < start_iter):
        return FLOAT32_BYTES * total
    if kind in ("fp16", "bf16"):
        return HALF_BYTES * total
    plain, p, q = powersgd_layout(shapes, rank, min_compression_rate=min_compression_rate)
    return FLOAT32_BYTES * (plain + p + q)


def hook_calls(kind: Kind, *, step: int = 0, start_iter: int = 0, buckets: int = 1) -> int:
    """all_reduce calls the hook makes in step `step`: one per bucket; PowerSGD's compressed steps make three
    (the uncompressed tensors, then all P, then all Q), even when one of them is empty."""
    require_choice("kind", kind, KINDS)
    require_int("step", step, 0)
    require_int("buckets", buckets, 1)
    return buckets * (3 if kind == "powersgd" and step >= require_int("start_iter", start_iter, 0) else 1)


def gamma(k: int, u: float) -> float:
    """k u / (1 - k u): the classic bound on the relative error of k roundings of unit roundoff u."""
    require_int("k", k, 0)
    u = require_real("u", u)
    if k * u >= 1:
        raise ValueError(f"k u must be < 1 for the bound to hold, got k={k}, u={u}")
    return k * u / (1 - k * u)


def hook_bound_terms(kind: Literal["none", "fp16", "bf16"], world_size: int, *,
                     float32_roundoff: float = 2.0 ** -24) -> tuple[float, float]:
    """(relative, absolute): |hook's average - float32 average| <= relative * A + absolute per entry,
    where A = sum_i |g_i| / N over the N ranks' local gradients of that entry.

    fp16/bf16: the hook rounds each g_i to the half format and divides it by N there (2 roundings),
    and gloo adds the N halves in half precision (N - 1 roundings, each of a partial sum at most
    sum |g_i / N|): gamma(N + 1, u_half) A, plus (N + 1) times half the smallest subnormal where
    values underflow. Casting back to float32 is exact. none: torch's allreduce_hook divides by N
    then sums in float32, gamma(N, u32) A. The float32 reference (sum, then / N) adds gamma(N, u32) A.
    """
    require_choice("kind", kind, ("none", "fp16", "bf16"))
    n = require_int("world_size", world_size, 1)
    ref = gamma(n, float32_roundoff)
    if kind == "none":
        return 2 * ref, 2 * n * 2.0 ** -150
    return gamma(n + 1, HALF_ROUNDOFF[kind]) + ref, (n + 1) * HALF_TINY[kind] + n * 2.0 ** -150
