"""AllReducePanel: sliders for a, b, G, N_max and C over the all-reduce scaling model,
and a button that measures real ring all-reduces on this machine and fits a and b.

A thin view: the numbers come from wmdist.scaling (pure model, fit, measurement),
the figure from wmdist.plots.allreduce. The panel only wires controls to them.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display

from wmdist.plots.allreduce import allreduce_figure
from wmdist.scaling import (DEFAULT_REPEATS, DEFAULT_SIZES_BYTES, DEFAULT_WORLD_SIZES, Fit, Measurement,
                            ScalingParams, fit_alpha_beta, measure_allreduce, scaling_curve)


def _log_slider(description: str, value: float, low_exp: float, high_exp: float, fmt: str) -> W.FloatLogSlider:
    return W.FloatLogSlider(value=value, base=10, min=low_exp, max=high_exp, step=0.05, description=description,
                            readout_format=fmt, continuous_update=False, style={"description_width": "9em"},
                            layout=W.Layout(width="26em"))


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """'2, 4, 8' -> (2, 4, 8); a clear ValueError for anything else."""
    try:
        sizes = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"world sizes to measure must be integers separated by commas, got {text!r}") from None
    if not sizes or any(not 2 <= n <= 16 for n in sizes):
        raise ValueError(f"world sizes to measure must be integers from 2 to 16, got {text!r}")
    return sizes


class AllReducePanel:
    """The T(N) = 2(N-1)a + 2(N-1)/N bG scaling model, live, with a measured fit on demand.

    `result` holds the current ScalingCurve, `fit` the last Fit (or None).
    Display it by leaving it as the last expression of a cell.
    """

    def __init__(self, params: ScalingParams | None = None,
                 measure_world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                 measure_sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
                 repeats: int = DEFAULT_REPEATS):
        p = params or ScalingParams()
        self.measure_sizes_bytes = tuple(measure_sizes_bytes)
        self.fit: Fit | None = None
        self.measurements: list[Measurement] = []

        self.alpha = _log_slider("a: s per round", p.alpha, -7, -2, ".2e")
        self.beta = _log_slider("b: s per byte", p.beta, -12, -7, ".2e")
        self.payload = _log_slider("G: gradient bytes", p.payload_bytes, 5, 11, ".2e")
        self.compute = _log_slider("C: compute s", p.compute_seconds, -2, 2, ".3g")
        self.max_workers = W.IntSlider(value=p.max_workers, min=2, max=256, description="N max",
                                       continuous_update=False, style={"description_width": "9em"},
                                       layout=W.Layout(width="26em"))
        self.summary = W.HTML()
        self.out = W.Output(layout=W.Layout(min_height="480px"))

        self.measure_sizes = W.Text(value=", ".join(map(str, measure_world_sizes)), description="N to measure",
                                    style={"description_width": "9em"}, layout=W.Layout(width="18em"))
        self.repeats = W.IntSlider(value=repeats, min=1, max=9, description="repeats",
                                   style={"description_width": "5em"}, layout=W.Layout(width="16em"))
        self.measure_button = W.Button(description="Measure on this machine", icon="play",
                                       layout=W.Layout(width="16em"))
        self.apply_button = W.Button(description="Use fitted a, b", disabled=True, layout=W.Layout(width="12em"))
        self.progress = W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="14em"))
        self.status = W.Label(value="not measured yet")

        for control in (self.alpha, self.beta, self.payload, self.compute, self.max_workers):
            control.observe(self._on_change, names="value")
        self.measure_button.on_click(lambda _: self.measure())
        self.apply_button.on_click(lambda _: self.apply_fit())

        sliders = W.VBox([self.alpha, self.beta, self.payload, self.max_workers, self.compute])
        measuring = W.VBox([W.HBox([self.measure_sizes, self.repeats]),
                            W.HBox([self.measure_button, self.apply_button]),
                            W.HBox([self.progress, self.status])])
        self.widget = W.VBox([W.HBox([sliders, measuring]), self.summary, self.out])
        self.update()

    # --- model -> view --------------------------------------------------------------

    @property
    def params(self) -> ScalingParams:
        return ScalingParams(alpha=self.alpha.value, beta=self.beta.value, payload_bytes=self.payload.value,
                             max_workers=self.max_workers.value, compute_seconds=self.compute.value)

    def _on_change(self, change: dict[str, Any]) -> None:
        self.update()

    def update(self) -> None:
        """Recompute the curve, rewrite the summary, redraw the figure; errors go into the panel."""
        try:
            self.result = scaling_curve(self.params)
        except ValueError as err:
            self.summary.value = f"<b>cannot compute:</b> {err}"
            return
        self.summary.value = self.summary_html()
        with self.out:
            self.out.clear_output(wait=True)
            fig = allreduce_figure(self.result, self.fit)
            display(fig)
            plt.close(fig)

    def summary_html(self) -> str:
        c = self.result
        n = c.workers[-1]
        best = max(c.workers, key=lambda k: c.speedup[k - 1])
        at = c.at(n)
        return (f"At N = {n}: all-reduce T = {at['allreduce']:.3g} s (latency {at['latency']:.3g} s + "
                f"bytes {at['bandwidth']:.3g} s; byte limit 2bG = {c.byte_limit:.3g} s), compute "
                f"{at['compute']:.3g} s, step {at['total']:.3g} s, speedup {at['speedup']:.3g}x, "
                f"efficiency {at['efficiency']:.0%}. Fastest step at N = {best} "
                f"(speedup {c.speedup[best - 1]:.3g}x).")

    # --- measuring ---------------------------------------------------------------------

    def _progress(self, done: int, total: int, what: str) -> None:
        self.progress.max, self.progress.value = total, done
        self.status.value = f"measuring {what} ({done}/{total})" if done < total else f"measured {total} points"

    def measure(self) -> Fit | None:
        """Run real ring all-reduces, fit a and b, redraw with the measurements. Errors go to `status`."""
        self.measure_button.disabled = True
        try:
            sizes = parse_world_sizes(self.measure_sizes.value)
            self.measurements = measure_allreduce(sizes, self.measure_sizes_bytes, self.repeats.value,
                                                  progress=self._progress)
            self.fit = fit_alpha_beta(self.measurements)
        except Exception as err:   # a RankFailure or bad input: say so in the panel, keep the kernel alive
            self.status.value = f"measurement failed: {type(err).__name__}: {str(err).splitlines()[0]}"
            return None
        finally:
            self.measure_button.disabled = False
        cores = os.cpu_count() or 1
        crowded = f"; {max(sizes)} ranks on {cores} cores share them, which the model ignores" \
            if max(sizes) > cores else ""
        self.status.value = (f"fit: a = {self.fit.alpha:.3g} s, b = {self.fit.beta:.3g} s/B, median relative "
                             f"error {self.fit.median_rel_error:.0%} over {len(self.measurements)} points{crowded}")
        self.apply_button.disabled = False
        self.update()
        return self.fit

    def apply_fit(self) -> None:
        """Set the a and b sliders to this machine's fitted values (clipped to the slider range)."""
        if self.fit is None:
            return
        self.alpha.value = min(max(self.fit.alpha, 10 ** self.alpha.min), 10 ** self.alpha.max)
        self.beta.value = min(max(self.fit.beta, 10 ** self.beta.min), 10 ** self.beta.max)

    def _ipython_display_(self) -> None:
        display(self.widget)
