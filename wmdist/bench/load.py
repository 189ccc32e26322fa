"""The 1-minute load average around one figure of a benchmark, read as it is measured.

A thin layer over os.getloadavg and the clock; what the numbers mean is bench_result.load_verdict's
(pure). suite.py wraps each figure it measures in `watch_load`.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from wmdist.base.bench_result import Load


def _load_1min() -> float | None:
    """os.getloadavg()'s 1-minute figure, or None where the system keeps none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def watch_load(loads: list[Load], figure: str, *, busy: float, timed: bool = True) -> Iterator[None]:
    """Append to `loads` the 1-minute load just before and just after the block, its seconds and the CPU count."""
    before, start = _load_1min(), time.perf_counter()
    yield
    loads.append(Load(figure=figure, before=before, after=_load_1min(), seconds=time.perf_counter() - start,
                      cpus=os.cpu_count() or 1, busy=busy, timed=timed))
