"""Chapter 05 on real ranks, the slower half: measured bubbles, torch's pipelining, rollout training.

Timing is made robust, not fast: every action's work is a fixed sleep (sleeping ranks do not compete for the
two cores), each figure is the median of 3 timed steps, and the allowance (0.05 of the schedule) is for what
the ideal-time formula leaves out, message latency and late wake-ups, a few ms per hop against 20-50 ms slots.
The torch comparison imports torch.distributed.pipelining in every rank: about 2 s on an idle machine, 10-30 s
under load; each compare() after that takes about 1 s.
"""
from __future__ import annotations

import pytest

from wmdist.costs import pipeline as pcosts
from wmdist.pipeline import measure, rollout, versus_torch, widget_run
from wmdist.pipeline.plan import PipeWork
from wmdist.pipeline.schedules import make_schedule


def test_measured_idle_fraction_at_p4_m8_is_the_formula_within_noise():
    report = measure.bubble_demo(4, microbatches=8)
    run = report.data
    assert report.passed, report.failures
    assert abs(run.median_idle - pcosts.bubble_fraction(4, 8)) <= measure.ALLOWANCE          # 3/11 = 0.273
    assert run.predicted == pytest.approx(3 / 11, abs=1e-12)                                 # ideal time: exact
    for timeline in run.timelines:
        assert sorted((s.row, s.label) for s in timeline) == sorted((r, f"F{m}") for r in range(4) for m in range(8))
        assert min(s.duration for s in timeline) >= measure.SLOT_SECONDS                    # the sleep is in it
    assert run.median_idle >= run.predicted - measure.ALLOWANCE / 5                         # noise adds idle time


def test_one_slow_stage_leaves_idle_time_that_microbatches_do_not_remove():
    report = measure.imbalance_demo(2, microbatches=(2, 16))
    curve = report.data
    assert report.passed, report.failures
    assert curve.limit == pytest.approx(0.25)                    # work (1, 2): 1 - mean/max
    assert curve.predicted[1] > curve.limit and curve.balanced[1] == pytest.approx(1 / 17)
    assert curve.measured[1] - curve.balanced[1] >= 2 * measure.ALLOWANCE
    from wmdist.pipeline.figures import imbalance_figure, measured_vs_ideal
    fig = imbalance_figure(curve)
    assert [len(line.get_xdata()) for line in fig.axes[0].lines][:3] == [32, 32, 2]    # two curves, 2 measurements
    assert [ax.get_title(loc="left").split(":")[0] for ax in measured_vs_ideal(curve.runs[0]).axes] == ["measured",
                                                                                           "ideal time (messages free)"]


def test_measure_refuses_bad_plans_before_starting_processes():
    with pytest.raises(ValueError, match="slot_seconds must be > 0"):
        widget_run.measure_bubble(make_schedule("gpipe", 2, 2), PipeWork())
    with pytest.raises(ValueError, match="imbalance needs two stages"):
        measure.imbalance_demo(1)
    with pytest.raises(ValueError, match="v = 1 schedules only|v = 1"):
        widget_run.measure_bubble(make_schedule("interleaved", 2, 2, chunks=2),
                               PipeWork(forward_only=True, slot_seconds=0.01))


# torch's own orders, recorded by running its schedules (forward_one_chunk / backward_one_chunk wrapped on
# each PipelineStage) on 2 CPU gloo ranks with M = 4; ours must be the same, action for action.
TORCH_ORDERS = {
    "gpipe": ("F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"),         # v = 1: one stage per rank, no prefix
    "1f1b": ("F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"),
    "interleaved": ("s0F0 s0F1 s2F0 s2F1 s0F2 s2B0 s0F3 s2B1 s2F2 s0B0 s2F3 s0B1 s2B2 s2B3 s0B2 s0B3",
                    "s1F0 s1F1 s3F0 s3B0 s3F1 s3B1 s1F2 s1B0 s1F3 s1B1 s3F2 s3B2 s3F3 s3B3 s1B2 s1B3"),
}


@pytest.mark.parametrize("name", list(TORCH_ORDERS))
def test_torch_pipelining_runs_the_same_order_and_gives_the_same_numbers(name):
    c = versus_torch.compare_with_torch(2, name, 4, chunks=2 if name == "interleaved" else 1)
    assert c.theirs == tuple(tuple(line.split()) for line in TORCH_ORDERS[name])          # what torch ran
    assert c.ours == c.theirs                                                             # what we ran
    schedule = make_schedule(name, 2, 4, chunks=2 if name == "interleaved" else 1)
    assert c.ours == schedule.tokens()                        # written as the schedule's JSON writes them
    assert c.loss_error == 0.0 and c.grad_error == 0.0        # same stages, same loss, same order: same bits


def test_torch_comparison_refuses_what_torch_cannot_do_alike():
    with pytest.raises(ValueError, match="multiple of microbatches"):
        versus_torch.compare_with_torch(2, "1f1b", 4, work=PipeWork(batch_size=6))
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        versus_torch.compare_with_torch(1, "gpipe", 2)
    with pytest.raises(ValueError, match="needs microbatches >= stages"):
        versus_torch.compare_with_torch(4, "1f1b", 2)


def test_rollout_one_loss_one_step_whole_trajectories():
    report = rollout.rollout_demo(2)
    assert report.passed, report.failures
    data = report.data
    assert data.microbatch_envs == ((0, 1), (2, 3), (4, 5), (6, 7))          # whole trajectories, in order
    assert data.param_error <= data.param_tolerance
    assert data.time_cut_gap > 1000 * data.param_tolerance and data.per_transition_gap > 100 * data.param_tolerance


def test_panel_run_it_executes_the_schedule_and_overlays_the_measurement():
    from wmdist.pipeline.bubble import BubbleConfig
    from wmdist.pipeline.panel import BubblePanel
    panel = BubblePanel(BubbleConfig(schedule="1f1b", stages=2, microbatches=4, unequal=True))
    seen = []
    progress = panel._report_progress
    panel._report_progress = lambda done, total, text: (seen.append((done, total)), progress(done, total, text))
    measured = panel.run()
    assert measured is panel.measured and measured.schedule == panel.result.schedule
    assert seen == [(0, 2), (1, 2), (2, 2)] and panel.progress.value == panel.progress.max == 2   # the run, the check
    assert "measured idle" in panel.status.value and len(measured.timelines) == 3
    assert panel.report.passed and panel.report.data is measured and "equal what the schedule implies" in panel.status.value
    assert sorted(s.label for s in measured.timelines[0] if s.row == 0) == sorted(f"{k}{m}" for k in "FB"
                                                                                    for m in range(4))
    assert "measured on 2 ranks" in " ".join(ax.get_title() + ax.get_title(loc="left") for ax in panel.shown.axes)
    panel.controls["microbatches"].value = 8                         # another schedule: the overlay goes
    assert "measured on" not in " ".join(ax.get_title() + ax.get_title(loc="left") for ax in panel.shown.axes)


def test_the_bubble_panels_run_is_an_experiment_whose_boundary_counts_equal_the_schedule():
    report = widget_run.PIPELINE_WIDGET.run(2)
    assert report.passed and report.name == "pipeline (widget)" and report.data.timelines
    quantities = {c.quantity for c in report.exact}
    assert {"activation sends", "gradient sends", "activation bytes sent", "gradient bytes received"} <= quantities
