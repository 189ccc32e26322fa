"""The bubble-fraction panel's model (pure): one schedule in ideal time, both bubble conventions, and their curves.

Two conventions measure the same idle time against different totals:

    f = idle rank-time / whole schedule       (P-1)/(M+P-1)  GPipe's analysis, the seed's form
    r = idle rank-time / ideal (busy) time    (P-1)/M        Megatron-LM 2021; (P-1)/(vM) interleaved

and f = r/(1+r). Both assume balanced stages and free communication. With
"unequal" on, the second stage does twice the work of the others: the ideal-
time simulator then gives the idle fraction, which tends to 1 - mean/max of
the ranks' work per microbatch as M grows, not to 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from wmdist.costs import pipeline as pcosts
from wmdist.costs.pipeline import (
    ScheduleName,
    _from_ratio_unchecked,
    _over_ideal_unchecked,
    _peaks_unchecked,
    _transfers_unchecked,
)
from wmdist.costs.validate import require_bool, require_choice, require_fields
from wmdist.base.knobs import knob
from wmdist.pipeline.plan import slow_stage_work
from wmdist.pipeline.schedules import Schedule, _schedule_unchecked, make_schedule
from wmdist.pipeline.simulate import SimResult, _simulate_unchecked

SCHEDULE_OPTIONS = (("GPipe", "gpipe"), ("1F1B", "1f1b"), ("interleaved 1F1B", "interleaved"))
CURVE_MAX_M = 32


@dataclass(frozen=True, kw_only=True)
class BubbleConfig:
    """What the panel's controls set: schedule, P, M, v, and balanced or unequal stages."""
    schedule: ScheduleName = knob("gpipe", "schedule", options=SCHEDULE_OPTIONS)
    stages: int = knob(4, "P: stages (ranks)", low=1, high=8)
    microbatches: int = knob(8, "M: microbatches", low=1, high=CURVE_MAX_M)
    chunks: int = knob(1, "v: chunks per rank", low=1, high=4)
    unequal: bool = knob(False, "unequal stages (stage 1 does 2x)")
    built_schedule: Schedule = field(init=False, repr=False, compare=False)    # made once, here

    def __post_init__(self) -> None:
        """Every check of the panel's path, here once: the fields, then make_schedule's (P, M, v bounded, their
        product, v = 1 unless interleaved, M a multiple of P for it), which builds the schedule. Below this
        the model uses costs.pipeline's and the simulator's unchecked cores on these checked values."""
        require_choice("schedule", self.schedule, [v for _, v in SCHEDULE_OPTIONS])
        require_bool("unequal", self.unequal)
        require_fields(self, ("stages", "microbatches", "chunks"), 1)
        object.__setattr__(self, "built_schedule",
                           make_schedule(self.schedule, self.stages, self.microbatches, chunks=self.chunks))

    @property
    def stage_work(self) -> tuple[float, ...]:
        """Forward time of each virtual stage in slots (a backward takes twice as long)."""
        n = self.stages * self.chunks
        return slow_stage_work(n) if self.unequal and n > 1 else (1.0,) * n


@dataclass(kw_only=True, frozen=True)
class BubbleCurve:
    """Idle fraction against M at fixed P (and v): simulated, and the balanced closed forms."""
    microbatches: tuple[int, ...]
    idle: tuple[float, ...]              # simulated whole-schedule idle fraction f
    over_ideal: tuple[float, ...]        # simulated r = idle / busy
    formula: tuple[float, ...]           # balanced (P-1)/(vM+P-1)
    limit: float                         # what f tends to as M grows: 0 balanced, 1 - mean/max unequal


@dataclass(kw_only=True, frozen=True)
class BubbleView:
    """Everything the panel shows for one config, computed without processes."""
    config: BubbleConfig
    schedule: Schedule
    sim: SimResult                       # the ideal slot diagram (forward 1 slot, backward 2, per unit of work)
    idle: float                          # simulated f
    over_ideal: float                    # simulated r
    formula_idle: float                  # balanced f: (P-1)/(vM+P-1)
    formula_over_ideal: float            # balanced r: (P-1)/(vM)
    peak: tuple[int, ...]                # activation sets held at once, per rank (simulated)
    peak_formula: tuple[int, ...]        # costs.pipeline.peak_activations_in_flight, per rank
    transfers: int                       # boundary transfers per step, each way: M(Pv-1)
    curve: BubbleCurve


def _times(config: BubbleConfig) -> tuple[tuple[Fraction, ...], tuple[Fraction, ...]]:
    forward = tuple(Fraction(w).limit_denominator(1000) for w in config.stage_work)
    return forward, tuple(2 * f for f in forward)


def limit_idle(config: BubbleConfig) -> float:
    """Idle fraction as M grows: 1 - mean/max of the ranks' work per microbatch (0 when balanced)."""
    p = config.stages
    per_rank = [sum(config.stage_work[s] for s in range(r, p * config.chunks, p)) for r in range(p)]
    return 1.0 - sum(per_rank) / (p * max(per_rank))


def curve_points(config: BubbleConfig) -> tuple[int, ...]:
    """The M values of the curve, always including M: doublings up to 32 (multiples of P for interleaved)."""
    p = config.stages
    step = p if config.schedule == "interleaved" else 1
    points, m = set(), step
    while m <= max(CURVE_MAX_M, step):
        points.add(m)
        m *= 2
    return tuple(sorted(points | {config.microbatches}))


def bubble_curve(config: BubbleConfig, *, cache: dict | None = None) -> BubbleCurve:
    """Idle fractions over curve_points(config): closed forms where they are exact, else the simulator.

    Balanced stages: f = r/(1+r) with r = (P-1)/(vM), exactly what the
    simulator gives (tests/test_pipeline_schedules.py). Unequal GPipe: the
    fill-drain time of the forwards plus that of the backwards, also exact.
    Unequal 1F1B and interleaved: simulated, and kept in `cache` (a dict the
    caller owns, e.g. a panel) so that moving the M slider simulates one new
    point, not the whole curve again.
    """
    forward, backward = _times(config)
    ms, idle, ratio, formula = curve_points(config), [], [], []
    p, v = config.stages, config.chunks
    memo = {} if cache is None else cache
    for m in ms:                 # every m is within the config's checked bounds (see curve_points)
        balanced_r = _over_ideal_unchecked(p, m, v)
        balanced_f = _from_ratio_unchecked(balanced_r)
        if not config.unequal:
            f, r = balanced_f, balanced_r
        elif config.schedule == "gpipe":
            makespan = pcosts.fill_drain_time(forward, m) + pcosts.fill_drain_time(backward, m)
            busy = m * float(sum(forward) + sum(backward))
            f, r = 1 - busy / (p * makespan), (p * makespan - busy) / busy
        else:
            key = (config.schedule, p, m, v, config.stage_work)
            if key not in memo:
                sim = _simulate_unchecked(_schedule_unchecked(config.schedule, p, m, v), forward, backward)
                memo[key] = (float(sim.idle_fraction), float(sim.bubble_over_ideal))
            f, r = memo[key]
        idle.append(f)
        ratio.append(r)
        formula.append(balanced_f)
    return BubbleCurve(microbatches=ms, idle=tuple(idle), over_ideal=tuple(ratio), formula=tuple(formula), limit=limit_idle(config))


def bubble_view(config: BubbleConfig, *, cache: dict | None = None) -> BubbleView:
    """The panel's model: simulate the selected schedule and compute both conventions, peaks and the curve.

    `config` is checked (BubbleConfig refuses what cannot be built), so the simulator and the closed
    forms run unchecked: their public faces would only check the same P, M and v again."""
    p, m, v = config.stages, config.microbatches, config.chunks
    schedule = config.built_schedule
    sim = _simulate_unchecked(schedule, *_times(config))
    idle, over_ideal = float(sim.idle_fraction), float(sim.bubble_over_ideal)
    ratio = _over_ideal_unchecked(p, m, v)
    formula_idle = _from_ratio_unchecked(ratio)
    peak_formula = _peaks_unchecked(config.schedule, p, m, v)
    transfers = _transfers_unchecked(p, m, v)
    return BubbleView(config=config, schedule=schedule, sim=sim, idle=idle, over_ideal=over_ideal,
                      formula_idle=formula_idle, formula_over_ideal=ratio, peak=sim.peak_in_flight,
                      peak_formula=peak_formula, transfers=transfers, curve=bubble_curve(config, cache=cache))
