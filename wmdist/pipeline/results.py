"""What chapter 05's timed runs hand back (pure records): the figures read these and never start a run."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from wmdist.pipeline.plan import PipeWork
from wmdist.pipeline.schedules import Schedule
from wmdist.base.spans import Span


@dataclass(kw_only=True, frozen=True)
class MeasuredBubble:
    """Timed steps of one schedule on P ranks: every step's spans, idle fractions, and the ideal-time prediction."""
    schedule: Schedule
    work: PipeWork
    # timelines[k]: all ranks' action spans of step k, seconds from its start
    timelines: tuple[tuple[Span, ...], ...]
    idle: tuple[float, ...]                     # idle[k]: 1 - busy / (P * makespan) of step k
    ideal: tuple[Span, ...]                     # the ideal-time timeline for the same stage times (seconds)
    predicted: float                            # its idle fraction

    @property
    def median_idle(self) -> float:
        """The median idle fraction over the timed steps (robust to one step disturbed by the machine)."""
        return statistics.median(self.idle)

    @property
    def median_timeline(self) -> tuple[Span, ...]:
        """The spans of the step whose idle fraction is the median (for a Gantt chart)."""
        k = sorted(range(len(self.idle)), key=lambda i: self.idle[i])[(len(self.idle) - 1) // 2]
        return self.timelines[k]


@dataclass(kw_only=True, frozen=True)
class ImbalanceCurve:
    """Idle fraction against M with one stage twice as slow: measured, ideal time, balanced formula."""
    microbatches: tuple[int, ...]
    measured: tuple[float, ...]                  # median of 3 timed steps each
    predicted: tuple[float, ...]                 # ideal time with the same (unequal) stage times
    balanced: tuple[float, ...]                  # (P-1)/(M+P-1)
    limit: float                                 # 1 - mean/max stage time: where the idle fraction levels off
    runs: tuple[MeasuredBubble, ...]
