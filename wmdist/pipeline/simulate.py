"""Ideal-time run of a pipeline schedule: when each action starts and ends, and what that costs.

"Ideal" means compute only: a message arrives the instant its producer
finishes, and sends never block. An action starts when (a) the previous
action in its rank's list has finished and (b) its inputs exist:

    forward  of (stage s, microbatch m) needs the forward of (s-1, m)
    backward of (stage s, microbatch m) needs the forward of (s, m)
                                    and the backward of (s+1, m) unless s is the last stage

Times are exact Fractions (durations given as ints, Fractions or floats are
converted without rounding), so idle fractions can be compared with the
closed forms in wmdist.costs.pipeline by ==. Durations are in slot units:
by default a forward takes 1 and a backward 2 on every virtual stage; give a
sequence per virtual stage to model imbalance.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

from wmdist.costs.validate import require_int, require_positive
from wmdist.pipeline.schedules import BACKWARD, FORWARD, Action, Schedule, format_token
from wmdist.base.spans import Span


class ScheduleDeadlock(RuntimeError):
    """The per-rank orders can never complete: every unfinished rank waits on an action that cannot run."""


@dataclass(frozen=True)
class Timing:
    """When one action ran in the ideal-time run."""
    rank: int
    action: Action
    start: Fraction
    end: Fraction


@dataclass(kw_only=True, frozen=True)
class SimResult:
    """Everything the ideal-time run measured, per rank and overall."""
    timings: tuple[tuple[Timing, ...], ...]                     # timings[r]: rank r's actions, in order
    makespan: Fraction                                          # end of the last action
    busy: tuple[Fraction, ...]                                  # busy[r]: summed durations on rank r
    in_flight: tuple[tuple[tuple[Fraction, int], ...], ...]     # in_flight[r]: (time, count from then on)
    peak_in_flight: tuple[int, ...]                             # peak_in_flight[r]: max count on rank r

    @property
    def idle_fraction(self) -> Fraction:
        """Share of all rank-time spent idle: 1 - sum(busy) / (P * makespan); the (P-1)/(M+P-1) convention."""
        return 1 - sum(self.busy) / (len(self.busy) * self.makespan)

    @property
    def bubble_over_ideal(self) -> Fraction:
        """Idle rank-time over busy rank-time: the Megatron-LM (p-1)/m convention."""
        total = sum(self.busy)
        return (len(self.busy) * self.makespan - total) / total


def _per_stage(name: str, value: Real | Sequence[Real], count: int) -> tuple[Fraction, ...]:
    """One exact duration per virtual stage from a number or a sequence of `count` numbers."""
    values = [value] * count if isinstance(value, Real) else list(value)
    if len(values) != count:
        raise ValueError(f"{name} must be a number or one number per virtual stage ({count}), got {len(values)}")
    for i, v in enumerate(values):
        require_positive(f"{name}[{i}]", v)
    return tuple(Fraction(v) for v in values)


def _needs(action: Action, last_stage: int) -> list[tuple[str, int, int]]:
    """The (kind, stage, microbatch) keys that must have finished before `action` can start."""
    s, m = action.stage, action.microbatch
    if action.kind == FORWARD:
        return [(FORWARD, s - 1, m)] if s > 0 else []
    return [(FORWARD, s, m)] + ([(BACKWARD, s + 1, m)] if s < last_stage else [])


def simulate(schedule: Schedule, *, forward: Real | Sequence[Real] = 1,
             backward: Real | Sequence[Real] = 2) -> SimResult:
    """Run `schedule` in ideal time; `forward` / `backward` are slot durations (one value, or one per virtual stage).

    Raises ScheduleDeadlock naming each stuck rank, the action it waits at,
    and the inputs that never arrive, when the orders cannot complete.
    """
    n_virtual = schedule.virtual_stages
    return _simulate_unchecked(schedule, _per_stage("forward", forward, n_virtual),
                               _per_stage("backward", backward, n_virtual))


def _simulate_unchecked(schedule: Schedule, forward: tuple[Fraction, ...], backward: tuple[Fraction, ...]) -> SimResult:
    """simulate's run for durations already checked: one exact positive Fraction per virtual stage each way
    (what simulate makes of its arguments, or a config's stage work, e.g. pipeline.bubble's)."""
    n_virtual = len(forward)
    durations = {FORWARD: forward, BACKWARD: backward}
    ranks = schedule.ranks
    ends: dict[tuple[str, int, int], Fraction] = {}
    placed: list[list[Timing]] = [[] for _ in ranks]
    position = [0] * len(ranks)
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(ranks):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                needs = _needs(action, n_virtual - 1)
                if any(key not in ends for key in needs):
                    break
                free = placed[rank][-1].end if placed[rank] else Fraction(0)
                start = max([free] + [ends[key] for key in needs])
                end = start + durations[action.kind][action.stage]
                ends[(action.kind, action.stage, action.microbatch)] = end
                placed[rank].append(Timing(rank, action, start, end))
                position[rank] += 1
                progress = True
    stuck = [r for r, actions in enumerate(ranks) if position[r] < len(actions)]
    if stuck:
        raise ScheduleDeadlock(_deadlock_message(schedule, stuck, position, ends))
    timings = tuple(tuple(t) for t in placed)
    in_flight = tuple(_in_flight(t) for t in timings)
    return SimResult(timings=timings,
                     makespan=max(t[-1].end for t in timings if t),
                     busy=tuple(sum((x.end - x.start for x in t), Fraction(0)) for t in timings),
                     in_flight=in_flight,
                     peak_in_flight=tuple(max(count for _, count in steps) for steps in in_flight))


def _deadlock_message(schedule: Schedule, stuck: list[int], position: list[int],
                      ends: dict[tuple[str, int, int], Fraction]) -> str:
    """Name every stuck rank, the action it waits at, and which inputs have not run."""
    lines = []
    for rank in stuck:
        action = schedule.ranks[rank][position[rank]]
        missing = [str(Action(k, m, s)) for k, s, m in _needs(action, schedule.virtual_stages - 1)
                   if (k, s, m) not in ends]
        lines.append(f"rank {rank} waits at {action} (action {position[rank]} of its list) "
                     f"for {', '.join(missing)}, which cannot run")
    return f"schedule {schedule.name!r} deadlocks: " + "; ".join(lines)


def _in_flight(timings: Sequence[Timing]) -> tuple[tuple[Fraction, int], ...]:
    """Step function of stored activations on one rank: +1 when a forward starts, -1 when its backward ends.

    A forward keeps its microbatch's activations on that (virtual) stage
    until the matching backward has used them; the interval is [F start,
    B end). At equal times a release is counted before a new allocation.
    """
    events = sorted([(t.start, 1) for t in timings if t.action.kind == FORWARD]
                    + [(t.end, -1) for t in timings if t.action.kind == BACKWARD])
    steps: list[tuple[Fraction, int]] = [(Fraction(0), 0)]
    count = 0
    for time, delta in events:
        count += delta
        if steps[-1][0] == time:
            steps[-1] = (time, count)
        else:
            steps.append((time, count))
    return tuple(steps)


def spans(schedule: Schedule, result: SimResult) -> list[Span]:
    """The run as wmdist.base.spans.Span rows (kind "forward" / "backward", label the token), for timeline plots."""
    with_stage = schedule.chunks > 1
    return [Span(row=t.rank, start=float(t.start), end=float(t.end), kind="forward" if t.action.kind == FORWARD else "backward",
                 label=format_token(t.action, with_stage=with_stage)) for rank in result.timings for t in rank]


def gantt_text(schedule: Schedule, result: SimResult, *, max_cells: int = 240) -> str:
    """One text line per rank, one cell per slot: the token where an action starts, "-" while it runs, "." idle.

    The slot is the largest time unit that divides every start and end, so
    default durations (1 and 2) give one cell per forward. e.g. for
    gpipe(2, 2):  "rank 0 | F0 F1 .. .. .. B0 -- B1 --".
    """
    cap = require_int("max_cells", max_cells, 1)
    times = [x for rank in result.timings for t in rank for x in (t.start, t.end)]
    slot = Fraction(math.gcd(*(x.numerator for x in times)), math.lcm(*(x.denominator for x in times)))
    cells = int(result.makespan / slot)
    if cells > cap:
        raise ValueError(f"max_cells: this run needs {cells} cells of {slot} slot units (over {cap}); "
                         f"use durations that are multiples of a coarser unit, or raise max_cells")
    with_stage = schedule.chunks > 1
    width = max(len(format_token(t.action, with_stage=with_stage)) for rank in result.timings for t in rank)
    lines = []
    for rank, timings in enumerate(result.timings):
        row = ["." * width] * cells
        for t in timings:
            first, last = int(t.start / slot), int(t.end / slot)
            row[first] = format_token(t.action, with_stage=with_stage).ljust(width)
            row[first + 1:last] = ["-" * width] * (last - first - 1)
        lines.append(f"rank {rank} | " + " ".join(row))
    return "\n".join(lines)
