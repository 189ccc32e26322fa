"""Where each stage waits, measured, and whether more microbatches hide the boundary transfers.

Two timed demos on real ranks (each action a fixed sleep, as in measure.py). pp-stage-waits times
one GPipe and one 1F1B training step at M = P and splits each stage's idle time into fill, between
and drain (shortest of 5 steps), against wmdist.costs.pipeline_stages. pp-overlap times 1F1B at a
fixed batch of 16 for M = 1, 2, 4, 8 (a microbatch's forward takes STAGE_SECONDS / M), times the
boundary tensor alone (ping-pong, ranks 0 and 1), and sets each step beside two ideal-time
predictions from the measured action times: messages free, and the measured one-way time charged
on every cross-rank hop (latency_makespan); 2M(P-1) one-way times is the cost if none were hidden.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from wmdist.comm import Context, barrier, recv, send
from wmdist.costs import pipeline as pcosts
from wmdist.costs.pipeline_stages import StageWaits, stage_waits
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.demos import WIDTH, boundary_counts
from wmdist.pipeline.measure import check_timed, measured
from wmdist.pipeline.plan import PipeWork, microbatch_sizes
from wmdist.pipeline.results import MeasuredBubble
from wmdist.pipeline.schedules import BACKWARD, FORWARD, Schedule, make_schedule
from wmdist.pipeline.spec import Plans, StageRuns, by_case, plans_rank
from wmdist.course.report import Check, close_check, differ_check

WAIT_SLOT = 0.045          # t_F of the stage-waits demo (t_B = 2 t_F): P = 4, M = 4 is 0.95 s a step
HOP_ALLOWANCE = 0.015      # seconds per critical-path message (observed 2-4 ms quiet, 10 ms under a loaded
                           # clean-clone CI run: 20.1 ms over P = 2's two hops failed 10 ms a hop)
WAIT_WHY = ("seconds, {:g} ms for each of the {} messages on the step's critical path (critical_hops): t_F, "
            "t_B are the measured median action times, so what is left is latency, late wake-ups and the "
            "send/receive bookkeeping outside the action spans, and in a balanced step any of them delays every "
            "later wait; slot {:g} ms, shortest of 5 steps. A drain of (P-1-s) t_B misses the end stages by "
            "(P-1) t_B, >= 1.6 times this allowance for P <= 8")
STAGE_SECONDS = 0.06       # pp-overlap: one stage's forward of the whole batch (a microbatch's: / M)
OVERLAP_BATCH = 16
OVERLAP_MICROBATCHES = (1, 2, 4, 8)
OVERLAP_STEPS = 5          # timed steps per M, the shortest checked (3 let one late wake-up through with two CPU
                           # hogs beside the suite: M = 2 was 33.8 ms over its no-message prediction, allowed 30)
STEP_WHY = ("seconds, {:g} ms for each of the {} messages on the critical path: the prediction uses each "
            "stage's measured action times, so what is left happens between actions (send bookkeeping, latency, "
            "late wake-ups; best of {} steps, as other work on the machine only adds time); the transfer alone is "
            "{:.2f} ms (ping-pong), the slot {:g} ms")
PINGS = 15                 # round trips timed per boundary size


def measured_waits(bubble: MeasuredBubble) -> tuple[tuple[float, float, float], ...]:
    """Per stage: (fill, between, drain) in seconds, in the shortest of the timed steps.

    The shortest, not the median: other work on a shared machine only ever
    delays a rank, so the least disturbed step is the one to hold to the
    formula, and all three waits come from that one step.
    """
    timeline = min(bubble.timelines, key=lambda t: max(s.end for s in t))
    end, rows = max(s.end for s in timeline), []
    for stage in range(bubble.schedule.stages):
        mine = [s for s in timeline if s.row == stage]
        fill, drain = min(s.start for s in mine), end - max(s.end for s in mine)
        rows.append((fill, end - sum(s.duration for s in mine) - fill - drain, drain))
    return tuple(rows)


def measured_slots(bubble: MeasuredBubble) -> tuple[float, float]:
    """The median measured forward and backward durations over all stages and steps: t_F and t_B as run.

    Each is the sleep plus the tiny model's real compute and the sleep's
    overshoot (~1-3 ms here); the formula is evaluated at these, so that what
    it leaves out is only what happens between actions (messages, wake-ups).
    """
    spans = [s for t in bubble.timelines for s in t]
    return (statistics.median(s.duration for s in spans if s.kind == "forward"),
            statistics.median(s.duration for s in spans if s.kind == "backward"))


@dataclass(frozen=True, kw_only=True)
class WaitsRun:
    """One schedule's measured per-stage waits (seconds) beside the formula's."""
    schedule: str
    t_forward: float                                      # median measured forward (sleep + compute), seconds
    t_backward: float                                     # median measured backward
    measured: tuple[tuple[float, float, float], ...]      # [stage] -> (fill, between, drain), shortest step
    formula: tuple[StageWaits, ...]                       # [stage], in seconds
    bubble: MeasuredBubble


Formula = Callable[..., StageWaits]


def waits_spec(world_size: int) -> Plans:
    """GPipe and 1F1B training at M = P on P = `world_size` >= 2 ranks, t_F = WAIT_SLOT, 5 timed steps each."""
    p = require_int("world_size", world_size, 1)
    if p < 2:
        raise ValueError(f"world_size must be >= 2: a single stage never waits (fill and drain are 0), got {p}")
    work = PipeWork(batch_size=p, slot_seconds=WAIT_SLOT, repeats=5)
    return Plans(world_size=p, cases=tuple((check_timed(make_schedule(name, p, p), work), work)
                                           for name in ("gpipe", "1f1b")))


def compare_waits(plans: Plans, results: list[StageRuns], *, formula: Formula = stage_waits) -> Verdict:
    """Each stage's measured (fill, between, drain) against `formula` (stage_waits; a test passes a wrong one)."""
    checks: list[Check] = []
    data = []
    exact = []
    for (schedule, work), bubble, runs in zip(plans.cases, measured(plans, results), by_case(results), strict=True):
        P, M = schedule.stages, schedule.microbatches
        tf, tb = measured_slots(bubble)
        want = tuple(formula(schedule.name, P, M, s, t_forward=tf, t_backward=tb) for s in range(P))
        got = measured_waits(bubble)
        hops = critical_hops(schedule)
        for s in range(P):
            checks.append(close_check(f"{schedule.name} stage {s}: measured (fill, between, drain) == formula",
                                      got[s], [float(want[s].fill), float(want[s].between), float(want[s].drain)],
                                      HOP_ALLOWANCE * hops,
                                      WAIT_WHY.format(1e3 * HOP_ALLOWANCE, hops, 1e3 * work.slot_seconds)))
        exact += boundary_counts(schedule, runs, work, schedule.name)
        data.append(WaitsRun(schedule=schedule.name, t_forward=tf, t_backward=tb, measured=got, formula=want,
                             bubble=bubble))
    P = plans.world_size
    params = {"microbatches": P, "slot_ms": 1e3 * WAIT_SLOT, "t_F, t_B": "measured medians (sleep + compute)",
              "formula": "fill s*t_F, between (P-1-s)(t_F+t_B), drain s*t_B"}
    return Verdict(checks=checks, exact=exact, params=params, data=tuple(data))


WAITS_DEMO = Experiment(name="pp-stage-waits", chapter="05", world_sizes=(2, 4), spec=waits_spec,
                        title="Per stage, fill and drain measured: s t_F before, s t_B after (GPipe, 1F1B)",
                        ranks=plans_rank, compare=compare_waits)


# --- overlap against M ---------------------------------------------------------------------------------

def latency_makespan(schedule: Schedule, forward: Sequence[float], backward: Sequence[float], delay: float) -> float:
    """Ideal-time step length when every message between two ranks arrives `delay` seconds after it was sent.

    The simulator's rule (an action starts when its rank is free and its
    inputs exist) with one change: an input made on another rank is ready
    `delay` after its producer ended. delay = 0 is simulate()'s makespan.
    """
    ends: dict[tuple[str, int, int], float] = {}
    free = [0.0] * schedule.stages
    position = [0] * schedule.stages
    last = schedule.virtual_stages - 1
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule.ranks):
            while position[rank] < len(actions):
                a = actions[position[rank]]
                s, m = a.stage, a.microbatch
                needs = ([(FORWARD, s - 1, m)] if s > 0 else []) if a.kind == FORWARD else \
                    [(FORWARD, s, m)] + ([(BACKWARD, s + 1, m)] if s < last else [])
                if any(k not in ends for k in needs):
                    break
                ready = [ends[k] + (delay if k[1] % schedule.stages != rank else 0.0) for k in needs]
                start = max([free[rank]] + ready)
                free[rank] = ends[(a.kind, s, m)] = start + (forward if a.kind == FORWARD else backward)[s]
                position[rank] += 1
                progress = True
    if any(p < len(a) for p, a in zip(position, schedule.ranks)):
        raise ValueError(f"schedule {schedule.name!r} cannot finish (see simulate.simulate for the deadlock)")
    return max(free)


def critical_hops(schedule: Schedule) -> int:
    """Cross-rank messages on the critical path of the balanced step (t_F = 1, t_B = 2): what a small latency adds.

    GPipe: 2(P-1) whatever M, the fill's chain forward and the drain's chain
    back. 1F1B: more as M grows, since in its steady phase a stage's next
    backward waits on a gradient that has just crossed a boundary.
    """
    P, delay = schedule.stages, 1e-3
    free = latency_makespan(schedule, [1.0] * P, [2.0] * P, 0.0)
    return round((latency_makespan(schedule, [1.0] * P, [2.0] * P, delay) - free) / delay)


@dataclass(frozen=True, kw_only=True)
class OverlapSpec:
    """pp-overlap's cases (1F1B at each M, fixed batch) and the boundary tensor's element count at each M."""
    world_size: int
    plans: Plans
    elements: tuple[int, ...]          # [case]: (B/M rounded up) x T x H, the largest boundary tensor


@dataclass(frozen=True)
class OverlapRuns:
    """One rank's timed steps, and (ranks 0 and 1) the median one-way time of each boundary size."""
    runs: StageRuns
    one_way: tuple[float, ...]


def overlap_spec(world_size: int, *, microbatches: tuple[int, ...] = OVERLAP_MICROBATCHES,
                 batch_size: int = OVERLAP_BATCH) -> OverlapSpec:
    """1F1B on P = `world_size` >= 2 ranks at each M (global batch fixed), checked before any process starts."""
    p = require_int("world_size", world_size, 1)
    if p < 2:
        raise ValueError(f"world_size must be >= 2: one stage sends no boundary tensors, got {p}")
    if not microbatches:
        raise ValueError("microbatches must name at least one M to time")
    cases, elements = [], []
    for m in microbatches:
        work = PipeWork(batch_size=batch_size, slot_seconds=STAGE_SECONDS / require_int("microbatches", m, 1),
                        repeats=OVERLAP_STEPS)
        cases.append((check_timed(make_schedule("1f1b", p, m), work), work))
        elements.append(max(microbatch_sizes(batch_size, m)) * work.seq_len * WIDTH)
    return OverlapSpec(world_size=p, plans=Plans(world_size=p, cases=tuple(cases)), elements=tuple(elements))


def overlap_rank(ctx: Context, spec: OverlapSpec) -> OverlapRuns:
    """Rank function: every timed step, then ranks 0 and 1 time PINGS round trips of each boundary size."""
    runs = plans_rank(ctx, spec.plans)
    one_way = []
    for n in spec.elements:
        buffer = torch.zeros(n)
        barrier(ctx, phase="pp/ping line up")
        trips = []
        for _ in range(PINGS if ctx.rank < 2 else 0):
            start = time.monotonic()
            if ctx.rank == 0:
                send(ctx, buffer, 1, phase="pp/ping")
                recv(ctx, buffer, 1, phase="pp/ping")
            else:
                recv(ctx, buffer, 0, phase="pp/ping")
                send(ctx, buffer, 0, phase="pp/ping")
            trips.append(time.monotonic() - start)
        one_way.append(statistics.median(trips) / 2 if trips else 0.0)
    return OverlapRuns(runs=runs, one_way=tuple(one_way))


@dataclass(frozen=True, kw_only=True)
class OverlapPoint:
    """One M of pp-overlap, all in seconds: measured step, the two predictions, the transfer beside the slot."""
    microbatches: int
    slot: float                  # t_F of one microbatch on one stage (the sleep; t_B = 2 t_F)
    transfer: float              # measured one-way time of one boundary tensor
    step: float                  # measured step, the shortest of OVERLAP_STEPS (load only makes steps longer)
    free_messages: float         # ideal time from the measured action durations, messages free
    charged: float               # the same, each cross-rank hop charged `transfer`
    serial: float                # 2 M (P-1) transfer: every message's time, if none were hidden
    hops: int                    # messages on the critical path (critical_hops): charged - free = hops * transfer
    idle: float                  # measured idle fraction (median)

    @property
    def per_hop(self) -> float:
        """What the run measured above the no-message prediction, per critical-path message (seconds)."""
        return (self.step - self.free_messages) / self.hops

    @property
    def hidden(self) -> float:
        """Share of all the step's transfer time the schedule hides behind compute: 1 - (charged - free) / serial."""
        return 1 - (self.charged - self.free_messages) / self.serial


def action_times(bubble: MeasuredBubble) -> tuple[list[float], list[float]]:
    """Per stage, the median measured forward and backward durations (sleep plus real compute)."""
    P = bubble.schedule.stages
    spans = [s for t in bubble.timelines for s in t]
    return ([statistics.median(s.duration for s in spans if s.row == r and s.kind == "forward") for r in range(P)],
            [statistics.median(s.duration for s in spans if s.row == r and s.kind == "backward") for r in range(P)])


def compare_overlap(spec: OverlapSpec, results: list[OverlapRuns]) -> Verdict:
    """Each M's measured step against the no-message prediction; fill and drain amortized; the rest as data."""
    plans, P = spec.plans, spec.world_size
    bubbles = measured(plans, [r.runs for r in results])
    points = []
    for (schedule, work), bubble, transfer in zip(plans.cases, bubbles, results[0].one_way, strict=True):
        fw, bw = action_times(bubble)
        step = min(max(s.end for s in t) for t in bubble.timelines)      # shortest: load only ever adds time
        points.append(OverlapPoint(microbatches=schedule.microbatches, slot=work.slot_seconds, transfer=transfer,
                                   step=step, free_messages=latency_makespan(schedule, fw, bw, 0.0),
                                   charged=latency_makespan(schedule, fw, bw, transfer),
                                   serial=pcosts.boundary_transfers(P, schedule.microbatches) * 2 * transfer,
                                   hops=critical_hops(schedule), idle=bubble.median_idle))
    checks = [close_check(f"M={p.microbatches}: measured step == prediction with messages free", p.step,
                          p.free_messages, HOP_ALLOWANCE * p.hops,
                          STEP_WHY.format(1e3 * HOP_ALLOWANCE, p.hops, OVERLAP_STEPS, 1e3 * p.transfer, 1e3 * p.slot))
              for p in points]
    if len(points) > 1:
        first, last = points[0], points[-1]
        gain = 1 - pcosts.bubble_fraction(P, last.microbatches) / pcosts.bubble_fraction(P, first.microbatches)
        checks.append(differ_check(f"M={first.microbatches} -> M={last.microbatches}: measured idle fraction falls",
                                   max(first.idle - last.idle, 0.0), 0.0, gain * first.idle / 2,   # a rise: 0
                                   "fill and drain are P-1 slots whatever M, and a slot shrinks as 1/M; at least "
                                   "half the formula's drop must show"))
    params = {"schedule": "1f1b", "batch_size": plans.cases[0][1].batch_size, "stage_ms": 1e3 * STAGE_SECONDS,
              "transfer/slot": [round(p.transfer / p.slot, 4) for p in points]}
    return Verdict(checks=checks, params=params, data=tuple(points))


OVERLAP_DEMO = Experiment(name="pp-overlap", chapter="05", world_sizes=(2, 4), spec=overlap_spec,
                          title="More microbatches, same batch: step time vs M, transfer time beside the slot",
                          ranks=overlap_rank, compare=compare_overlap)

DEMOS = [WAITS_DEMO, OVERLAP_DEMO]
