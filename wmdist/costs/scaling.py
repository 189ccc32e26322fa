"""Speedup and efficiency: the text's 24 h -> 1 h on 32 workers is 24x, 75 %."""
from __future__ import annotations

from wmdist.costs.validate import require_int, require_positive, require_real


def speedup(t_one: float, t_n: float) -> float:
    """How many times faster N workers finish than one: T_1 / T_N."""
    return require_real("t_one", t_one) / require_positive("t_n", t_n)


def efficiency(t_one: float, t_n: float, workers: int) -> float:
    """Speedup per worker: 24 h -> 1 h on 32 workers is 24x, i.e. 0.75."""
    return speedup(t_one, t_n) / require_int("workers", workers, 1)
