"""ScalingPanel: the all-reduce scaling model T(N) live, and a fit to this machine on demand.

Its "algorithms" view sets the ring beside the tree, halving-doubling and direct exchange at the
same N, alpha and beta (rounds cost alpha, bytes cost beta): the trade chapter 01 measures.

A thin view over wmdist.data_parallel.scaling (pure model and fit) and
.measure (real ring all-reduces on local ranks): sliders set ScalingParams
(ranges declared next to its fields), the figure comes from .figures.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import ipywidgets as W
from wmdist.costs.units import seconds
from wmdist.data_parallel.allreduce_figures import draw_panel_tradeoff, panel_curves
from wmdist.data_parallel.figures import draw_allreduce, draw_efficiency, draw_fit, draw_speedup, draw_step
from wmdist.data_parallel.measure import DEFAULT_REPEATS, DEFAULT_SIZES_BYTES, DEFAULT_WORLD_SIZES, time_allreduce
from wmdist.data_parallel.scaling import Fit, ScalingCurve, ScalingParams, fit_alpha_beta, scaling_curve
from wmdist.ui.panel import Panel, View
from wmdist.ui.controls import CONTROL_WIDTH, LABEL_WIDTH
from wmdist.course.report import Report


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """'2, 4, 8' -> (2, 4, 8); a clear ValueError for anything else."""
    try:
        sizes = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"world sizes to measure must be integers separated by commas, got {text!r}") from None
    if not sizes or any(not 2 <= n <= 16 for n in sizes):
        raise ValueError(f"world sizes to measure must be integers from 2 to 16, got {text!r}")
    return sizes


class ScalingPanel(Panel):
    """Speedup and efficiency of data parallelism under T(N) = 2(N-1)α + 2(N-1)/N βG.

    `result` is the current ScalingCurve; `measured` the last Fit (or None).
    """

    run_label = "Measure on this machine"
    measured_view = "this machine (fit)"
    hint = ("raise α (latency per round) until the speedup curve bends down; then press <i>Measure</i> and "
            "<i>Use fitted α, β</i> to see this machine.")

    def __init__(self, params: ScalingParams | None = None, measure_world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                 measure_sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = DEFAULT_REPEATS):
        style, width = {"description_width": LABEL_WIDTH}, W.Layout(width=CONTROL_WIDTH)
        self.measure_sizes_bytes = tuple(measure_sizes_bytes)
        self.measure_sizes = W.Text(value=", ".join(map(str, measure_world_sizes)), description="N to measure",
                                    style=style, layout=width)
        self.repeats = W.IntSlider(value=repeats, min=1, max=9, description="repeats", style=style, layout=width)
        self.apply_button = W.Button(description="Use fitted α, β", disabled=True, layout=width)
        self.apply_button.on_click(lambda _: self.apply_fit())
        self.reports: list[Report] = []     # the last run's Reports, one per N (bytes = formula on every rank)
        # α = 3 ms per round: the fastest step is at N = 22, inside the range, so the speedup curve visibly turns
        super().__init__(params or ScalingParams(alpha=3e-3), extra_widgets=[self.measure_sizes, self.repeats, self.apply_button])

    def compute(self, config: ScalingParams) -> ScalingCurve:
        return scaling_curve(config)

    def views(self) -> list[View]:
        return [View("speedup", lambda fig, c, r: draw_speedup(fig, r)),
                View("efficiency", lambda fig, c, r: draw_efficiency(fig, r)),
                View("all-reduce T(N)", lambda fig, c, r: draw_allreduce(fig, r)),
                View("step time", lambda fig, c, r: draw_step(fig, r)),
                View("algorithms", lambda fig, c, r: draw_panel_tradeoff(
                    fig, panel_curves(c.max_workers, c.alpha, c.beta), c.payload_bytes)),
                View("this machine (fit)", lambda fig, c, r: draw_fit(fig, self.measured))]

    def describe(self, config: ScalingParams, c: ScalingCurve) -> str:
        n = c.workers[-1]
        at, best = c.at(n), c.fastest
        return (f"At N = {n}: all-reduce <b>{seconds(at['allreduce'])}</b> (latency {seconds(at['latency'])} + "
                f"bytes {seconds(at['bandwidth'])}; the byte term tends to 2βG = {seconds(c.byte_limit)}), compute "
                f"{seconds(at['compute'])}, step {seconds(at['total'])}: speedup <b>{at['speedup']:.3g}×</b>, "
                f"efficiency {at['efficiency']:.0%}.<br>Fastest step at <b>N = {best}</b> "
                f"(speedup {c.speedup[best - 1]:.3g}×).")

    def measure(self, config: ScalingParams, progress: Any) -> Fit:
        """Time real ring all-reduces on local ranks and fit α, β and the contention g."""
        sizes = parse_world_sizes(self.measure_sizes.value)
        self.reports = time_allreduce(world_sizes=sizes, sizes_bytes=self.measure_sizes_bytes,
                                      repeats=self.repeats.value, progress=progress)
        failed = [r for r in self.reports if not r.passed]
        if failed:                       # the status line says so; a fit of such timings would mean nothing
            raise RuntimeError("; ".join(r.listing(counts=True).splitlines()[-1] for r in failed))
        measurements = [m for r in self.reports for m in r.data]
        cores = os.cpu_count() or 1
        fit = fit_alpha_beta(measurements, cores=cores)
        crowded = (f"; contention g = {fit.contention:.2f} for N > {cores} cores" if max(sizes) > cores else "")
        self._set_run_status(f"fit: α {fit.describe('alpha')}, β {fit.describe('beta')}{crowded}; median relative "
                             f"error {fit.median_rel_error:.0%} over {len(measurements)} points; ledger bytes equal "
                             f"2(N-1)/N G on every rank ({sum(len(r.exact) for r in self.reports)} counts)")
        self.apply_button.disabled = False
        return fit

    def apply_fit(self) -> None:
        """Set the α and β sliders to this machine's fitted values (clipped to the slider range); a term the
        timings did not resolve leaves its slider where it is."""
        if self.measured is None:
            return
        for name, value in (("alpha", self.measured.alpha), ("beta", self.measured.beta)):
            if not self.measured.resolved(name):
                continue
            s = self.controls[name]
            s.value = min(max(value, s.knob.low), s.knob.high)
