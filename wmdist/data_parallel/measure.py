"""Timing real ring all-reduces on local gloo ranks, for the scaling panel and `wmdist bench`.

Each point runs `repeats` ring all-reduces (wmdist.comm.ring_all_reduce) of a
payload on N ranks, lined up by a barrier, after one untimed warm-up; the
sample is the slowest rank's time (a collective is done when its last rank
is) and the point is the median sample. The ledger's byte counts are kept so
they can be checked against the formula.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from wmdist.comm import Context, barrier, ring_all_reduce
from wmdist.costs.validate import require_int
from wmdist.data_parallel.scaling import MIB, Measurement
from wmdist.runtime import run

DEFAULT_WORLD_SIZES = (2, 4, 8)
DEFAULT_SIZES_BYTES = (256 * 1024, 1 * MIB, 4 * MIB, 16 * MIB)
DEFAULT_REPEATS = 3


def time_ring_allreduce(ctx: Context, numel: int, repeats: int) -> tuple[list[float], int]:
    """Rank function: this rank's times for `repeats` all-reduces of `numel` float32, and bytes of one."""
    x = torch.ones(numel)                                     # (numel,)
    ring_all_reduce(ctx, x, phase="warm-up", inplace=True)
    times = []
    for _ in range(repeats):
        barrier(ctx, phase="line up")
        start = time.perf_counter()
        ring_all_reduce(ctx, x, phase="timed", inplace=True)
        times.append(time.perf_counter() - start)
    return times, ctx.ledger.totals(phase="warm-up/", prefix=True)["bytes_sent"]


def check_plan(world_sizes: Sequence[int], sizes_bytes: Sequence[int], repeats: int) -> None:
    """Refuse a measurement plan before any process starts."""
    if not world_sizes or not sizes_bytes:
        raise ValueError("world_sizes and sizes_bytes must each name at least one value")
    for n in world_sizes:
        require_int("world_sizes entry", n, 2, high=16)
    for s in sizes_bytes:
        if require_int("sizes_bytes entry", s, 4) % 4:
            raise ValueError(f"sizes_bytes must be multiples of 4 (float32), got {s!r}")
    require_int("repeats", repeats, 1)


def measure_allreduce(*, world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                      sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
                      repeats: int = DEFAULT_REPEATS,
                      progress: Callable[[int, int, str], None] | None = None) -> list[Measurement]:
    """Time ring all-reduces on real ranks for every (N, size); one Measurement each.

    `progress(done, total, what)` is called before each point and once at the end.
    """
    check_plan(world_sizes, sizes_bytes, repeats)
    plan = [(n, s) for n in world_sizes for s in sizes_bytes]
    out = []
    for i, (n, size) in enumerate(plan):
        if progress is not None:
            progress(i, len(plan), f"N={n}, {size / MIB:g} MiB")
        per_rank = run(time_ring_allreduce, n, size // 4, repeats)
        samples = tuple(max(r[0][k] for r in per_rank) for k in range(repeats))   # slowest rank per repeat
        out.append(Measurement(world_size=n, payload_bytes=size, seconds=statistics.median(samples), samples=samples, bytes_sent=tuple(r[1] for r in per_rank)))
    if progress is not None:
        progress(len(plan), len(plan), f"measured {len(plan)} points")
    return out
