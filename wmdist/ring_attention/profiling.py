"""The profiler, used twice in this chapter: exact allocation peaks on CPU, and counting a library's collectives.

Both use torch.autograd.profiler.profile, which torch.profiler.profile wraps:
used directly it skips the wrapper's first-use import of torch._inductor
(about 800 modules, seconds in every fresh rank process). Its C++ side
(kineto) prints "USDT ... profiler_start/stop" lines on stderr at its
default log level, which would land in notebook cells from every rank, so
the first profile in a process runs with KINETO_LOG_LEVEL=6 (kineto reads
it once, when it first starts), put back afterwards.
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

QUIET_KINETO = "6"      # above kineto's USDT level (5): its start/stop lines are not printed


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    saved = os.environ.get("KINETO_LOG_LEVEL")
    os.environ["KINETO_LOG_LEVEL"] = saved if saved is not None else QUIET_KINETO
    try:
        yield
    finally:
        if saved is None:
            del os.environ["KINETO_LOG_LEVEL"]


@contextlib.contextmanager
def profiled(**options: Any) -> Iterator[Any]:
    """torch.autograd.profiler.profile(**options), quiet; the profile object is yielded."""
    from torch.autograd.profiler import profile

    with _quiet_kineto(), profile(**options) as prof:
        yield prof


@dataclass(frozen=True)
class Allocations:
    """What a call allocated, as the profiler's CPU allocator records saw it (bytes)."""
    peak: int        # most bytes alive at once among allocations made during the call
    end: int         # bytes of those allocations still alive when it returned: its results
    largest: int     # largest single allocation

    @property
    def temporary(self) -> int:
        """Peak working memory beyond the results the call returns."""
        return self.peak - self.end


def measure_allocations(fn: Callable[[], Any]) -> tuple[Any, Allocations]:
    """Run fn() under the autograd profiler with profile_memory=True and replay its allocation records.

    On CPU each record carries the allocator's running total of profiled
    bytes alive (`total_allocated`), so the peak is exact, including buffers
    kernels allocate internally. What else torch 2.13 offers on CPU falls
    short: torch.cpu keeps no memory statistics, memory snapshots are
    CUDA-only, FunctionEvent.cpu_memory_usage is a net total per op (no peak
    inside a call), and export_memory_timeline is deprecated. The records
    come from the profiler's (experimental) event tree. Returns fn's result,
    kept alive, and its Allocations.
    """
    with profiled(profile_memory=True, use_kineto=True) as prof:
        result = fn()
    records: list[tuple[int, int, int]] = []          # (time, size: + alloc / - free, total alive after)
    nodes = list(prof.kineto_results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        fields = node.extra_fields
        if hasattr(fields, "total_allocated") and hasattr(fields, "alloc_size"):
            records.append((node.start_time_ns, fields.alloc_size, fields.total_allocated))
        nodes.extend(node.children)
    if not records:
        return result, Allocations(0, 0, 0)
    first = min(records, key=lambda rec: rec[0])
    base = first[2] - first[1]                         # alive (from earlier profiled work) before the call
    return result, Allocations(peak=max(rec[2] for rec in records) - base, end=sum(rec[1] for rec in records),
                               largest=max(rec[1] for rec in records))


def op_input_bytes(fn: Callable[[], Any], op_name: str, elem_size: int) -> tuple[Any, int, int]:
    """Run fn() with shapes recorded; return its result, the calls of `op_name` and their first inputs' bytes."""
    with profiled(record_shapes=True) as prof:
        result = fn()
    shapes = [e.input_shapes[0] for e in prof.function_events if e.name == op_name]
    return result, len(shapes), elem_size * sum(math.prod(s) for s in shapes)
