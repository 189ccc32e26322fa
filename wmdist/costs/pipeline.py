"""Pipeline bubbles in the two conventions the literature uses, activations in flight, boundary transfers.

Notation: P ranks in the pipeline (`stages`), M microbatches, v virtual
stages per rank (`chunks`, interleaved schedules only). Every formula here
is the slot accounting of an ideal pipeline: equal stage times, no
communication cost, nothing overlapping from the next batch. The simulator
(wmdist.pipeline.simulate) measures the same quantities from a schedule, and
the tests hold the two to exact equality where these assumptions hold.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from wmdist.costs.validate import require_choice, require_int, require_positive, require_real

ScheduleName = Literal["gpipe", "1f1b", "interleaved"]    # the schedules the course builds and runs
SCHEDULES: tuple[str, ...] = get_args(ScheduleName)


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction (P-1)/(M+P-1) of an ideal, balanced forward pipeline.

    Each stage is busy for M of the M+P-1 slots. Holds only for the slot
    accounting the text assumes: equal stage times, no communication cost.
    Training schedules (GPipe, 1F1B) give the same fraction when every stage's
    forward takes one time and every backward another, because the backward
    sweep repeats the fill and drain; with unequal stage times the slowest
    stage sets the pace and the idle share is larger (see fill_drain_time).
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    return (p - 1) / (m + p - 1)


def bubble_over_ideal(stages: int, microbatches: int, *, chunks: int = 1) -> float:
    """Bubble time over ideal compute time, (P-1)/M, and (P-1)/(v*M) for interleaving (Megatron-LM, 2021).

    This is the other convention: the denominator is the time the pipeline
    would take with no bubble (M microbatches of work per rank), not the
    whole schedule. For P = 4, M = 8 it is 3/8, while the same schedule is
    idle 3/11 of its length. Interleaving cuts each rank's layers into v
    chunks whose fill and drain each take 1/v of a plain stage's time, so the
    bubble shrinks v-fold, paid for with v times as many boundary transfers
    and more activations in flight. Same caveats as bubble_fraction: equal
    stage times, free communication; the interleaved figure also assumes the
    Megatron schedule (M a multiple of P).
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("chunks", chunks, 1)
    return _over_ideal_unchecked(p, m, v)


def _over_ideal_unchecked(p: int, m: int, v: int) -> float:
    """bubble_over_ideal's formula for sizes already checked (a config's, e.g. pipeline.bubble.BubbleConfig)."""
    return (p - 1) / (v * m)


def fraction_from_ratio(ratio: float) -> float:
    """Convert bubble/ideal r into bubble/whole schedule, r/(1+r): e.g. (P-1)/M -> (P-1)/(M+P-1)."""
    return _from_ratio_unchecked(require_real("ratio", ratio))


def _from_ratio_unchecked(r: float) -> float:
    """fraction_from_ratio's formula for a ratio already known finite and >= 0."""
    return r / (1 + r)


def ratio_from_fraction(fraction: float) -> float:
    """Convert bubble/whole schedule f (below 1) into bubble/ideal, f/(1-f): the inverse of fraction_from_ratio."""
    f = require_real("fraction", fraction, low=0.0, high=1.0)
    if f == 1.0:
        raise ValueError("fraction must be below 1 (a schedule that is all bubble has no ideal time), got 1.0")
    return f / (1 - f)


def peak_activations_in_flight(schedule: ScheduleName, stages: int, microbatches: int, *, chunks: int = 1,
                               rank: int = 0) -> int:
    """Most microbatch activation sets rank `rank` holds at once: GPipe M, 1F1B min(P-rank, M), interleaved below.

    An activation set is what one forward of one microbatch on one (virtual)
    stage stores until its backward uses it. GPipe runs all M forwards before
    any backward, so every rank peaks at M. 1F1B's rank r runs P-r-1
    warm-up forwards and then one more before its first backward: min(P-r, M),
    so stage 0 holds min(P, M), independent of M once M >= P.

    Interleaved 1F1B (torch's and Megatron's order) warms rank r up with
    w = (v-1)P + 2(P-1-r) forwards (at most M*v), then alternates one forward
    and one backward, so the count reaches w + 1 and stays there:
    min((v-1)P + 2(P-1-r) + 1, M*v). These sets are of virtual stages; with
    layers split evenly each is 1/v of a plain stage's, so rank 0 holds
    ((v+1)P - 1)/v = P + (P-1)/v plain-stage microbatches: (P-1)/v more than
    1F1B, the memory price of the smaller bubble. Assumes equal-size
    microbatches and that a backward frees its forward's activations.
    """
    require_choice("schedule", schedule, SCHEDULES)
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("chunks", chunks, 1)
    r = require_int("rank", rank, 0, high=p - 1)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"chunks must be 1 for the {schedule} schedule, got chunks={v}")
    if schedule == "interleaved" and m % p:
        raise ValueError(f"microbatches must be a multiple of stages for the interleaved schedule, "
                         f"got microbatches={m}, stages={p}")
    return _peaks_unchecked(schedule, p, m, v)[r]


def _peaks_unchecked(schedule: ScheduleName, p: int, m: int, v: int) -> tuple[int, ...]:
    """peak_activations_in_flight of every rank 0..P-1, for a shape already checked (a built schedule's)."""
    if schedule == "gpipe":
        return (m,) * p
    if schedule == "1f1b":
        return tuple(min(p - r, m) for r in range(p))
    return tuple(min((v - 1) * p + 2 * (p - 1 - r) + 1, m * v) for r in range(p))


def boundary_transfers(stages: int, microbatches: int, *, chunks: int = 1) -> int:
    """Point-to-point transfers between ranks in one direction per step: M(P-1), or M(Pv-1) interleaved.

    Each microbatch crosses every boundary between consecutive (virtual)
    stages once in the forward (an activation) and once back in the backward
    (its gradient), so the backward adds the same count again. With v chunks
    there are Pv-1 boundaries and all of them join different ranks (stage s on
    rank s % P) unless P = 1, when nothing leaves the rank.
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("chunks", chunks, 1)
    return _transfers_unchecked(p, m, v)


def _transfers_unchecked(p: int, m: int, v: int) -> int:
    """boundary_transfers' count for sizes already checked."""
    return m * (p * v - 1) if p > 1 else 0


def boundary_bytes(stages: int, microbatches: int, tensor_bytes: int, *, chunks: int = 1) -> int:
    """Bytes sent in one direction per step when each boundary tensor (one microbatch) is `tensor_bytes` bytes.

    e.g. a microbatch of 4 x 128 float32 activations is 2048 bytes; P = 4,
    M = 8 sends 24 of them forward, 49152 bytes, and the same back as
    gradients. Counts payload only: no message headers, and boundary tensors
    of equal size at every cut (true when stages are copies of one block).
    """
    b = require_int("tensor_bytes", tensor_bytes, 0)
    return boundary_transfers(stages, microbatches, chunks=chunks) * b


def fill_drain_time(stage_times: Sequence[float], microbatches: int) -> float:
    """Time for M microbatches to pass through stages of unequal durations t_s: sum(t) + (M-1) * max(t).

    The first microbatch needs every stage once; after it, the slowest
    stage releases one microbatch per max(t), so faster stages wait on it.
    With equal times t this is (M+P-1)t, the bubble_fraction accounting;
    with imbalance stage s idles (sum(t) - t_s) + (M-1)(max(t) - t_s), the
    second term growing with M instead of amortizing. An ideal
    GPipe step is fill_drain_time(forward) + fill_drain_time(backward),
    because the last stage starts its backwards right after its last forward.
    """
    m = require_int("microbatches", microbatches, 1)
    times = [require_positive(f"stage_times[{i}]", t) for i, t in enumerate(stage_times)]
    if not times:
        raise ValueError("stage_times must hold at least one stage's duration, got none")
    return sum(times) + (m - 1) * max(times)
