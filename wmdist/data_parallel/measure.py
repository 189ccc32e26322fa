"""Timing real ring all-reduces on local gloo ranks, for the scaling panel and `wmdist bench`.

Each point runs `repeats` ring all-reduces (wmdist.comm.ring_all_reduce) of a
payload on N ranks, lined up by a barrier, after one untimed warm-up; the
sample is the slowest rank's time (a collective is done when its last rank
is) and the point is the median sample. One call per N times every payload
(`ALLREDUCE_TIMING`, an Experiment): its Report checks that each rank's
ledger bytes for each payload equal costs.ring_allreduce_bytes and that every
timing is a positive finite number, and carries the Measurements as its data.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from wmdist import costs
from wmdist.comm import Context, barrier, ring_all_reduce
from wmdist.costs.validate import require_int
from wmdist.data_parallel.scaling import MIB, Measurement
from wmdist.course.experiment import Experiment, Verdict
from wmdist.base.on_progress import OnProgress
from wmdist.course.report import Count, Report, fact_check

DEFAULT_WORLD_SIZES = (2, 4, 8)
DEFAULT_SIZES_BYTES = (256 * 1024, 1 * MIB, 4 * MIB, 16 * MIB)
DEFAULT_REPEATS = 3


@dataclass(frozen=True, kw_only=True)
class TimingSpec:
    """One world size's timings: every payload (bytes, float32) `repeats` times after a warm-up."""
    world_size: int
    sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES
    repeats: int = DEFAULT_REPEATS

    def __post_init__(self) -> None:
        check_plan((self.world_size,), self.sizes_bytes, self.repeats)


@dataclass(frozen=True, kw_only=True)
class RankTimes:
    """One rank's seconds per repeat for each payload, and the bytes its ledger counted for one all-reduce of it."""
    times: tuple[tuple[float, ...], ...]     # [payload][repeat]
    bytes_sent: tuple[int, ...]              # [payload]


def time_ring_allreduce(ctx: Context, spec: TimingSpec) -> RankTimes:
    """Rank function: this rank's times for `repeats` all-reduces of each payload, and the bytes of one."""
    times, sent = [], []
    for i, size in enumerate(spec.sizes_bytes):
        x = torch.ones(size // 4)                              # (numel,) float32
        ring_all_reduce(ctx, x, phase=f"warm-up {i}", inplace=True)
        one = []
        for _ in range(spec.repeats):
            barrier(ctx, phase="line up")
            start = time.perf_counter()
            ring_all_reduce(ctx, x, phase="timed", inplace=True)
            one.append(time.perf_counter() - start)
        times.append(tuple(one))
        sent.append(ctx.ledger.totals(phase=f"warm-up {i}/", prefix=True)["bytes_sent"])
    return RankTimes(times=tuple(times), bytes_sent=tuple(sent))


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


def compare_timings(spec: TimingSpec, results: list[RankTimes]) -> Verdict:
    """Bytes per rank per payload against the formula (exact), timings positive and finite; the Measurements."""
    n = spec.world_size
    exact = [Count(quantity="bytes sent", rank=r, measured=res.bytes_sent[i],
                   predicted=costs.ring_allreduce_bytes(size // 4, n, r), case=f"{size} B")
             for i, size in enumerate(spec.sizes_bytes) for r, res in enumerate(results)]
    seconds = [t for res in results for per in res.times for t in per]
    finite = fact_check("every timing is a positive, finite number of seconds",
                        holds=all(math.isfinite(t) and t > 0 for t in seconds),
                        reason="a clock that went backwards or a NaN would make the fit meaningless")
    measurements = []
    for i, size in enumerate(spec.sizes_bytes):
        samples = tuple(max(res.times[i][k] for res in results) for k in range(spec.repeats))  # slowest rank
        measurements.append(Measurement(world_size=n, payload_bytes=size, seconds=statistics.median(samples),
                                        samples=samples, bytes_sent=tuple(res.bytes_sent[i] for res in results)))
    return Verdict(checks=[finite], exact=exact, params={"sizes_bytes": list(spec.sizes_bytes),
                                                         "repeats": spec.repeats}, data=tuple(measurements))


ALLREDUCE_TIMING = Experiment(
    name="allreduce-timing", title="ring all-reduce timings for the alpha-beta fit", chapter="01",
    world_sizes=DEFAULT_WORLD_SIZES, spec=lambda n: TimingSpec(world_size=n), ranks=time_ring_allreduce,
    compare=compare_timings)


def time_allreduce(*, world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                   sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = DEFAULT_REPEATS,
                   progress: OnProgress | None = None) -> list[Report]:
    """One Report per world size (ALLREDUCE_TIMING), its data the Measurements of every payload there.

    The whole plan is refused before any process starts; `progress(done, total, what)` is called
    before each world size and once at the end.
    """
    check_plan(world_sizes, sizes_bytes, repeats)
    specs = [TimingSpec(world_size=n, sizes_bytes=tuple(sizes_bytes), repeats=repeats) for n in world_sizes]
    reports = []
    for i, spec in enumerate(specs):
        if progress is not None:
            progress(i, len(specs), f"N={spec.world_size}: {len(spec.sizes_bytes)} payloads x {repeats}")
        reports.append(ALLREDUCE_TIMING.run_spec(spec))
    if progress is not None:
        progress(len(specs), len(specs), f"measured {len(specs) * len(sizes_bytes)} points")
    return reports


def measure_allreduce(*, world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                      sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
                      repeats: int = DEFAULT_REPEATS,
                      progress: OnProgress | None = None) -> list[Measurement]:
    """Time ring all-reduces on real ranks for every (N, size); one Measurement each.

    Raises RuntimeError (with the failing Report) if a rank's bytes differ from the formula or a
    timing is not a positive finite number: a fit of such timings would mean nothing.
    """
    reports = time_allreduce(world_sizes=world_sizes, sizes_bytes=sizes_bytes, repeats=repeats, progress=progress)
    failed = [r for r in reports if not r.passed]
    if failed:
        raise RuntimeError("the all-reduce timings failed their checks:\n" + "\n".join(str(r) for r in failed))
    return [m for r in reports for m in r.data]
