"""Comparing a distributed result with its single-device reference, shared by every chapter.

- `bound_ratio`: the error in units of an (elementwise) tolerance, max_j |got_j - want_j| / bound_j.
  A Check of it against 1.0 passes when every element is within its bound. A NaN or inf in
  either side or in the bound makes it NaN, which no Check passes (`report.Check` says "not
  finite"), so a NaN gradient can never look like a perfect one.
- `worst`: which of several errors (one per rank, say) a check should show: the largest, and a
  NaN before any number, since `max` would pass over it (every comparison with NaN is False).
- `ROUNDOFF`: the unit roundoff u of each float dtype a demo runs in.
- `reordered_terms`: K, the longest float32 sum whose order splitting a transformer block over
  ranks changes; `costs.reordered_sum_bound(K, ...)` turns it into a tolerance.
- `one_thread`: the single-device reference runs on one intra-op thread, as every rank does, so
  "the same operations on the same shapes" means the same kernels and the same bits.
"""
from __future__ import annotations

import contextlib
import math
from types import MappingProxyType
from typing import Iterator, Mapping, Sequence

import torch

from wmdist.costs.rounding import FLOAT32_ROUNDOFF, FLOAT64_ROUNDOFF
from wmdist.costs.validate import require_int

ROUNDOFF: Mapping[torch.dtype, float] = MappingProxyType({torch.float32: FLOAT32_ROUNDOFF,
                                                          torch.float64: FLOAT64_ROUNDOFF})


def bound_ratio(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor | float, *,
                covered_only: bool = False) -> float:
    """max_j |got_j - want_j| / bound_j: at most 1 when every element is within its own bound.

    0/0 counts as 0 (an element nothing may move did not move) and x/0 as inf.
    NaN when any element of `got`, `want` or `bound` is NaN or inf: such a
    comparison says nothing, and a Check refuses it. inf when the shapes
    differ. `covered_only` leaves out the elements whose bound is 0 (no bound
    was derived for them, e.g. BatchNorm's entries of a gradient). A `bound`
    broadcasts to the shape (a scalar applies to every element); a negative bound is a bug (ValueError).
    """
    g, w = got.detach().double(), want.detach().double()
    b = torch.as_tensor(bound, dtype=torch.float64)
    if g.shape != w.shape:
        return math.inf
    try:
        b = b.expand_as(g)              # a scalar, or a bound shared along broadcast dimensions
    except RuntimeError:
        return math.inf
    if not (bool(torch.isfinite(g).all()) and bool(torch.isfinite(w).all()) and bool(torch.isfinite(b).all())):
        return math.nan
    if bool((b < 0).any()):
        raise ValueError(f"a bound must be >= 0, got {float(b.min())}")
    gap = (g - w).abs()
    if covered_only:
        gap, b = gap[b > 0], b[b > 0]
    if gap.numel() == 0:
        return 0.0
    ratio = torch.where(b > 0, gap / b.clamp_min(1e-300), torch.where(gap > 0, math.inf, 0.0))
    return float(ratio.max())


def worst(errors: Sequence[float]) -> int:
    """The index of the largest error, a NaN counting as larger than any number (the first such on ties)."""
    if not errors:
        raise ValueError("worst() of no errors")
    return max(range(len(errors)), key=lambda i: (math.isnan(errors[i]), errors[i] if not math.isnan(errors[i]) else 0))


def reordered_terms(width: int, hidden: int, tokens: int) -> int:
    """K = max(3H, F, B*T): QKV's output features, the MLP's hidden units, the batch's token rows.

    These are the sums a tensor-, sequence- or context-parallel split of a
    transformer block regroups (a row layer's output over input features, a
    column layer's input gradient over output features, weight and LayerNorm
    gradients over tokens); the longest sets the tolerance.
    """
    return max(3 * require_int("width", width, 1), require_int("hidden", hidden, 1), require_int("tokens", tokens, 1))


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread, as every rank does, then restore the setting.

    A multi-threaded kernel splits its sums differently, so a reference on
    several threads is not bitwise comparable with a rank's result.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
