"""The benchmarks `wmdist bench` runs, as data: name, its function in wmdist/bench/suite.py, a line on what it measures.

This table is the registry: `wmdist.bench.suite.benchmarks()` builds its callables from it (in this order),
and `wmdist bench --help` lists it, without importing torch (suite.py does, which takes seconds on a
busy machine and which naming the benchmarks should not cost).
"""
from __future__ import annotations

from typing import NamedTuple


class Benchmark(NamedTuple):
    """One benchmark: its name on the command line, its function in wmdist/bench/suite.py, what it measures."""
    name: str
    function: str
    about: str


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("warm-vs-spawn", "bench_warm_vs_spawn",
              "seconds per call: a warm wmdist pool vs torch.multiprocessing.spawn from scratch"),
    Benchmark("ring-vs-gloo", "bench_ring_vs_gloo",
              "comm.ring_all_reduce's throughput vs gloo's all_reduce in pairs, and its bytes vs the bound"),
    Benchmark("pool-memory", "bench_memory", "summed PSS of a warm pool of each size, after one SGD step"),
    Benchmark("allreduce-fit", "bench_allreduce_fit",
              "the all-reduce time model (a, b, contention g) fitted to all-reduces timed on this machine"),
    Benchmark("ring-attention", "bench_ring_attention",
              "causal ring attention on N ranks vs SDPA in one process: time and per-rank peak memory"),
    Benchmark("panels", "bench_panels", "each panel's answer to a control move, in the kernel, against 100 ms"),
    Benchmark("plan", "bench_plan",
              "chapter 11's planner against every published run: utilisation error, memory fit, layout vs best"),
    Benchmark("session-memory", "bench_session_memory",
              "Binder's session: every chapter in its own kept kernel under Binder's limits (several minutes)"),
)


def help_text() -> str:
    """The benchmarks, one a line, for `wmdist bench --help`."""
    width = max(len(b.name) for b in BENCHMARKS)
    return "benchmarks, in the order they run:\n" + "\n".join(f"  {b.name:<{width}}  {b.about}" for b in BENCHMARKS)
