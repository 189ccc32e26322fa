"""The panel base: controls -> pure model -> one figure view and its numbers, and a "run it" button.

A chapter's panel subclasses `Panel` and supplies: the config it starts from
(a dataclass whose fields carry knobs), `compute(config)` (the pure model),
`views()` (the plots it can show, each a `View`), `describe(config, result)`
(the key numbers, short) and optionally `details(config, result)` (the rest,
in a collapsed accordion) and `measure(config, progress)` for the button.
The base wires everything else once, so all five panels behave alike:

- A control change recomputes, draws the selected view into the figure it
  drew last time (wmdist.ui.render: axes reused, PNG at screen size; the
  canvas keeps text layouts and glyphs, wmdist.ui.fasttext) and only then
  sets the figure and the numbers, back to back, so the new numbers never
  sit beside the old picture. The prefetcher draws the neighbours ahead and
  gives way to a move at once (wmdist.ui.prefetch).
- A panel with several plots shows one at a time, chosen by buttons above
  the figure; only the one on screen is drawn.
- A bad input shows its error and clears the figure, so nothing stale stays
  on screen looking current.
- The run button shows progress, keeps the kernel alive on failure (the error
  goes into the status line), stores what it measured in `self.measured`,
  and redraws with it.
- Displayed, a panel offers both the live widget and a static view (the
  mime bundle): JupyterLab shows the widget; a static renderer (GitHub,
  nbviewer, nbconvert, the course site) shows `text/html` holding the
  picture, with alt text saying what it shows, and the key numbers under it.

Tests drive a panel headlessly by setting `.value` on `panel.controls[name]`
(or `panel.selector.value` for a view) and reading `panel.result`,
`panel.shown` (the Figure of the view on screen, None after an error),
`panel.png`, `panel.error` and `panel.summary.value`.
"""
from __future__ import annotations

import base64
import dataclasses
import html
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import ipywidgets as W
from matplotlib.figure import Figure

from wmdist.ui.controls import CONTROL_WIDTH, controls_for
from wmdist.ui.layout import WRAP, panel_layout
from wmdist.ui.prefetch import Prefetcher, candidates, stable
from wmdist.base.on_progress import OnProgress
from wmdist.ui.fasttext import fast_figure
from wmdist.ui.garbage import settle_garbage
from wmdist.ui.render import FONT, img_html, to_png
from wmdist.ui.static import static_html, strip_tags


@dataclass(frozen=True)
class View:
    """One plot a panel can show: its button label, its size on screen in pixels, and how to draw it.

    `draw(fig, config, result)` draws into `fig` (use wmdist.ui.render.axes_grid(fig, ...) to get its axes,
    reused from the last call); it reads `panel.measured` itself when it shows a measurement.
    """
    name: str
    draw: Callable[[Figure, Any, Any], None]
    width: int = 600        # fits beside the controls in a 1366 px window with JupyterLab's file browser open
    height: int = 320


class Panel:
    """Base class; see the module docstring for what a subclass supplies."""

    run_label: str | None = None                        # text of the "run it" button; None: no button
    hint: str = ""                                      # one line: what to try first
    control_groups: dict[str, tuple[str, ...]] = {}     # tab title -> knob names; {}: one column of knobs
    measured_view: str | None = None                    # the view a finished run switches to (None: the first)

    def __init__(self, config: Any, *, extra_controls: dict[str, W.ValueWidget] | None = None,
                 extra_widgets: list[W.Widget] | None = None):
        self.initial = config
        self.controls = controls_for(config)
        self.extra = extra_controls or {}      # value controls outside the config (e.g. a capacity line)
        self.config: Any = None
        self.result: Any = None
        self.measured: Any = None
        self.png: bytes = b""                  # the view on screen, as shown
        self._shown: Figure | None = None      # its figure, when drawn here (None after an error)
        self._stale = False                    # True: the PNG came from the prefetcher, _shown is older
        self.error = ""
        self._last_run = ""                    # the run button's last status line
        self._views = {v.name: v for v in self.views()}
        self._figures: dict[str, Figure] = {}  # one figure per view, drawn into again on every change
        self._ahead: dict[str, Figure] = {}    # the prefetcher's own figures (it runs on another thread)
        self.prefetch = Prefetcher()
        self._moved: tuple[str | None, bool] = (None, True)    # the control that changed last, and which way
        self._holding = 0                      # > 0: controls are being set together, one update comes after
        self.selector = W.ToggleButtons(options=list(self._views), value=next(iter(self._views)),
                                        style={"button_width": "auto"},
                                        layout=W.Layout(display=None if len(self._views) > 1 else "none"))
        self.figure_box = W.HTML(layout=W.Layout(min_height=f"{max(v.height for v in self._views.values())}px"))
        self.summary = W.HTML(layout=W.Layout(width="auto"))     # not 100%: that plus the widget margin overflows
        self.more = W.HTML()
        self.details_box = W.Accordion(children=[self.more], titles=("details",), selected_index=None)
        self.status = W.HTML(layout=W.Layout(width=CONTROL_WIDTH))
        self.progress = W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width=CONTROL_WIDTH, visibility="hidden"))
        self.run_button = W.Button(description=self.run_label or "", icon="play",
                                   layout=W.Layout(width=CONTROL_WIDTH, display=None if self.run_label else "none"))
        self.run_button.on_click(lambda _: self.run())
        for name, c in [*self.controls.items(), *self.extra.items()]:
            c.observe(lambda change, name=name: self._changed(name, change), names="value")
        self.selector.observe(lambda _change: self.redraw(), names="value")
        self.widget = panel_layout(self, extra_widgets or [])
        for w, name in ((self.widget, "panel"), (self.summary, "summary"), (self.status, "status"),
                        (self.figure_box, "figure"), (self.run_button, "run"), (self.progress, "progress"),
                        (self.selector, "views"), (self.details_box, "details")):
            w.add_class(f"wmdist-{name}")        # stable hooks for the real-browser test
        self.update()
        settle_garbage()

    # --- what a subclass supplies ----------------------------------------------------

    def views(self) -> list[View]:
        """The plots this panel can show, the first one on screen at the start."""
        raise NotImplementedError

    def compute(self, config: Any) -> Any:
        """The pure model for one config (formulas, schedules): no processes, fast."""
        raise NotImplementedError

    def describe(self, config: Any, result: Any) -> str:
        """The key numbers as short HTML: what a reader should take away, next to the figure."""
        raise NotImplementedError

    def details(self, config: Any, result: Any) -> str:
        """Secondary HTML (full tables, caveats, the last measurement), folded under the panel; "" for none."""
        return ""

    def measure(self, config: Any, progress: OnProgress) -> Any:
        """Run the real thing on local ranks; whatever it returns lands in self.measured."""
        raise NotImplementedError

    # --- the loop ----------------------------------------------------------------------

    def read_config(self, *, change: dict[str, Any] | None = None) -> Any:
        """The config the controls describe, with `change` applied (ValueError/TypeError name a bad input)."""
        values = {**{name: c.value for name, c in self.controls.items()}, **(change or {})}
        for name, value in values.items():        # a log slider yields floats for an integer field
            if isinstance(getattr(self.initial, name), int) and isinstance(value, float):
                values[name] = int(round(value))
        return dataclasses.replace(self.initial, **values)

    @property
    def shown(self) -> Figure | None:
        """The Figure of the view on screen, drawn now if the picture came from the prefetcher."""
        if self._stale and self.result is not None:
            self._shown = self._render(self._figures, self.selector.value, self.config, self.result)[0]
            self._stale = False
        return self._shown

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Set several controls at once (a preset, a coupled control) without an update per change; the caller
        updates once afterwards, or lets the change that started it do so."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def _changed(self, name: str, change: dict) -> None:
        if self._holding:
            return
        old, new = change["old"], change["new"]
        try:
            forward = bool(new > old)
        except TypeError:                       # options that do not order (strings): by position
            options = getattr(change["owner"], "options", ())
            values = [o[1] if isinstance(o, tuple) else o for o in options]
            forward = new in values and old in values and values.index(new) > values.index(old)
        self._moved = (name, forward)
        self.update()

    def update(self) -> None:
        """Recompute, draw the view on screen (or take it from the prefetcher), then show figure and numbers
        together; on a bad input, show the error and clear the figure."""
        self.prefetch.cancel()
        try:
            config = self.read_config()
            result = self.compute(config)
        except (ValueError, TypeError) as err:
            self.error, self.result, self._shown, self._stale, self.png = str(err), None, None, False, b""
            self.status.value = f"<div style='{WRAP}; color:#b00'><b>cannot compute:</b> {html.escape(self.error)}</div>"
            self.summary.value = self.more.value = self.figure_box.value = ""
            return
        self.config, self.result, self.error = config, result, ""
        summary = f"<div style='{WRAP}; font-size:{FONT + 3}px'>{self.describe(config, result)}</div>"
        more = self.details(config, result)
        figure = self._draw()
        self.status.value = self._last_run
        self.figure_box.value, self.summary.value = figure, summary
        self.more.value = f"<div style='{WRAP}'>{more}</div>" if more else ""
        self.details_box.layout.display = None if more else "none"
        self._draw_ahead()

    def redraw(self) -> None:
        """Draw the selected view for the current result (a view button, or a measurement landing)."""
        self.prefetch.cancel()
        if self.result is not None:
            self.figure_box.value = self._draw()
            self._draw_ahead()

    def _key(self, view: str, config: Any) -> str:
        """What a picture depends on. Floats to 12 significant digits: the browser's log slider computes
        10^(x + step) with its own rounding, which differs from ours in the 16th digit."""
        fields = [(f.name, stable(getattr(config, f.name))) for f in dataclasses.fields(config)]
        return f"{view}|{fields!r}|{[stable(c.value) for c in self.extra.values()]!r}"

    def _render(self, figures: dict[str, Figure], view_name: str, config: Any, result: Any) -> tuple[Figure, bytes]:
        ahead = figures is self._ahead          # on the prefetcher's worker: checkpoints, see _render_ahead
        fig = figures.get(view_name)
        if fig is None:
            view = self._views[view_name]
            fig = figures[view_name] = fast_figure(view.width, view.height)
            fig.canvas.checkpoint = self.prefetch.checkpoint if ahead else None
        self._views[view_name].draw(fig, config, result)
        if ahead:
            self.prefetch.checkpoint()
        return fig, to_png(fig)

    def _render_ahead(self, view_name: str, config: Any) -> bytes:
        """One picture on the worker, given up (Superseded) at the first checkpoint after a change: after the
        model, after the artists, and in the canvas before each thing it paints."""
        result = self.compute(config)
        self.prefetch.checkpoint()
        return self._render(self._ahead, view_name, config, result)[1]

    def _draw(self) -> str:
        view = self.selector.value
        png = self.prefetch.get(self._key(view, self.config))
        if png is None:
            self._shown, png = self._render(self._figures, view, self.config, self.result)
            self._stale = False
        else:
            self._stale = True
        self.png = png
        return img_html(png, view)

    def _draw_ahead(self) -> None:
        """Queue the pictures one control step away (the prefetcher draws them while the kernel is idle)."""
        view, (last, forward) = self.selector.value, self._moved
        jobs = []
        for name, value in candidates(self.controls, last, forward=forward):
            try:
                config = self.read_config(change={name: value})
            except (ValueError, TypeError):
                continue
            jobs.append((self._key(view, config), lambda c=config: self._render_ahead(view, c)))
        self.prefetch.schedule(jobs)

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
        self.prefetch.cancel(clear=True)         # pictures drawn ahead show no measurement
        try:
            self.measured = self.measure(self.config, self._report_progress)
        except Exception as err:   # a failed rank or a bad input: say so in the panel, keep the kernel alive
            self._set_run_status(f"run failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                                 error=True)
            return None
        finally:
            self.run_button.disabled = False
        self.prefetch.cancel(clear=True)
        self.selector.value = self.measured_view or self.selector.options[0]
        self.update()
        return self.measured

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live widget for JupyterLab, and for renderers without a kernel the picture and its numbers.

        Every HTML renderer (nbconvert, the course site, GitHub) shows one representation of an output and
        prefers `text/html` to `image/png`: the HTML holds the picture (with its alt text) and the key numbers,
        so neither is dropped. The PNG and the numbers as text stay for renderers that take those."""
        bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/plain"] = strip_tags(self.summary.value) or f"{type(self).__name__}: {self.error}"
        bundle["text/html"] = static_html(self)
        if self.png:
            bundle["image/png"] = base64.b64encode(self.png).decode("ascii")
        return bundle

