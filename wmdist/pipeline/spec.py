"""What a chapter 05 demo runs, decided and checked before any process starts, and the rank function they share.

Every demo on real ranks (the forward pipeline, pipeline training, measured
bubbles, imbalance, torch's pipelining beside ours) is an `Experiment` on one
spec type, `Plans`: the (schedule, work) cases of a run on P ranks, each built
by `checked_schedule` (one ValueError for a bad input). `plans_rank` runs every
case on a rank in one call and returns `StageRuns`; `by_case` regroups the
ranks' results case by case.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.comm import Context
from wmdist.costs.pipeline import ScheduleName
from wmdist.pipeline.executor import StageRun, pipeline_rank
from wmdist.pipeline.plan import PipeWork, check_name, require_stage_ranks
from wmdist.pipeline.schedules import Schedule, make_schedule


def checked_schedule(world_size: int, name: ScheduleName, microbatches: int, chunks: int, work: PipeWork) -> Schedule:
    """Build and check everything a run needs; a bad input is one ValueError here, before any process starts."""
    schedule = make_schedule(check_name(name), world_size, microbatches, chunks=chunks)
    require_stage_ranks(world_size, schedule)
    work.check(schedule)
    return schedule


@dataclass(frozen=True, kw_only=True)
class Plans:
    """A pipeline experiment's spec: the (schedule, work) cases it runs, all on `world_size` = P ranks, checked."""
    world_size: int
    cases: tuple[tuple[Schedule, PipeWork], ...]


@dataclass(frozen=True)
class StageRuns:
    """What one rank measured in each case of a Plans, in the cases' order."""
    runs: tuple[StageRun, ...]


def plans_rank(ctx: Context, plans: Plans) -> StageRuns:
    """Rank function: every case's pipeline step on this rank, one after the other (each from a fresh ledger)."""
    return StageRuns(tuple(pipeline_rank(ctx, schedule, work) for schedule, work in plans.cases))


def by_case(results: list[StageRuns]) -> list[list[StageRun]]:
    """The ranks' results regrouped: for each case, every rank's StageRun in rank order."""
    return [list(runs) for runs in zip(*(r.runs for r in results), strict=True)]
