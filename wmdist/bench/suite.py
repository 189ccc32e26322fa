"""Benchmarks: ratios measured in one run, printed with their inputs.

Machines here are shared and noisy, so each benchmark compares two things
measured back to back in the same run (and reports medians), and the target
is stated next to the measured ratio instead of being asserted in tests.
"""
from __future__ import annotations

import functools
import inspect
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any, Callable

import psutil
import torch
import torch.distributed as dist

from wmdist import costs, runtime
from wmdist.comm import Context, all_reduce, barrier, ring_all_reduce
from wmdist.data_parallel.measure import DEFAULT_REPEATS, DEFAULT_SIZES_BYTES, DEFAULT_WORLD_SIZES, time_allreduce
from wmdist.data_parallel.scaling import TARGET_MEDIAN_REL_ERROR, fit_alpha_beta
from wmdist.ring_attention.measure import time_ring_forward, time_sdpa
from wmdist.bench.catalog import BENCHMARKS
from wmdist.bench.pairs import PairedRatio
from wmdist.bench.load import watch_load
from wmdist.base.bench_result import BenchResult, Load
from wmdist.base.on_progress import OnProgress
from wmdist.ring_attention.spec import RingSpec


# --- warm pool vs a fresh spawn per call -------------------------------------------

def _tiny_all_reduce(ctx: Context) -> float:
    x = torch.ones(4)
    all_reduce(ctx, x)
    return float(x[0])


def _one_sgd_step(ctx: Context) -> float:
    """What every training demo does at least once: build a torch optimizer, all-reduce, step."""
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(8)).sum().backward()
    for p in model.parameters():
        all_reduce(ctx, p.grad)
    opt.step()
    return model.bias.detach()[0].item()


def _spawn_target(rank: int, world_size: int, store_path: str) -> None:
    """What a one-shot mp.spawn job does: import, join, one all-reduce, leave."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size)
    x = torch.ones(4)
    dist.all_reduce(x)
    os._exit(0)   # skip the teardown that can abort with gloo on torch 2.13 (see pool._worker_main)


def bench_warm_vs_spawn(*, world_size: int = 4, warm_calls: int = 20, spawn_calls: int = 2) -> BenchResult:
    """Seconds per call: a warm wmdist pool vs torch.multiprocessing.spawn from scratch."""
    runtime.run(_tiny_all_reduce, world_size)           # make sure the pool is warm
    warm, cold, loads = [], [], []
    with watch_load(loads, "warm", busy=world_size):
        for _ in range(warm_calls):
            t = time.perf_counter()
            runtime.run(_tiny_all_reduce, world_size)
            warm.append(time.perf_counter() - t)
    with watch_load(loads, "spawn", busy=world_size):
        for _ in range(spawn_calls):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                torch.multiprocessing.spawn(_spawn_target, args=(world_size, os.path.join(tmp, "store")),
                                            nprocs=world_size, join=True)
                cold.append(time.perf_counter() - t)
    ratio = statistics.median(cold) / statistics.median(warm)
    return BenchResult(name="warm-vs-spawn", inputs={"world_size": world_size, "warm_calls": warm_calls,
                                         "spawn_calls": spawn_calls, "work": "one 4-element all_reduce"},
                       measured={"warm_median_ms": round(1e3 * statistics.median(warm), 2),
                        "spawn_median_ms": round(1e3 * statistics.median(cold), 1)},
                       value=ratio, unit="x", target=">= 30x faster", met=ratio >= 30, loads=tuple(loads))


# --- hand-written ring vs gloo's all_reduce -----------------------------------------------

def _time_both(ctx: Context, numel: int, repeats: int) -> dict[str, Any]:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank))
    times: dict[str, list[float]] = {"ring": [], "gloo": []}
    for i in range(repeats):
        # Pairs alternate which runs first (pair 1: the ring), so neither always follows the other (RING_FIRST).
        for name in ("ring", "gloo") if i % 2 == 0 else ("gloo", "ring"):
            y = x.clone()            # both in place, on a fresh copy made outside the timed region
            barrier(ctx)
            t = time.perf_counter()
            if name == "ring":
                ring_all_reduce(ctx, y, phase="ring", inplace=True)
            else:
                all_reduce(ctx, y, phase="gloo")
            times[name].append(time.perf_counter() - t)
    return {**times, "bytes": ctx.ledger.totals(phase="ring/", prefix=True)["bytes_sent"]}


RING_FIRST = ("the ring was measured slower right after a gloo call than right after a ring call (4 ranks, 16 MiB: "
              "by 3 to 4 ms of about 36; gloo showed no such difference), so pairs alternate which runs first: "
              "odd-numbered pairs the ring, even-numbered ones gloo")


def bench_ring_vs_gloo(*, world_size: int = 4, mib: int = 16, repeats: int = 15) -> BenchResult:
    """Throughput of comm.ring_all_reduce relative to gloo's built-in all_reduce.

    The two run back to back `repeats` times; each pair gives one ratio (gloo
    time / ring time, a collective being as slow as its slowest rank), and the
    headline is the median of those ratios. Pairing cancels the slow drifts of
    a shared machine's load, which a ratio of two separate medians would not;
    both are printed, with every pair (ring_vs_gloo_result).
    """
    numel = mib * 2 ** 20 // 4
    loads: list[Load] = []
    with watch_load(loads, "pairs", busy=world_size):
        out = runtime.run(_time_both, world_size, numel, repeats)
    ring = [max(o["ring"][i] for o in out) for i in range(repeats)]
    gloo = [max(o["gloo"][i] for o in out) for i in range(repeats)]
    return ring_vs_gloo_result(ring, gloo, per_rank_bytes=[o["bytes"] // repeats for o in out], mib=mib,
                               world_size=world_size, loads=loads)


def ring_vs_gloo_result(ring: list[float], gloo: list[float], *, per_rank_bytes: list[int], mib: int,
                        world_size: int, loads: list[Load]) -> BenchResult:
    """The record of `repeats` pairs (seconds, slowest rank, run order): headline, both medians, every pair."""
    numel = mib * 2 ** 20 // 4
    pairs = PairedRatio(top_name="gloo", bottom_name="ring", top=tuple(gloo), bottom=tuple(ring))
    predicted = [costs.ring_allreduce_bytes(numel, world_size, r) for r in range(world_size)]
    ratio = pairs.headline
    result = BenchResult(name="ring-vs-gloo", inputs={"world_size": world_size, "payload_MiB": mib,
                                                      "dtype": "float32", "repeats": len(ring)},
                         measured={"ring_median_s": round(statistics.median(ring), 4),
                          "gloo_median_s": round(statistics.median(gloo), 4),
                          "ratio_of_medians": round(pairs.ratio_of_medians, 3),
                          "pair_ratio_median": round(ratio, 3),
                          "pair_ratio_quartiles": [round(q, 3) for q in pairs.quartiles()],
                          "ring_bytes_sent_per_rank": per_rank_bytes,
                          "bound_2(N-1)G/N": costs.ring_allreduce_ideal_bytes(numel * 4, world_size)},
                         value=ratio, unit="x", target=">= 1x gloo's throughput, bytes at the bound",
                         met=ratio >= 1.0 and per_rank_bytes == predicted, loads=tuple(loads))
    by_order = [statistics.median(pairs.ratios[first::2]) for first in (0, 1) if pairs.ratios[first::2]]
    result.notes += ["throughput ratio = gloo time / ring time for the same payload, median over paired runs",
                     *pairs.lines(), RING_FIRST + ": median pair ratio " +
                     " and ".join(f"{r:.3f}x with {'the ring' if i == 0 else 'gloo'} first"
                                  for i, r in enumerate(by_order))]
    return result


# --- memory of a warm pool ------------------------------------------------------------

def tree_pss_mb(pid: int | None = None) -> float:
    """Proportional set size of a process and all its descendants, in MB (10^6 bytes).

    PSS splits each shared page among the processes mapping it, so the sum
    is what the tree really costs (forked ranks share the preloaded torch).
    """
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 1e6


def bench_memory(*, world_sizes: tuple[int, ...] = (4, 8)) -> BenchResult:
    """Summed PSS of this process plus a warm pool of each size (started alone), after one optimizer step.

    Measured after a training step, not just after a start: a rank's first
    torch optimizer imports torch._dynamo, which costs 1 GB over 8 ranks
    unless the forkserver preloaded it (runtime/frozen.py).
    """
    measured, loads = {}, []
    for n in world_sizes:
        runtime.shutdown()
        with watch_load(loads, f"{n}_ranks", busy=n, timed=False):
            runtime.run(_tiny_all_reduce, n)
            measured[f"{n}_ranks_started_MB"] = round(tree_pss_mb(), 1)
            runtime.run(_one_sgd_step, n)
            measured[f"{n}_ranks_MB"] = round(tree_pss_mb(), 1)
    runtime.shutdown()
    top = measured[f"{max(world_sizes)}_ranks_MB"]
    return BenchResult(name="pool-memory", inputs={"world_sizes": list(world_sizes),
                                       "measure": "PSS of parent + forkserver + ranks, after one SGD step"},
                       measured=measured, value=top, unit="MB", target=f"{max(world_sizes)} ranks + parent < 600 MB",
                       met=top < 600, loads=tuple(loads))


def bench_allreduce_fit(*, world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES,
                        sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES,
                        repeats: int = DEFAULT_REPEATS) -> BenchResult:
    """Fit s(N) T(N) (a, b and the contention g) to ring all-reduces measured on this machine."""
    start, loads = time.perf_counter(), []
    with watch_load(loads, "timings", busy=max(world_sizes)):
        reports = time_allreduce(world_sizes=world_sizes, sizes_bytes=sizes_bytes, repeats=repeats)
    ms = [m for r in reports for m in r.data]
    cores = os.cpu_count() or 1
    fit = fit_alpha_beta(ms, cores=cores)
    bytes_ok = all(r.passed for r in reports)          # each rank's ledger bytes = the formula, every timing finite
    return BenchResult(name="allreduce-fit", inputs={"world_sizes": list(world_sizes), "sizes_bytes": list(sizes_bytes),
                                         "repeats": repeats, "cores": cores},
                       measured={"alpha_s": fit.alpha, "beta_s_per_byte": fit.beta, "contention_g": fit.contention,
                        "bandwidth_GB_per_s": None if fit.bandwidth_bytes_per_s is None   # b not resolved
                        else fit.bandwidth_bytes_per_s / 1e9,
                        "unresolved_terms": list(fit.unresolved), "max_rel_error": fit.max_rel_error,
                        "ledger_bytes_exact": bytes_ok, "seconds": time.perf_counter() - start},
                       value=100 * fit.median_rel_error, unit="%", target=f"median relative error <= {100 * TARGET_MEDIAN_REL_ERROR:g}%",
                       met=fit.median_rel_error <= TARGET_MEDIAN_REL_ERROR and bytes_ok, loads=tuple(loads),
                       notes=[f"model: (1 + g max(0, N/{cores} - 1)) (2(N-1)a + 2(N-1)/N bG); g is the one fitted "
                        "contention term for ranks sharing cores"]
                       + [f"{t}: {fit.describe(t)}" for t in fit.unresolved])


# --- ring attention vs one process ------------------------------------------------------

def bench_ring_attention(*, world_size: int = 4, seq_len: int = 4096, repeats: int = 5) -> BenchResult:
    """Causal ring attention forward on N ranks vs torch's SDPA in one process (one thread each), same S.

    Time: median over repeats of the slowest rank's forward (a ring step waits for its neighbour).
    Memory: bytes a rank holds (its rows of q, k, v and the allocator's peak during the call) vs the same
    for SDPA on the whole sequence (torch's CPU flash kernel, which is blocked too, so the ratio is about
    the S/N tokens; against unblocked attention see the long-context demo).
    """
    spec = RingSpec(seq_len=seq_len, batch=1, heads=4, head_dim=32, block_size=256)
    spec.check(world_size, layout="zigzag")
    loads: list[Load] = []
    with watch_load(loads, "ring", busy=world_size):
        ring = runtime.run(time_ring_forward, world_size, spec, causal=True, repeats=repeats)
    with watch_load(loads, "sdpa", busy=1):
        (single_times, single_peak), = runtime.run(time_sdpa, 1, spec, causal=True, repeats=repeats)
    ring_s = statistics.median(max(r[0][i] for r in ring) for i in range(repeats))
    single_s = statistics.median(single_times)
    peak = max(r[1] for r in ring)
    ratio = single_s / ring_s
    return BenchResult(name="ring-attention", inputs={"world_size": world_size, "seq_len": seq_len, "heads": 4, "head_dim": 32,
                                          "block_size": 256, "causal": True, "layout": "zigzag", "dtype": "float32"},
                       measured={"ring_median_s": round(ring_s, 4), "sdpa_median_s": round(single_s, 4),
                        "ring_peak_bytes_per_rank": [r[1] for r in ring], "sdpa_peak_bytes": single_peak,
                        "peak_ratio": round(peak / single_peak, 3)},
                       value=ratio, unit="x", target="speed reported (SDPA time / ring time); per-rank peak < single-process peak",
                       met=peak < single_peak, loads=tuple(loads),
                       notes=[(f"{world_size} ranks share {os.cpu_count()} cores; ring tiles run as Python loops of torch "
                         "ops, SDPA as one fused kernel"),
                        (f"per-rank peak / single-process peak = {peak / single_peak:.3f} (1/N = {1 / world_size:.3f}): "
                         "a rank also keeps two packed K, V blocks (one in use, one arriving) and its score tiles")])


def bench_panels() -> BenchResult:
    """panels.bench_panels (which imports the widgets, so only when asked for), with the load around it.

    busy=1: the kernel's one process draws each answer (its prefetch worker is a thread of it).
    """
    from wmdist.bench.panels import bench_panels as panels
    loads: list[Load] = []
    with watch_load(loads, "moves", busy=1):
        result = panels()
    return replace(result, loads=(*result.loads, *loads))


def bench_plan() -> BenchResult:
    """planner.scoring.bench_plan (pure arithmetic over the published runs: no processes, no timing)."""
    from wmdist.planner.scoring import bench_plan as plan
    return plan()


def bench_session_memory(*, memory_limit_mib: int = 2048, cpu_quota: float = 1.0,
                         progress: OnProgress | None = None) -> BenchResult:
    """Binder's session: the ten chapters opened one after another, every kernel kept, under Binder's limits.

    The headline is the peak over chapters of the PSS summed over every process in the session's
    memory cgroup, over the limit (wmdist/session/). Several minutes: each chapter runs top to bottom,
    and `progress` hears of each as it starts and ends. The session's CPU quota is what it keeps busy.
    """
    from wmdist.session.bench import session_memory
    loads: list[Load] = []
    with watch_load(loads, "session", busy=cpu_quota or os.cpu_count() or 1, timed=False):
        result = session_memory(memory_limit_mib=memory_limit_mib, cpu_quota=cpu_quota, progress=progress)
    return replace(result, loads=tuple(loads))


def benchmarks(*, progress: OnProgress | None = None) -> dict[str, Callable[[], BenchResult]]:
    """Every benchmark by name, in the order `wmdist bench` runs them (catalog.BENCHMARKS, the registry).

    progress: passed to each benchmark that takes one (a long one says how far it has got).
    """
    table: dict[str, Callable[[], BenchResult]] = {}
    for entry in BENCHMARKS:
        run = globals()[entry.function]
        takes = "progress" in inspect.signature(run).parameters
        table[entry.name] = functools.partial(run, progress=progress) if takes and progress else run
    return table
