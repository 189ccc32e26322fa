"""Closed-form cost models from the source text, as pure functions.

No torch here: these formulas drive widgets and predict what the ledger must
measure, so they have to be importable and testable without processes.
Sizes are in bytes or elements as each name says; times in seconds.
"""
from __future__ import annotations

import math


def require_int(name: str, value: int, low: int) -> int:
    """Return `value` if it is an integer >= low (bools refused), else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def require_real(name: str, value: float, low: float = 0.0) -> float:
    """Return `value` as a float if it is a finite number >= low, else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
    return float(value)


# --- float32 rounding ----------------------------------------------------------

FLOAT32_ROUNDOFF = 2.0 ** -24   # unit roundoff u: one float32 rounding moves x by at most u * |x|


def reordered_sum_bound(terms: int, partial_sum_bound: float, extra_roundings: int = 0) -> float:
    """Largest |difference| between two float32 sums of the same values added in different orders.

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
    return (2 * (terms - 1) + extra_roundings) * FLOAT32_ROUNDOFF * bound


# --- ring collectives -------------------------------------------------------

def ring_chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Element counts of the N ring chunks of a flat tensor of `numel` elements.

    The first numel % N chunks hold one extra element (torch.tensor_split's
    layout), so lengths that N does not divide are handled exactly.
    """
    require_int("numel", numel, 0)
    require_int("world_size", world_size, 1)
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def ring_reduce_scatter_bytes(numel: int, world_size: int, rank: int, elem_size: int = 4) -> int:
    """Bytes rank `rank` sends in a ring reduce-scatter that leaves chunk r on rank r.

    In each of the N-1 rounds a rank forwards one partial chunk; over the
    rounds it sends every chunk except its own, i.e. G - |chunk_r|.
    """
    sizes = ring_chunk_sizes(numel, world_size)
    if world_size == 1:
        return 0
    return (numel - sizes[rank]) * elem_size


def ring_all_gather_bytes(numel: int, world_size: int, rank: int, elem_size: int = 4) -> int:
    """Bytes rank `rank` sends in a ring all-gather starting from chunk r on rank r.

    It forwards every chunk except the one its right neighbour owns:
    G - |chunk_{r+1}|.
    """
    sizes = ring_chunk_sizes(numel, world_size)
    if world_size == 1:
        return 0
    return (numel - sizes[(rank + 1) % world_size]) * elem_size


def ring_allreduce_bytes(numel: int, world_size: int, rank: int, elem_size: int = 4) -> int:
    """Exact bytes one rank sends in a ring all-reduce (reduce-scatter + all-gather).

    Equals 2(N-1)G/N when N divides the length; otherwise the true chunk sizes
    decide, and ranks differ by at most a few elements.
    """
    return (ring_reduce_scatter_bytes(numel, world_size, rank, elem_size)
            + ring_all_gather_bytes(numel, world_size, rank, elem_size))


def ring_allreduce_ideal_bytes(payload_bytes: float, world_size: int) -> float:
    """The text's per-rank volume 2(N-1)G/N for a payload of G bytes."""
    require_real("payload_bytes", payload_bytes)
    n = require_int("world_size", world_size, 1)
    return 2 * (n - 1) * payload_bytes / n


def ring_allreduce_rounds(world_size: int) -> int:
    """Communication rounds of a ring all-reduce: N-1 per phase, two phases."""
    return 2 * (require_int("world_size", world_size, 1) - 1)


def allreduce_time(world_size: int, alpha: float, beta: float, payload_bytes: float) -> float:
    """T(N) = 2(N-1)a + 2(N-1)/N bG: rounds times latency plus bytes times cost.

    T(1) = 0: a single worker has nothing to synchronize. Ignores reduction
    arithmetic, contention and overlap with compute, as the text says.
    """
    n = require_int("world_size", world_size, 1)
    a = require_real("alpha", alpha)
    b = require_real("beta", beta)
    g = require_real("payload_bytes", payload_bytes)
    return 2 * (n - 1) * a + 2 * (n - 1) / n * b * g


def allreduce_terms(world_size: int, alpha: float, beta: float, payload_bytes: float) -> tuple[float, float]:
    """The latency term 2(N-1)a and the byte term 2(N-1)/N bG of T(N), separately."""
    n = require_int("world_size", world_size, 1)
    latency = 2 * (n - 1) * require_real("alpha", alpha)
    return latency, allreduce_time(n, 0.0, beta, payload_bytes)


# --- scaling ----------------------------------------------------------------

def speedup(t_one: float, t_n: float) -> float:
    """How many times faster N workers finish than one: T_1 / T_N."""
    t1 = require_real("t_one", t_one)
    tn = require_real("t_n", t_n)
    if tn == 0:
        raise ValueError("t_n must be > 0")
    return t1 / tn


def efficiency(t_one: float, t_n: float, workers: int) -> float:
    """Speedup per worker: 24 h -> 1 h on 32 workers is 24x, i.e. 0.75."""
    return speedup(t_one, t_n) / require_int("workers", workers, 1)


# --- pipelines ----------------------------------------------------------------

def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction (P-1)/(M+P-1) of an ideal, balanced forward pipeline.

    Each stage is busy for M of the M+P-1 slots. Holds only for the slot
    accounting the text assumes: equal stage times, no communication cost.
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    return (p - 1) / (m + p - 1)


# --- sharded data parallelism (ZeRO) -------------------------------------------

ZERO_STAGES = (0, 1, 2, 3)


def zero_step_bytes(numel: int, world_size: int, rank: int, stage: int, elem_size: int = 4) -> dict[str, int]:
    """Bytes rank `rank` sends in one ZeRO training step, by phase, with ring collectives.

    The schedule wmdist.zero runs (the whole model is one flat unit):
    stage 0 (replicated data parallelism) all-reduces the gradient;
    stages 1 and 2 reduce-scatter the gradient and all-gather the updated
    parameters, which is the all-reduce's volume split in two;
    stage 3 all-gathers the parameters before forward, again before backward
    (they were freed in between) and reduce-scatters the gradient: 1.5x.
    Chunk sizes are the true tensor_split sizes, so ranks can differ slightly.
    """
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {ZERO_STAGES}, got {stage!r}")
    scatter = ring_reduce_scatter_bytes(numel, world_size, rank, elem_size)
    gather = ring_all_gather_bytes(numel, world_size, rank, elem_size)
    if stage == 0:
        return {"gradient all-reduce/reduce-scatter": scatter, "gradient all-reduce/all-gather": gather}
    if stage in (1, 2):
        return {"gradient reduce-scatter": scatter, "parameter all-gather": gather}
    return {"forward all-gather": gather, "backward all-gather": gather, "gradient reduce-scatter": scatter}


def zero_step_rounds(world_size: int, stage: int) -> int:
    """Ring rounds per ZeRO step: N-1 per collective; two collectives (three for stage 3)."""
    n = require_int("world_size", world_size, 1)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {ZERO_STAGES}, got {stage!r}")
    return (3 if stage == 3 else 2) * (n - 1)
