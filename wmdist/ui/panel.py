"""The panel base: controls -> pure model -> figure, and a "run it" button with progress.

A chapter's panel subclasses `Panel` and supplies four things: the config it
starts from (a dataclass whose fields carry knobs), `compute(config)` (the
pure model), `figure(config, result)` and `describe(config, result)`; a panel
that can measure on real ranks also supplies `measure(config, progress)`.
The base wires everything else once, so every panel behaves alike:

- each control change rebuilds the config, recomputes and redraws once;
- a bad input shows its error and *clears* the figure, so nothing stale stays
  on screen looking current;
- the run button shows progress, keeps the kernel alive on failure (the error
  goes into the status line), stores what it measured in `self.measured`, and
  redraws with it;
- long text wraps inside a fixed-width column (one or `control_columns` knobs
  wide), so no readout is squeezed and the figure keeps the rest of the row.

Tests drive a panel headlessly by setting `.value` on `panel.controls[name]`
and reading `panel.result`, `panel.shown` (the figure), `panel.error` and
`panel.summary.value`.
"""
from __future__ import annotations

import dataclasses
import html
from typing import Any, Callable

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from wmdist.ui.controls import CONTROL_WIDTH, controls_for

Progress = Callable[[int, int, str], None]
WRAP = "white-space: normal; overflow-wrap: anywhere; line-height: 1.35"


class Panel:
    """Base class; see the module docstring for what a subclass supplies."""

    run_label: str | None = None      # text of the "run it" button; None: no button
    control_columns: int = 1          # > 1: knobs in a grid on top, figure and summary side by side below

    def __init__(self, config: Any, extra_controls: dict[str, W.ValueWidget] | None = None,
                 extra_widgets: list[W.Widget] | None = None):
        self.initial = config
        self.controls = controls_for(config)
        self.extra = extra_controls or {}      # value controls outside the config (e.g. a capacity line)
        self.config: Any = None
        self.result: Any = None
        self.measured: Any = None
        self.shown: Figure | None = None       # the figure on screen now (None after an error)
        self.error = ""
        self._last_run = ""                    # the run button's last status line
        self.summary = W.HTML(layout=W.Layout(width="100%"))
        self.status = W.HTML(layout=W.Layout(width=CONTROL_WIDTH))
        self.out = W.Output(layout=W.Layout(min_height="320px"))
        self.progress = W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width=CONTROL_WIDTH, visibility="hidden"))
        self.run_button = W.Button(description=self.run_label or "", icon="play",
                                   layout=W.Layout(width=CONTROL_WIDTH, display=None if self.run_label else "none"))
        self.run_button.on_click(lambda _: self.run())
        for c in [*self.controls.values(), *self.extra.values()]:
            c.observe(lambda _change: self.update(), names="value")
        self.widget = self._layout([*self.controls.values(), *self.extra.values()], extra_widgets or [])
        for w, name in ((self.widget, "panel"), (self.summary, "summary"), (self.status, "status"),
                        (self.out, "figure"), (self.run_button, "run"), (self.progress, "progress")):
            w.add_class(f"wmdist-{name}")        # stable hooks for the real-browser test
        self.update()

    def _layout(self, knobs: list[W.Widget], extra_widgets: list[W.Widget]) -> W.Box:
        """Controls in a fixed-width column left of the figure and summary; or, for a panel with many
        knobs (control_columns > 1), the knobs in a grid on top, then figure and run box | summary,
        so controls, plot and numbers fit one screen. Long text wraps; it never widens a column."""
        run_box = [self.run_button, *extra_widgets, self.progress, self.status]
        if self.control_columns == 1:
            left = W.VBox([*knobs, *run_box], layout=W.Layout(width="27em", min_width="27em", flex="0 0 auto",
                                                              overflow="hidden"))
            right = W.VBox([self.out, self.summary], layout=W.Layout(flex="1 1 auto", min_width="0"))
            return W.HBox([left, right], layout=W.Layout(width="100%", align_items="flex-start"))
        for k in knobs:                                          # each fills its grid cell, labels a bit wider
            k.layout.width = "96%"
            if "description_width" in k.style.keys:
                k.style.description_width = "13em"
        grid = W.GridBox(knobs, layout=W.Layout(width="100%", grid_gap="0 1em",
                                                grid_template_columns=f"repeat({self.control_columns}, minmax(0, 1fr))"))
        left = W.VBox([self.out, *run_box], layout=W.Layout(flex="0 0 auto", max_width="55%", overflow="hidden"))
        right = W.VBox([self.summary], layout=W.Layout(flex="1 1 0", min_width="0", overflow="hidden"))
        below = W.HBox([left, right], layout=W.Layout(width="100%", align_items="flex-start", grid_gap="1em"))
        return W.VBox([grid, below], layout=W.Layout(width="100%"))

    # --- what a subclass supplies ----------------------------------------------------

    def compute(self, config: Any) -> Any:
        """The pure model for one config (formulas, schedules): no processes, fast."""
        raise NotImplementedError

    def figure(self, config: Any, result: Any) -> Figure:
        """A matplotlib figure of the result (and of self.measured, when there is one)."""
        raise NotImplementedError

    def describe(self, config: Any, result: Any) -> str:
        """An HTML summary of the result: the numbers a reader should take away."""
        raise NotImplementedError

    def measure(self, config: Any, progress: Progress) -> Any:
        """Run the real thing on local ranks; whatever it returns lands in self.measured."""
        raise NotImplementedError

    # --- the loop ----------------------------------------------------------------------

    def read_config(self) -> Any:
        """The config the controls describe (ValueError/TypeError name a bad input)."""
        values = {name: c.value for name, c in self.controls.items()}
        for name, value in values.items():        # a log slider yields floats for an integer field
            if isinstance(getattr(self.initial, name), int) and isinstance(value, float) and value.is_integer():
                values[name] = int(value)
            elif isinstance(getattr(self.initial, name), int) and isinstance(value, float):
                values[name] = int(round(value))
        return dataclasses.replace(self.initial, **values)

    def update(self) -> None:
        """Recompute and redraw once; on a bad input, show the error and clear the figure."""
        try:
            config = self.read_config()
            result = self.compute(config)
        except (ValueError, TypeError) as err:
            self.error, self.result, self.shown = str(err), None, None
            self.status.value = f"<div style='{WRAP}; color:#b00'><b>cannot compute:</b> {html.escape(self.error)}</div>"
            self.summary.value = ""
            self.out.clear_output()
            return
        self.config, self.result, self.error = config, result, ""
        self.status.value = self._last_run
        self.summary.value = f"<div style='{WRAP}'>{self.describe(config, result)}</div>"
        with self.out:
            self.out.clear_output(wait=True)
            self.shown = self.figure(config, result)
            display(self.shown)
            plt.close(self.shown)

    def _report_progress(self, done: int, total: int, text: str) -> None:
        self.progress.max, self.progress.value = max(total, 1), done
        self._set_run_status(f"{text} ({done}/{total})" if done < total else text)

    def _set_run_status(self, text: str, error: bool = False) -> None:
        color = "; color:#b00" if error else ""
        self._last_run = f"<div style='{WRAP}{color}'>{html.escape(text)}</div>"
        self.status.value = self._last_run

    def run(self) -> Any:
        """The "run it" button: measure on real ranks with progress, then redraw with the measurement."""
        if self.config is None:
            self._set_run_status(f"fix the inputs first: {self.error}", error=True)
            return None
        self.run_button.disabled = True
        self.progress.layout.visibility = "visible"
        try:
            self.measured = self.measure(self.config, self._report_progress)
        except Exception as err:   # a failed rank or a bad input: say so in the panel, keep the kernel alive
            self._set_run_status(f"run failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                                 error=True)
            return None
        finally:
            self.run_button.disabled = False
        self.update()
        return self.measured

    def _ipython_display_(self) -> None:
        display(self.widget)
