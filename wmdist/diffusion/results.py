"""What chapter 08's demos measured, as plain records: the data figures and notebooks read.

Kept apart from the demos that fill them, so a figure imports these and never a runner.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs import diffusion as dcost
from wmdist.diffusion.sampler import PicardResult
from wmdist.base.spans import Span


@dataclass(kw_only=True, frozen=True)
class PicardRun:
    """One Picard run on N ranks, next to the sequential sampler's K evaluations in K slots."""
    result: PicardResult                 # rank 0's (every rank holds the same trajectory, bitwise)
    steps: int                           # K
    world_size: int                      # N
    rounding_level: float                # running_sum_tolerance of the sequential trajectory
    first_at_rounding: int | None        # first round whose whole trajectory is within rounding_level

    @property
    def critical_path(self) -> int:
        """Evaluation slots on the busiest rank, summed over rounds: the sequential sampler needs K."""
        return dcost.picard_critical_path(self.result.evaluations, self.world_size)


@dataclass(kw_only=True, frozen=True)
class StepTimelines:
    """Per case (keys of CASES): every rank's spans from time 0, and what they add up to."""
    timelines: dict[str, list[Span]]
    elapsed: dict[str, float]          # first start to last end, seconds
    concurrency: dict[str, float]      # busy compute seconds / elapsed: ranks computing at once, on average
    ideal: dict[str, float]            # the same for the ideal schedule (sample-evaluations / slots)
    cross_rank_overlap: dict[str, float]   # seconds two different ranks computed at the same time, summed over pairs
