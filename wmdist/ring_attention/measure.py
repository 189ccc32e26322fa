"""Measurements on this machine: a ring-attention run for the widget, and the F and B of the overlap condition.

`measure_ring` runs the widget's setting scaled to what local ranks can
hold (S at most RUN_MAX_SEQ, N at most RUN_MAX_RANKS) forward and backward
and returns the ledger's bytes and each rank's allocator peak, next to the
formulas at that S. `measure_link` times a ring step's exchange between two
gloo ranks (both send and receive at once, as ring attention does) and
`measure_matmul_flops` a float32 matrix product on one rank with one
thread, as the ranks compute: medians over repeats, on a shared machine.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from wmdist.comm import Context, barrier, exchange
from wmdist.costs import ring_attention as ra
from wmdist.ring_attention.profiling import measure_allocations
from wmdist.ring_attention.ring import BACKWARD_GRAD, BACKWARD_KV, FORWARD, positions, ring_backward, ring_forward
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.spec import DTypeName, RingSpec
from wmdist.ring_attention.traffic import RingMeasurement, TrafficConfig
from wmdist.course.experiment import Experiment, Verdict
from wmdist.base.on_progress import OnProgress
from wmdist.course.report import Report, counts_per_rank
from wmdist.runtime import run

RUN_MAX_SEQ, RUN_MAX_RANKS, RUN_MAX_WIDTH = 1024, 8, 1024


def run_setting(c: TrafficConfig) -> tuple[RingSpec, Layout]:
    """The spec "run it" uses for a widget setting (S capped at RUN_MAX_SEQ), and its layout; ValueError if too big."""
    if c.world_size > RUN_MAX_RANKS:
        raise ValueError(f"run it starts at most {RUN_MAX_RANKS} local ranks; set N <= {RUN_MAX_RANKS}")
    if c.batch * c.width > RUN_MAX_WIDTH:
        raise ValueError(f"run it needs batch x heads x head width <= {RUN_MAX_WIDTH} on this machine, "
                         f"got {c.batch * c.width}")
    spec = RingSpec(seq_len=min(c.seq_len, RUN_MAX_SEQ), batch=c.batch, heads=c.heads, head_dim=c.head_dim,
                    block_size=c.block_size)
    layout: Layout = "zigzag" if c.causal else "contiguous"
    spec.check(c.world_size, layout=layout)
    return spec, layout


@dataclass(frozen=True, kw_only=True)
class WidgetRun:
    """The setting "run it" measures: the widget's ring scaled to local ranks, on `world_size` of them."""
    world_size: int
    ring: RingSpec
    layout: Layout
    causal: bool
    dtype: DTypeName
    elem: int                        # bytes per element of `dtype`


def widget_run(c: TrafficConfig) -> WidgetRun:
    """What "run it" runs for a widget setting (see run_setting); ValueError before any process starts."""
    spec, layout = run_setting(c)
    return WidgetRun(world_size=c.world_size, ring=spec, layout=layout, causal=c.causal, dtype=c.dtype, elem=c.elem)


@dataclass(frozen=True)
class RankRing:
    """One rank's forward K, V bytes, backward bytes (K, V again and dK, dV) and allocator peak in the forward."""
    sent: int
    backward: int
    peak: int


def _measure_rank(ctx: Context, run: WidgetRun) -> RankRing:
    spec = run.ring
    q, k, v, dout = spec.inputs(dtype=run.dtype)
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout=run.layout)
    q, k, v, dout = (x[:, :, rows].contiguous() for x in (q, k, v, dout))
    sizes = {"seq_len": spec.seq_len, "layout": run.layout, "causal": run.causal, "block_size": spec.block_size}
    (out, lse, _), alloc = measure_allocations(lambda: ring_forward(ctx, q, k, v, **sizes))
    ring_backward(ctx, q, k, v, out, lse, dout, **sizes)
    back = ctx.ledger.totals(phase=BACKWARD_KV)["bytes_sent"] + ctx.ledger.totals(phase=BACKWARD_GRAD)["bytes_sent"]
    return RankRing(ctx.ledger.totals(phase=FORWARD)["bytes_sent"], back, alloc.peak)


def compare_widget_run(run: WidgetRun, results: list[RankRing]) -> Verdict:
    """Every rank's forward and backward bytes against the ring formulas (exact); the RingMeasurement for figures."""
    n, spec = run.world_size, run.ring
    args, sizes = (spec.seq_len, n, spec.kv_width), {"batch": spec.batch, "elem_size": run.elem}
    forward, backward = ra.ring_kv_bytes_per_rank(*args, **sizes), sum(ra.ring_backward_bytes_per_rank(*args, **sizes))
    exact = [*counts_per_rank("bytes sent", [r.sent for r in results], [forward] * n, phase="forward K, V"),
             *counts_per_rank("bytes sent", [r.backward for r in results], [backward] * n, phase="backward")]
    data = RingMeasurement(seq_len=spec.seq_len, world_size=n, sent=[r.sent for r in results], sent_predicted=forward,
                           backward=[r.backward for r in results], backward_predicted=backward,
                           peak=[r.peak for r in results], kv_storage=ra.ring_kv_storage_bytes(*args, **sizes))
    return Verdict(checks=[], exact=exact, params={"seq_len": spec.seq_len, "layout": run.layout,
                                                   "causal": run.causal, "dtype": run.dtype}, data=data)


RING_WIDGET = Experiment(
    name="ring-attention (widget)", title="the traffic panel's setting, scaled to local ranks", chapter="06",
    world_sizes=(1, 2, 4),
    spec=lambda n: widget_run(TrafficConfig(seq_len=256, heads=2, head_dim=16, world_size=n, block_size=32)),
    ranks=_measure_rank, compare=compare_widget_run)


def measure_ring(c: TrafficConfig, *, progress: OnProgress | None = None) -> Report:
    """Run the setting (scaled down) on local ranks: a Report whose counts are each rank's ledger bytes against
    the formulas, its data the RingMeasurement (bytes, allocator peaks) the panel draws."""
    return RING_WIDGET.run_spec(widget_run(c), progress=progress)


def _time_exchange(ctx: Context, numel: int, repeats: int) -> list[float]:
    data, into, other = torch.ones(numel), torch.empty(numel), 1 - ctx.rank
    times = []
    for _ in range(repeats):
        barrier(ctx)
        start = time.perf_counter()
        exchange(ctx, data, other, into, other, phase="bandwidth")
        times.append(time.perf_counter() - start)
    return times


def measure_link(*, mib: int = 8, repeats: int = 7) -> float:
    """Bytes per second one way between two gloo ranks, both sending at once (median over repeats).

    A helper for notebooks and tests (chapter 06 reads this machine's B): it calls `runtime.run` itself,
    since a measurement of the machine is no demo with a verdict.
    """
    numel = mib * 2 ** 20 // 4
    out = run(_time_exchange, 2, numel, repeats)
    return 4 * numel / statistics.median(max(a, b) for a, b in zip(*out))


def _time_matmul(ctx: Context, size: int, repeats: int) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return times


def measure_matmul_flops(*, size: int = 512, repeats: int = 7) -> float:
    """float32 FLOP/s of one rank (one thread) on a size x size matrix product: 2 size^3 / median time.

    A helper for notebooks and tests, like `measure_link`: it calls `runtime.run` itself.
    """
    return 2 * size ** 3 / statistics.median(run(_time_matmul, 1, size, repeats)[0])


def time_ring_forward(ctx: Context, spec: RingSpec, *, causal: bool, repeats: int) -> tuple[list[float], int]:
    """Rank function: seconds of each ring forward (after a barrier), and the bytes held at peak in one more, tracked.

    Bytes held = this rank's q, k, v rows plus the allocator's peak during the call.
    """
    layout: Layout = "zigzag" if causal else "contiguous"
    q, k, v, _ = spec.inputs(dtype="float32")
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout=layout)
    q, k, v = (x[:, :, rows].contiguous() for x in (q, k, v))
    sizes = {"seq_len": spec.seq_len, "layout": layout, "causal": causal, "block_size": spec.block_size}
    times = []
    for _ in range(repeats):
        barrier(ctx)
        start = time.perf_counter()
        ring_forward(ctx, q, k, v, **sizes)
        times.append(time.perf_counter() - start)
    _, alloc = measure_allocations(lambda: ring_forward(ctx, q, k, v, **sizes))
    return times, 3 * q.numel() * q.element_size() + alloc.peak


def time_sdpa(ctx: Context, spec: RingSpec, *, causal: bool, repeats: int) -> tuple[list[float], int]:
    """Rank function (one rank): seconds of torch's default SDPA on the whole sequence, and its bytes held at peak."""
    q, k, v, _ = spec.inputs(dtype="float32")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        times.append(time.perf_counter() - start)
    _, alloc = measure_allocations(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return times, 3 * q.numel() * q.element_size() + alloc.peak
