"""The bubble measured: timed pipeline steps on real ranks, their timelines, and the idle fraction vs prediction.

Each action sleeps a fixed time proportional to its stage's work (PipeWork
slot_seconds, stage_work), so the stage times are known and the machine's
load barely matters: sleeping ranks do not compete for the cores. The idle
fraction of a step is the rank-time not covered by any action,
1 - sum(busy) / (P * makespan), on time.monotonic() (one clock for all local
ranks), from the step's first action to its last; it is what (P-1)/(M+P-1)
predicts for balanced stages. The ideal-time prediction for the same stage
times comes from the simulator (wmdist.pipeline.simulate), which charges
nothing for messages: whatever a run measures above it is message latency,
late wake-ups and Python overhead.

The demos are `Experiment`s on chapter 05's `Plans`: all timed steps of all
cases run in one call (`work.repeats` steps each, the ranks lined up before
every step). The bubble panel's run (and `measure_bubble`) is widget_run.py's Experiment.
"""
from __future__ import annotations

from fractions import Fraction

from wmdist.costs import pipeline as pcosts
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.spec import Plans, StageRuns, by_case, plans_rank
from wmdist.pipeline.plan import PipeWork, require_stage_ranks, slow_stage_work
from wmdist.pipeline.results import ImbalanceCurve, MeasuredBubble   # noqa: F401 - re-exported: the records live there
from wmdist.pipeline.schedules import MAX_MICROBATCHES, Schedule, make_schedule
from wmdist.pipeline.simulate import simulate, spans
from wmdist.course.report import Report, close_check, differ_check
from wmdist.base.spans import Span


def idle_fraction(timeline: tuple[Span, ...] | list[Span], ranks: int) -> float:
    """1 - (summed span time) / (ranks * makespan), the makespan running from the first start to the last end."""
    makespan = max(s.end for s in timeline) - min(s.start for s in timeline)
    return 1.0 - sum(s.duration for s in timeline) / (ranks * makespan)


def from_zero(timeline: list[Span]) -> tuple[Span, ...]:
    """The spans shifted so that the step's first action starts at 0."""
    zero = min(s.start for s in timeline)
    return tuple(Span(row=s.row, start=s.start - zero, end=s.end - zero, kind=s.kind, label=s.label) for s in timeline)


def ideal_timeline(schedule: Schedule, work: PipeWork) -> tuple[Span, ...]:
    """Ideal-time spans (seconds) when a forward of stage s takes stage_work[s] * slot and a backward twice that.

    Forward only (v = 1), every stage runs its forwards in microbatch order,
    so forward (s, m) starts when both (s-1, m) and (s, m-1) have ended: the
    fill-drain line of the text's basic schedule.
    """
    slot = Fraction(work.slot_seconds).limit_denominator(10**6)
    times = [Fraction(w).limit_denominator(1000) * slot for w in work.work(schedule.virtual_stages)]
    if not work.forward_only:
        return tuple(spans(schedule, simulate(schedule, forward=times, backward=[2 * t for t in times])))
    if schedule.chunks > 1:
        raise ValueError("forward-only timing covers v = 1 schedules (the text's basic forward pipeline)")
    end: dict[tuple[int, int], Fraction] = {}
    out = []
    for m in range(schedule.microbatches):
        for s in range(schedule.stages):
            start = max(end.get((s - 1, m), Fraction(0)), end.get((s, m - 1), Fraction(0)))
            end[(s, m)] = start + times[s]
            out.append(Span(row=s, start=float(start), end=float(end[(s, m)]), kind="forward", label=f"F{m}"))
    return tuple(out)


def check_timed(schedule: Schedule, work: PipeWork) -> Schedule:
    """Refuse, before any process starts, what cannot be timed: a bad plan, or no fixed sleep to measure."""
    require_stage_ranks(schedule.stages, schedule)
    work.check(schedule)
    if work.slot_seconds <= 0:
        raise ValueError("slot_seconds must be > 0 to measure a bubble: the fixed sleep is the stages' work")
    ideal_timeline(schedule, work)                     # refuses what it cannot predict
    return schedule


def timed(schedule: Schedule, work: PipeWork, steps: list[tuple[Span, ...]]) -> MeasuredBubble:
    """The MeasuredBubble of timed steps (each: all ranks' spans), next to the ideal-time prediction."""
    ideal = ideal_timeline(schedule, work)
    timelines = tuple(from_zero(list(t)) for t in steps)
    idle = tuple(idle_fraction(t, schedule.stages) for t in timelines)
    return MeasuredBubble(schedule=schedule, work=work, timelines=timelines, idle=idle, ideal=ideal, predicted=idle_fraction(ideal, schedule.stages))


def measured(plans: Plans, results: list[StageRuns]) -> list[MeasuredBubble]:
    """Each case's timed steps, from every rank's StageRun (one span list per step)."""
    out = []
    for (schedule, work), runs in zip(plans.cases, by_case(results), strict=True):
        out.append(timed(schedule, work, [tuple(s for r in runs for s in r.spans[k]) for k in range(work.repeats)]))
    return out


# --- demos -------------------------------------------------------------------------------------------

SLOT_SECONDS = 0.05        # a forward's sleep: ms-scale message latency on a loaded machine stays small beside it
IMBALANCE_SLOT = 0.02      # shorter, so that M = 32 with a slow stage fits in a few seconds
ALLOWANCE = 0.05           # measured idle fraction vs ideal time (see the reasons below)
WHY = ("the ideal time charges nothing for messages; here each hop costs ~0.1-5 ms of latency and late "
       "wake-ups on a loaded machine, against slots of {:g} ms (median of 3 steps)")


SMALL_M = 1      # (P-1)/P vs (P-1)/(P+1): they differ by (P-1)/(P(P+1)) >= 0.097 for 2 <= P <= 8, ~2x ALLOWANCE


def off_by_one_gap(stages: int, microbatches: int) -> float:
    """(P-1)/(M+P-1) - (P-1)/(M+P) = (P-1)/((M+P-1)(M+P)): what the measured check must be able to tell apart."""
    return (stages - 1) / ((microbatches + stages - 1) * (microbatches + stages))


def bubble_spec(world_size: int, *, microbatches: int | None = None) -> Plans:
    """The balanced forward pipeline on P = `world_size` ranks at M (default 2P), and at M = SMALL_M for P > 1.

    At M = 2P the formula and the off-by-one (P-1)/(M+P) differ by less than
    the allowance, so for P > 1 a second case at M = SMALL_M, where they differ
    by about twice the allowance, shows that the measurement tells them apart.
    """
    m = 2 * require_int("world_size", world_size, 1) if microbatches is None else \
        require_int("microbatches", microbatches, 1, high=MAX_MICROBATCHES)      # 0 is refused, not the default
    sizes = [m] + ([SMALL_M] if world_size > 1 and m != SMALL_M else [])
    cases = []
    for k in sizes:
        work = PipeWork(batch_size=k, forward_only=True, slot_seconds=SLOT_SECONDS, repeats=3)
        cases.append((check_timed(make_schedule("gpipe", world_size, k), work), work))
    return Plans(world_size=world_size, cases=tuple(cases))


def bubble_verdict(plans: Plans, runs: list[MeasuredBubble]) -> Verdict:
    """The measured idle fractions against (P-1)/(M+P-1), at M and (for P > 1) at SMALL_M."""
    P, m = plans.world_size, plans.cases[0][0].microbatches
    formula = pcosts.bubble_fraction(P, m)
    checks = [close_check("measured idle fraction == (P-1)/(M+P-1)", runs[0].median_idle, formula, ALLOWANCE,
                          WHY.format(1e3 * SLOT_SECONDS))]
    if len(runs) > 1:
        gap = off_by_one_gap(P, SMALL_M)
        checks.append(close_check(f"M={SMALL_M}: measured idle fraction == (P-1)/(M+P-1)", runs[1].median_idle,
                                  pcosts.bubble_fraction(P, SMALL_M), ALLOWANCE,
                                  WHY.format(1e3 * SLOT_SECONDS) + f"; (P-1)/(M+P) would miss by {gap:.3f}"))
    params = {"schedule": "gpipe (forwards only)", "microbatches": m, "slot_ms": 1e3 * SLOT_SECONDS,
              "formula": formula}
    return Verdict(checks=checks, params=params, data=runs[0])


def compare_bubble(plans: Plans, results: list[StageRuns]) -> Verdict:
    """bubble_verdict of what the ranks timed."""
    return bubble_verdict(plans, measured(plans, results))


BUBBLE_DEMO = Experiment(name="pp-bubble", chapter="05", world_sizes=(1, 2, 4), spec=bubble_spec,
                         title="Measured bubble of a balanced forward pipeline vs (P-1)/(M+P-1)",
                         ranks=plans_rank, compare=compare_bubble)


def bubble_demo(world_size: int, *, microbatches: int | None = None) -> Report:
    """The text's balanced forward pipeline, timed: measured idle fraction vs (P-1)/(M+P-1), M = 2P by default."""
    return BUBBLE_DEMO.run_spec(bubble_spec(world_size, microbatches=microbatches))


def imbalance_spec(world_size: int, *, microbatches: tuple[int, ...] = (4, 16, 32)) -> Plans:
    """Forwards only on P = `world_size` >= 2 ranks, stage 1 twice as slow, one case per M."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2: imbalance needs two stages, got {world_size}")
    if not microbatches:
        raise ValueError("microbatches must name at least one M to time")
    work = slow_stage_work(world_size)
    cases = []
    for m in microbatches:
        spec = PipeWork(batch_size=m, forward_only=True, slot_seconds=IMBALANCE_SLOT, stage_work=work, repeats=3)
        cases.append((check_timed(make_schedule("gpipe", world_size, m), spec), spec))
    return Plans(world_size=world_size, cases=tuple(cases))


def compare_imbalance(plans: Plans, results: list[StageRuns]) -> Verdict:
    """Each M's measured idle against the ideal time with the slow stage; the largest M against the balanced
    formula, which it must NOT match."""
    P, work = plans.world_size, plans.cases[0][1].stage_work
    microbatches = tuple(s.microbatches for s, _ in plans.cases)
    runs = tuple(measured(plans, results))
    limit = 1 - sum(work) / (P * max(work))
    curve = ImbalanceCurve(microbatches=microbatches, measured=tuple(r.median_idle for r in runs), predicted=tuple(r.predicted for r in runs),
                           balanced=tuple(pcosts.bubble_fraction(P, m) for m in microbatches), limit=limit, runs=runs)
    checks = [close_check(f"M={m}: measured idle == ideal time with the slow stage", got, want, ALLOWANCE,
                          WHY.format(1e3 * IMBALANCE_SLOT))
              for m, got, want in zip(microbatches, curve.measured, curve.predicted)]
    checks.append(differ_check(f"M={microbatches[-1]}: measured idle is NOT the balanced (P-1)/(M+P-1)",
                               curve.measured[-1], curve.balanced[-1], 2 * ALLOWANCE,
                               "the slow stage sets the pace; more microbatches only amortize fill and drain"))
    return Verdict(checks=checks, params={"stage_work": work, "microbatches": list(microbatches), "limit": limit},
                   data=curve)


IMBALANCE_DEMO = Experiment(name="pp-imbalance", chapter="05", world_sizes=(2, 4), spec=imbalance_spec,
                            title="One slow stage: idle fraction vs M levels off above zero",
                            ranks=plans_rank, compare=compare_imbalance)


def imbalance_demo(world_size: int, *, microbatches: tuple[int, ...] = (4, 16, 32)) -> Report:
    """Stage 1 does twice the work: the idle fraction levels off at 1 - mean/max, whatever M (forwards only)."""
    return IMBALANCE_DEMO.run_spec(imbalance_spec(world_size, microbatches=microbatches))


DEMOS = [BUBBLE_DEMO, IMBALANCE_DEMO]
