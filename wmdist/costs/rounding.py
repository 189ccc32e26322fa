"""Why distributed results are compared to a tolerance: float32 sums in another order.

Every tolerance a demo argues about summation order comes from here, so the
reason is written once and tested once.
"""
from __future__ import annotations

from wmdist.costs.validate import require_int, require_real

FLOAT32_ROUNDOFF = 2.0 ** -24   # unit roundoff u: one float32 rounding moves x by at most u * |x|
FLOAT64_ROUNDOFF = 2.0 ** -53


def reordered_sum_bound(terms: int, partial_sum_bound: float, *, extra_roundings: int = 0,
                        unit_roundoff: float = FLOAT32_ROUNDOFF) -> float:
    """Largest |difference| between two float sums of the same values added in different orders.

    Each sum rounds terms-1 times, each time by at most u times a partial sum,
    and every partial sum is at most `partial_sum_bound`; two sums can err in
    opposite directions, hence 2(terms-1). `extra_roundings` adds u * bound
    for each further rounding (a float64 reference rounded to float32 once, a
    division by N). This is why distributed results are checked to a
    tolerance: the same mathematics in another order is not the same bits.
    """
    require_int("terms", terms, 1)
    require_int("extra_roundings", extra_roundings, 0)
    bound = require_real("partial_sum_bound", partial_sum_bound)
    u = require_real("unit_roundoff", unit_roundoff)
    return (2 * (terms - 1) + extra_roundings) * u * bound
