"""Where each pipeline stage waits: its idle time split into fill, in between, and drain (pure formulas).

Notation as in wmdist.costs.pipeline: P stages, M microbatches, stage s in
0..P-1; a forward of one microbatch on one stage takes t_F, a backward t_B,
equal on every stage; messages are free. Per stage:

    fill     the idle time before its first forward;
    drain    the idle time after its last action (forward-only: its last
             forward; training: its last backward);
    between  the rest of its idle time, inside its own busy stretch.

Forward only (the text's basic schedule): fill s*t_F, between 0, drain
(P-1-s)*t_F: the first microbatch crosses s stages before reaching stage s,
the last still has P-1-s to cross after it.

Training (GPipe and 1F1B alike): fill s*t_F, between (P-1-s)(t_F+t_B),
drain s*t_B. The backward sweep runs from the last stage to the first, so
stage s finishes s backwards before stage 0 does: the drain mirrors the fill
with t_B, it is NOT P-1-s. What lies between is the round trip from stage s
to the last stage and back. Each stage idles (P-1)(t_F+t_B) of a step of
(M+P-1)(t_F+t_B): the (P-1)/(M+P-1) of bubble_fraction, for any M >= 1.
tests/test_pipeline_overlap.py holds these to the simulator exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

from wmdist.costs.pipeline import ScheduleName
from wmdist.costs.validate import require_bool, require_choice, require_int, require_positive

TRAINING_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")      # the v = 1 schedules these formulas cover


@dataclass(frozen=True)
class StageWaits:
    """One stage's idle time in one step, in the units of t_F and t_B: before, inside and after its work."""
    fill: Fraction
    between: Fraction
    drain: Fraction

    @property
    def total(self) -> Fraction:
        """All of the stage's idle time in the step."""
        return self.fill + self.between + self.drain


def _time(name: str, value: Real) -> Fraction:
    """An exact duration (> 0) from an int, Fraction or float."""
    require_positive(name, value)
    return Fraction(value)


def stage_waits(schedule: ScheduleName, stages: int, microbatches: int, stage: int, *, t_forward: Real = 1,
                t_backward: Real = 2, forward_only: bool = False) -> StageWaits:
    """Fill, between and drain of stage `stage` in one ideal-time step (see the module docstring).

    e.g. training at P = 4, t_F = 1, t_B = 2: stage 1 waits 1 before its first
    forward, 6 in between and 2 after its last backward. `microbatches` does
    not enter (each stage idles the same whatever M is) but is validated, so a
    bad step is refused here too. Interleaved schedules are refused: their
    waits depend on v and are not these closed forms.
    """
    require_choice("schedule", schedule, TRAINING_SCHEDULES)
    p = require_int("stages", stages, 1)
    require_int("microbatches", microbatches, 1)
    s = require_int("stage", stage, 0, high=p - 1)
    tf, tb = _time("t_forward", t_forward), _time("t_backward", t_backward)
    if require_bool("forward_only", forward_only):
        return StageWaits(fill=s * tf, between=Fraction(0), drain=(p - 1 - s) * tf)
    return StageWaits(fill=s * tf, between=(p - 1 - s) * (tf + tb), drain=s * tb)


def step_time(stages: int, microbatches: int, *, t_forward: Real = 1, t_backward: Real = 2,
              forward_only: bool = False) -> Fraction:
    """Ideal-time length of one step: (M+P-1)(t_F+t_B) in training, (M+P-1) t_F forwards only."""
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    tf, tb = _time("t_forward", t_forward), _time("t_backward", t_backward)
    return (m + p - 1) * (tf if require_bool("forward_only", forward_only) else tf + tb)


def all_stage_waits(schedule: ScheduleName, stages: int, microbatches: int, *, t_forward: Real = 1,
                    t_backward: Real = 2, forward_only: bool = False) -> tuple[StageWaits, ...]:
    """stage_waits for every stage 0..P-1, in stage order."""
    return tuple(stage_waits(schedule, stages, microbatches, s, t_forward=t_forward, t_backward=t_backward,
                             forward_only=forward_only) for s in range(require_int("stages", stages, 1)))
