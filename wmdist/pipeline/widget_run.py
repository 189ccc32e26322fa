"""The bubble panel's "run it" as an Experiment: the selected schedule's timed training steps on P ranks.

One call runs every timed step (pipeline_rank repeats them); the Report's counts are each rank's
boundary transfers and bytes in each direction against what the schedule implies
(demos.boundary_counts), and its data is the MeasuredBubble the panel draws. The measured idle
fraction is shown beside the ideal-time prediction, not checked: on a shared machine the panel's
short slots (down to 5 ms) sit close to message latency, and a panel must not call a slow
machine a failure. The registered pp-bubble demo checks the idle fraction, with slots it can trust.
"""
from __future__ import annotations

from wmdist.course.experiment import Experiment, Verdict
from wmdist.base.on_progress import OnProgress
from wmdist.pipeline.demos import boundary_counts
from wmdist.pipeline.measure import check_timed, measured
from wmdist.pipeline.plan import PipeWork
from wmdist.pipeline.results import MeasuredBubble
from wmdist.pipeline.schedules import Schedule, make_schedule
from wmdist.pipeline.spec import Plans, StageRuns, by_case, plans_rank
from wmdist.course.report import Report


def widget_plans(schedule: Schedule, work: PipeWork) -> Plans:
    """The one case "run it" times, checked before any process starts."""
    return Plans(world_size=schedule.stages, cases=((check_timed(schedule, work), work),))


def compare_widget(plans: Plans, results: list[StageRuns]) -> Verdict:
    """Boundary transfers and bytes per rank against the schedule (exact); the timed steps as data."""
    (schedule, work), runs = plans.cases[0], by_case(results)[0]
    bubble = measured(plans, results)[0]
    return Verdict(checks=[], exact=boundary_counts(schedule, runs, work, schedule.name),
                   params={"schedule": schedule.name, "microbatches": schedule.microbatches,
                           "chunks": schedule.chunks, "slot_ms": 1e3 * work.slot_seconds,
                           "measured_idle": bubble.median_idle, "ideal_idle": bubble.predicted},
                   data=bubble)


PIPELINE_WIDGET = Experiment(
    name="pipeline (widget)", title="the bubble panel's schedule, timed on P local ranks", chapter="05",
    world_sizes=(2, 4),
    spec=lambda n: widget_plans(make_schedule("1f1b", n, 2 * n), PipeWork(batch_size=2 * n, slot_seconds=0.005,
                                                                          repeats=2)),
    ranks=plans_rank, compare=compare_widget)


def run_widget(schedule: Schedule, work: PipeWork, *, progress: OnProgress | None = None) -> Report:
    """Time `work.repeats` training steps of `schedule` on its P ranks: the Report, its data the MeasuredBubble."""
    return PIPELINE_WIDGET.run_spec(widget_plans(schedule, work), progress=progress)


def measure_bubble(schedule: Schedule, work: PipeWork, *, progress: OnProgress | None = None) -> MeasuredBubble:
    """`work.repeats` timed training steps of `schedule` on its P ranks; RuntimeError if a boundary count is off."""
    report = run_widget(schedule, work, progress=progress)
    if not report.passed:
        raise RuntimeError(f"the timed pipeline's boundary counts differ from the schedule's:\n{report}")
    return report.data
