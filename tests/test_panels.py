"""The panel base and its parts, driven by .value: views, drawing ahead, defaults that teach, units.

What the browser test cannot afford to check one by one: every control of every panel at its
opening setting, and the pure pieces (units, tick spacing, the prefetcher's order and cache).
"""
from __future__ import annotations

import base64
import io
import math
import re

import ipywidgets as W
import matplotlib
import pytest
from PIL import Image

from wmdist.bench.panels import panel_factories, time_panel
from wmdist.costs.units import flops, seconds, si
from wmdist.ui.panel import Panel, View, strip_tags
from wmdist.ui.prefetch import Prefetcher, candidates, steps
from wmdist.ui.render import DPI, axes_grid, canvas_figure, log2_axis, to_png

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def panels():
    return {name: make() for name, make in panel_factories().items()}


def test_units_read_as_a_person_reads_them():
    assert seconds(1.47e-3) == "1.47 ms" and seconds(19.1) == "19.1 s" and seconds(6e-3) == "6 ms"
    assert seconds(1.234e-7) == "123 ns" and seconds(900) == "15 min"
    assert flops(8.8e12) == "8.8 TFLOP" and si(999.7, "B") == "1 kB" and si(0, "B") == "0 B"
    with pytest.raises((TypeError, ValueError), match="value"):
        si("1", "B")


def test_a_figure_is_drawn_at_its_shown_size_into_reused_axes():
    fig = canvas_figure(600, 320)
    first = axes_grid(fig)[0]
    first.bar([0, 1], [1, 2], label="bars")
    first.legend()
    png = Image.open(io.BytesIO(to_png(fig)))
    assert png.size == (600, 320) and fig.dpi == DPI
    again = axes_grid(fig)[0]
    assert again is first and not again.patches and not again.containers and again.get_legend() is None
    assert axes_grid(fig, rows=2, cols=1)[0] is not first and len(fig.axes) == 2       # another grid: new axes


@pytest.mark.parametrize("width", [300, 600])
def test_integer_log_axis_labels_never_touch(width):
    fig = canvas_figure(width, 300)
    ax = axes_grid(fig)[0]
    ax.set_xscale("log")
    values = [2 ** k for k in range(10, 21)]
    ax.plot(values, values)
    log2_axis(ax.xaxis, values)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    assert len(boxes) >= 2 and all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    assert all(re.fullmatch(r"[\d,]+", t.get_text()) for t in ax.get_xticklabels() if t.get_text())


def test_steps_and_candidates_follow_the_last_move():
    slider = W.IntSlider(value=3, min=1, max=8)
    menu = W.Dropdown(options=[("a", 1), ("b", 2), ("c", 3)], value=1)
    box = W.Checkbox(value=False)
    log = W.FloatLogSlider(value=10.0, min=0, max=2, step=0.5)
    assert steps(slider) == [4, 2] and steps(menu) == [2] and steps(box) == [True]
    assert steps(log) == pytest.approx([10 ** 1.5, 10 ** 0.5]) and steps(W.IntText(value=1)) == []
    controls = {"menu": menu, "slider": slider, "box": box}
    assert candidates(controls, "slider", forward=False)[:2] == [("slider", 2), ("slider", 4)]
    slider.disabled = True
    assert all(name != "slider" for name, _ in candidates(controls, "slider", forward=True))


def test_prefetcher_keeps_pictures_of_its_generation_only():
    p = Prefetcher()
    p.schedule([("a", lambda: b"A"), ("b", lambda: b"B")])
    assert p.idle() and p.get("a") == b"A" and p.get("b") == b"B"
    p.cancel(clear=True)
    assert p.get("a") is None
    gate = []

    def slow():
        p.cancel()                     # a new change arrives while this picture is drawn
        gate.append(1)
        return b"old"
    p.schedule([("c", slow)])
    assert p.idle() and gate and p.get("c") is None


class _Toy(Panel):
    """A panel on a one-field config, with two views, to test the base's contract directly."""
    hint = "try it"

    def views(self):
        return [View("line", lambda fig, c, r: axes_grid(fig)[0].plot([0, r], [0, r]), width=200, height=120),
                View("bar", lambda fig, c, r: axes_grid(fig)[0].bar([0], [r]), width=200, height=120)]

    def compute(self, config):
        if config.n < 0:
            raise ValueError("n must be >= 0")
        return config.n * 2

    def describe(self, config, result):
        return f"twice n is <b>{result}</b>"


def _toy() -> _Toy:
    from dataclasses import dataclass

    from wmdist.base.knobs import knob

    @dataclass(frozen=True)
    class Cfg:
        n: int = knob(3, "n", low=-2, high=10)
    return _Toy(Cfg())


def test_panel_shows_figure_and_numbers_together_and_clears_on_error():
    panel = _toy()
    assert "twice n is <b>6</b>" in panel.summary.value and "<img src='data:image/png;base64," in panel.figure_box.value
    assert panel.shown.axes[0].lines[0].get_xdata()[-1] == 6
    panel.controls["n"].value = 4
    assert panel.result == 8 and panel.shown.axes[0].lines[0].get_xdata()[-1] == 8
    panel.selector.value = "bar"
    assert panel.shown.axes[0].patches[0].get_height() == 8 and not panel.shown.axes[0].lines
    panel.controls["n"].value = -1
    assert panel.shown is None and panel.figure_box.value == "" and "n must be &gt;= 0" in panel.status.value
    panel.controls["n"].value = 1
    assert panel.shown is not None and panel.error == ""
    panel.prefetch.idle()


def test_panel_offers_a_static_picture_beside_the_widget():
    panel = _toy()
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]) == panel.png and bundle["text/plain"] == "twice n is 6"
    assert strip_tags("a<br>b <b>c</b> &lt;") == "a; b c <"
    panel.prefetch.idle()


def test_a_move_drawn_ahead_is_served_and_shown_is_drawn_on_demand():
    panel = _toy()
    assert panel.prefetch.idle()                           # n = 4 and 2 were drawn ahead
    panel.controls["n"].value = 4
    assert panel._stale and panel.png                      # served from the worker's picture...
    assert panel.shown.axes[0].lines[0].get_xdata()[-1] == 8    # ...and the figure is drawn when asked for
    panel.prefetch.idle()


def test_every_control_of_every_panel_changes_what_it_shows(panels):
    """Defaults that teach: at each panel's opening setting, each enabled control moved one step alone
    changes the picture or the numbers (a disabled control says it does not apply)."""
    for name, panel in panels.items():
        for key, control in {**panel.controls, **{k: c for k, c in panel.extra.items()
                                                  if isinstance(c, (W.Checkbox, W.Dropdown))}}.items():
            if control.disabled:
                continue
            values = steps(control) or ([type(control.value)(control.value * 2 or 1)]   # a typed number: double it
                                        if isinstance(control, (W.IntText, W.FloatText)) else [])
            assert values, f"{name}: {key} cannot be moved"
            before, png = panel.summary.value + panel.more.value, panel.png
            old, changed = control.value, []
            for value in values:                  # one way or the other (bf16 -> fp16 holds the same bytes)
                control.value = value
                changed.append(not panel.error and (panel.summary.value + panel.more.value != before
                                                    or panel.png != png))
                control.value = old
            assert any(changed), f"{name}: moving {key} alone changes nothing"
        panel.prefetch.idle()


def test_every_panel_fits_its_views_and_says_what_to_try(panels):
    for name, panel in panels.items():
        assert panel.hint and len(strip_tags(panel.hint)) < 200, name
        for view in panel.selector.options:
            panel.selector.value = view
            assert panel.shown is not None and panel.png, (name, view)
            size = Image.open(io.BytesIO(panel.png)).size
            assert size[0] <= 620 and size[1] <= 420, (name, view, size)     # beside the controls, under 700 px
        panel.selector.value = panel.selector.options[0]
        assert not re.search(r"\de[+-]\d", strip_tags(panel.summary.value)), name   # engineering units, not 1e+03
        panel.prefetch.idle()


def _browser_step(slider: W.FloatLogSlider, direction: int) -> None:
    """Press an arrow key on a log slider as the browser does: its track is the exponent, from `min` in steps of
    `step` (noUiSlider snaps the handle to that grid), and it sends base ** exponent as the new value."""
    position = math.log(slider.value) / math.log(slider.base)
    last = round((slider.max - slider.min) / slider.step)
    n = min(max(round((position + direction * slider.step - slider.min) / slider.step), 0), last)
    slider.value = slider.base ** (slider.min + n * slider.step)


def test_a_log_slider_comes_back_to_its_value_after_a_step_each_way(panels):
    """01's α at 3 ms once came back as 3.16 ms (a grid from 1e-7 does not hold 3e-3); every log slider of
    every panel, and a value set by code (a device, a fit), must come back exactly."""
    sliders = [(name, key, c) for name, panel in panels.items() for key, c in panel.controls.items()
               if isinstance(c, W.FloatLogSlider)]
    assert {("01 scaling", "alpha"), ("09 patterns", "inter_gbps")} <= {(n, k) for n, k, _ in sliders}
    for name, key, slider in sliders:
        for direction in (+1, -1):
            start = slider.value
            _browser_step(slider, direction)
            assert slider.value != start, (name, key, "did not move")
            _browser_step(slider, -direction)
            assert slider.value == start, (name, key, start, slider.value)
    panel, alpha = panels["01 scaling"], panels["01 scaling"].controls["alpha"]
    panel.prefetch.idle()
    _browser_step(alpha, +1)
    assert panel._stale, "the snapped stop must be the value drawn ahead (same picture key)"
    _browser_step(alpha, -1)
    alpha.value = 3.7e-5                                           # e.g. a fitted α
    _browser_step(alpha, +1)
    _browser_step(alpha, -1)
    assert alpha.value == 3.7e-5
    alpha.value = 3e-3
    panels["01 scaling"].prefetch.idle()


def test_log_grid_holds_its_anchor_and_reads_stops_at_the_readout_digits():
    from wmdist.base.knobs import Knob, log_grid
    grid = log_grid(Knob(label="a", low=1e-7, high=1e-2, log=True), 3e-3)
    low, high = grid.exponents
    assert grid.stop(0) == 3e-3 and 1e-7 <= 10 ** low and 10 ** high <= 1e-2 * (1 + 1e-12)
    assert grid.snap(10 ** (math.log10(3e-3) + 0.05)) == grid.stop(1) == pytest.approx(3.3661e-3, rel=1e-4)
    assert grid.snap(10 ** (math.log10(3e-3) - 1e-14)) == 3e-3     # the browser's float for the anchor
    assert grid.snap(3.7e-5) == 3.7e-5                             # no stop: left as it is
    with pytest.raises(ValueError, match="outside"):
        log_grid(Knob(label="a", low=1.0, high=10.0, log=True), 20.0)


def test_a_menu_option_for_none_stays_shown_when_chosen_again(panels):
    """ipywidgets blanks a Dropdown whose value is None: "same" and "none" are held as labels, None in the
    config."""
    from wmdist.ui.controls import model_value
    panel = panels["00 memory"]
    for key, other in (("grad_dtype", "fp32"), ("grad_accum_dtype", "fp32")):
        menu = panel.controls[key]
        label = menu.label
        assert menu.value is not None and getattr(panel.config, key) is None
        menu.value = other
        assert getattr(panel.config, key) == other
        menu.index = 0                                             # chosen again, as the browser sends it
        assert menu.label == label and menu.index == 0 and getattr(panel.config, key) is None
        assert model_value(menu, menu.value) is None
    panel.prefetch.idle()


def test_a_panel_keeps_no_blank_band_under_a_shorter_view(panels):
    """The figure box is as tall as the tallest view: views of one panel share a height (05 had 100 px blank)."""
    for name, panel in panels.items():
        heights = {v.height for v in panel._views.values()}
        assert len(heights) == 1, (name, heights)


def test_bench_times_both_paths():
    from wmdist.pipeline.panel import BubblePanel
    result = time_panel(BubblePanel(), moves=2)
    assert set(result["per_control"]) <= {"schedule", "stages", "microbatches", "unequal"}    # v is greyed out
    assert result["drawn"]["moves"] == 2 * len(result["per_control"]) and result["served"]["moves"] == 2
    assert 0 < result["served"]["median_ms"] and 0 < result["drawn"]["median_ms"] <= result["drawn"]["max_ms"]
