"""BubblePanel: the bubble fraction live for any schedule, P, M and v, and the real pipeline on demand.

A thin view: sliders set a BubbleConfig (ranges declared next to its fields
in .bubble), compute() is the pure model .bubble.bubble_view (schedule
functions and the ideal-time simulator, no processes), the figure comes from
.figures. "Run it" executes the selected schedule on P local ranks (training
steps with a fixed sleep per action, .measure) and redraws with the measured
Gantt chart under the ideal one.
"""
from __future__ import annotations

from typing import Any

from wmdist.pipeline.bubble import BubbleConfig, BubbleView, bubble_view
from wmdist.pipeline.figures import draw_curve, draw_held, draw_measured, draw_slots
from wmdist.pipeline.measure import MeasuredBubble
from wmdist.pipeline.plan import PipeWork
from wmdist.pipeline.widget_run import run_widget
from wmdist.course.report import Report
from wmdist.ui.panel import Panel, View

RUN_REPEATS = 3
RUN_STEP_SECONDS = 1.0       # the longest ideal step "run it" asks for; slots shrink to fit, down to...
MIN_SLOT_SECONDS = 0.005     # ...5 ms, below which message latency would swamp the picture


def run_work(config: BubbleConfig, view: BubbleView) -> PipeWork:
    """The PipeWork "run it" uses: one trajectory per microbatch, the config's stage work, a slot that fits 1 s."""
    slot = max(MIN_SLOT_SECONDS, min(0.02, RUN_STEP_SECONDS / float(view.sim.makespan)))
    return PipeWork(batch_size=config.microbatches, slot_seconds=round(slot, 4),
                    stage_work=config.stage_work, repeats=RUN_REPEATS)


class BubblePanel(Panel):
    """Slot diagram, both bubble conventions, bubble vs M, activations in flight; "run it" measures on P ranks.

    `result` is the current BubbleView; `measured` the last MeasuredBubble (or None).
    """

    run_label = "Run it on P local ranks"
    measured_view = "measured"
    hint = ("move M from 8 to 32 and watch the gaps shrink; then pick 1F1B and compare the activations "
            "in flight; then tick <i>unequal stages</i>.")

    def __init__(self, config: BubbleConfig | None = None):
        self.report: Report | None = None   # the last run's Report: boundary transfers and bytes per rank, exact
        self.curves: dict = {}          # simulated curve points of this panel, so a slider move adds one
        super().__init__(config or BubbleConfig())
        self._only_interleaved_has_chunks()

    def _only_interleaved_has_chunks(self) -> None:
        """v applies to the interleaved schedule alone: greyed out (and back at 1) for GPipe and 1F1B."""
        v = self.controls["chunks"]
        v.disabled = self.controls["schedule"].value != "interleaved"
        if v.disabled and v.value != 1:
            with self.holding():
                v.value = 1

    def _changed(self, name: str, change: dict) -> None:
        if name == "schedule" and not self._holding:
            self._only_interleaved_has_chunks()
        super()._changed(name, change)

    def views(self) -> list[View]:
        return [View("slot diagram", lambda fig, c, r: draw_slots(fig, r)),
                View("measured", lambda fig, c, r: draw_measured(fig, r, self.measured)),
                View("bubble vs M", lambda fig, c, r: draw_curve(fig, r)),
                View("activations in flight", lambda fig, c, r: draw_held(fig, r))]

    def compute(self, config: BubbleConfig) -> BubbleView:
        return bubble_view(config, cache=self.curves)

    def describe(self, config: BubbleConfig, v: BubbleView) -> str:
        p, m, c = config.stages, config.microbatches, config.chunks
        vm, vsym = (f"{c}·{m}", "v") if c > 1 else (f"{m}", "")
        r = v.formula_over_ideal
        whole = (f"<b>whole schedule idle</b> f = (P-1)/({vsym}M+P-1) = {p - 1}/({vm}+{p - 1}) = "
                 f"<b>{v.formula_idle:.3f}</b> balanced; this schedule: {v.idle:.3f}")
        ideal = (f"<b>bubble over ideal time</b> r = (P-1)/({vsym}M) = {p - 1}/{vm} = <b>{r:.3f}</b>; "
                 f"r/(1+r) = {r / (1 + r):.3f} = f (this schedule: r = {v.over_ideal:.3f})")
        lines = [whole, ideal]
        if config.unequal:
            lines.append(f"stage 1 does twice the work: the slowest rank sets the pace, and as M grows the idle "
                         f"fraction tends to 1 - mean/max = <b>{v.curve.limit:.3f}</b>, not 0")
        return "<br>".join(lines)

    def details(self, config: BubbleConfig, v: BubbleView) -> str:
        p = config.stages
        return (f"Activation sets held at the peak, rank 0..{p - 1}: {list(v.peak)} (GPipe M, 1F1B min(P-r, M), "
                f"interleaved more: {config.schedule} here).<br>Boundary transfers per step: {v.transfers} "
                f"activations forward and {v.transfers} gradients back (M(P{'v' if config.chunks > 1 else ''}-1)); "
                "more microbatches mean more messages, not fewer.")

    def measure(self, config: BubbleConfig, progress: Any) -> MeasuredBubble:
        """Run the selected schedule on P local ranks (training steps, fixed sleep per action) and time it.

        What the config allows but a run cannot (P*v above the model's 8 blocks) is refused by run_widget's
        own check of the plan (measure.check_timed: PipeWork.check), before any process starts."""
        work = run_work(config, self.result)
        self.report = run_widget(self.result.schedule, work, progress=progress)
        measured = self.report.data
        bytes_said = (f"boundary transfers and bytes per rank equal what the schedule implies ({len(self.report.exact)} "
                      "counts)" if self.report.passed else self.report.listing(counts=True).splitlines()[-1])
        self._set_run_status(f"measured idle {measured.median_idle:.3f} of the schedule (median of {RUN_REPEATS} "
                             f"steps; ideal {measured.predicted:.3f}); slot {1e3 * work.slot_seconds:g} ms; "
                             + bytes_said)
        return measured
