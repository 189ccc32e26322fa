"""Numbers as a person reads them: engineering units with three significant digits (pure).

1.47e-3 s reads "1.47 ms", 8.8e12 FLOPs "8.8 TFLOP", 19100 ms "19.1 s". The
panels, their figures' tick labels and the summaries all print through
these, so no reader meets "1.47e+03 µs per round".
"""
from __future__ import annotations

import math

from wmdist.costs.validate import require_real

SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"),
      (1e-9, "n"), (1e-12, "p"))


def si(value: float, unit: str, *, digits: int = 3) -> str:
    """`value` with an SI prefix chosen so the mantissa lies in [1, 1000): si(8.8e12, "FLOP") == "8.8 TFLOP"."""
    require_real("value", value)
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}".rstrip()
    magnitude = abs(value)
    scale, prefix = next(((s, p) for s, p in SI if magnitude >= s * (1 - 0.5 * 10 ** -digits)), SI[-1])
    # (the threshold just under each power of 1000 sends 999.7 to "1 k", not to "1e+03")
    return f"{value / scale:.{digits}g} {prefix}{unit}"


def seconds(value: float) -> str:
    """A duration: seconds(1.47e-3) == "1.47 ms", seconds(19.1) == "19.1 s" (no kiloseconds: minutes above 600 s)."""
    require_real("value", value)
    if abs(value) >= 600:
        return f"{value / 60:.3g} min"
    return si(value, "s")


def flops(value: float) -> str:
    """An operation count: flops(8.8e12) == "8.8 TFLOP"."""
    return si(value, "FLOP")
