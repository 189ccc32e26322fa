"""ipywidgets controls built from a config's knobs (wmdist.base.knobs), so ranges are stated once."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import ipywidgets as W
from traitlets import observe, validate

from wmdist.base.knobs import Knob, knobs, log_grid

LABEL_WIDTH = "11em"
CONTROL_WIDTH = "22em"
LONG_OPTION = 14           # characters a menu shows beside an 11em label (about 11em at 13 px, arrow included)

# A slider's label sits on its own line above the track (issue 33 §2): beside an 11em label, the track and its
# readout share what is left of the control, and in a tab page (255 px) that left a 16 px track, a handle with
# nothing to read its position against. Stacked, the track gets the control's width less the readout.
STACKED = "wmdist-stacked"   # the class that puts a slider's label above its track (see STACKED_CSS)
STACKED_CSS = (f".{STACKED}.widget-slider > .widget-label {{text-align: left; height: auto; line-height: 1.25;"
               f" margin: 0}} .{STACKED}.widget-slider > .widget-readout {{height: 22px; line-height: 22px}}")
MIN_TRACK_PX = 120           # the shortest track a learner can read a position on and drag
# ipywidgets 8's horizontal slider, in px at JupyterLab's 13 px font: the readout's min-width
# (--jp-widgets-inline-width-tiny), its left margin, and the track container's margins (half a handle, less
# borders, each side)
READOUT_PX, READOUT_MARGIN_PX, TRACK_MARGINS_PX = 72, 4, 12


class GridLogSlider(W.FloatLogSlider):
    """A FloatLogSlider whose stops are a LogGrid through the last value code set (its opening value, a device's
    or a fit's number): one step right then one step left gives that value back exactly, whatever float the
    browser computed for 10 ** exponent. A browser only ever sends stops, so only code moves the grid."""

    def __init__(self, knob: Knob, value: float, **kwargs: Any) -> None:
        value = min(max(value, knob.low), knob.high)      # as a FloatLogSlider clips a value off its track
        self.knob, self.grid = knob, log_grid(knob, value)
        low, high = self.grid.exponents
        super().__init__(value=value, base=10, min=low, max=high, step=self.grid.step, **kwargs)

    @validate("value")
    def _validate_value(self, proposal: Any) -> float:       # the name of the one it replaces: one validator per trait
        if not hasattr(self, "grid"):                      # while the base class sets its defaults
            return super()._validate_value(proposal)
        # clipped to the knob's range, not to the stops: a value below the lowest stop moves the grid to it
        value = min(max(proposal["value"], self.knob.low), self.knob.high)
        return self.grid.snap(value)

    @observe("value")
    def _regrid(self, change: Any) -> None:
        """A value that is no stop (set by code) becomes the anchor of a new grid over the knob's range."""
        value = change["new"]
        if not hasattr(self, "grid") or value in self._stops_near(value):
            return
        self.grid = log_grid(self.knob, value)
        with self.hold_trait_notifications():
            self.min, self.max = self.grid.exponents

    def _stops_near(self, value: float) -> tuple[float, ...]:
        n = round(math.log10(value / self.grid.anchor) / self.grid.step)
        return tuple(self.grid.stop(m) for m in (n - 1, n, n + 1) if -self.grid.below <= m <= self.grid.above)


class ChoiceDropdown(W.Dropdown):
    """A Dropdown for options that include ("same", None): ipywidgets reads a None value as "nothing
    selected" and blanks the box, so the widget holds the label instead and `model_value` gives None back."""

    def __init__(self, *, none_label: str | None, **kwargs: Any) -> None:
        self.none_label = none_label
        super().__init__(**kwargs)


def model_value(control: W.ValueWidget, value: Any) -> Any:
    """What a config field gets from `control` showing `value`: None for a ChoiceDropdown's None option."""
    none_label = getattr(control, "none_label", None)
    return None if none_label is not None and value == none_label else value


def widget_value(control: W.ValueWidget, value: Any) -> Any:
    """The inverse of model_value: what to set on `control` for a config value."""
    none_label = getattr(control, "none_label", None)
    return none_label if none_label is not None and value is None else value


def _refuse_alike(knob_label: str, pairs: list[tuple[str, Any]]) -> None:
    """Refuse a menu's options of mixed kinds that it cannot tell apart, naming the knob and both options.

    Two kinds of pair: options that read the same (1 and "1" are both "1": the learner cannot tell which
    is which), and options Python holds equal (True == 1 == 1.0, False == 0, a value listed twice): a
    Dropdown finds a value's entry by ==, so setting the second shows, and hands back, the first.
    """
    for i, (label, value) in enumerate(pairs):
        for earlier_label, earlier in pairs[:i]:
            if label == earlier_label:
                raise ValueError(f"knob {knob_label!r}: options {earlier!r} and {value!r} both read {label!r} in "
                                 f"the menu; give them labels that tell them apart, as (label, value) pairs")
            if earlier is value or earlier == value:
                raise ValueError(f"knob {knob_label!r}: options {earlier_label!r} ({earlier!r}) and {label!r} "
                                 f"({value!r}) hold equal values, so the menu cannot tell them apart: choosing "
                                 f"{label!r} would show {earlier_label!r} and give {earlier!r}")


def is_slider(w: W.Widget) -> bool:
    """A horizontal slider of any kind (int, float, log, selection, range): what `stack_label` applies to."""
    return w._view_name.endswith("SliderView") and getattr(w, "orientation", "horizontal") == "horizontal"


def stack_label(slider: W.Widget) -> W.Widget:
    """Put `slider`'s label on its own line above the track: the label takes the full width, the track and the
    readout wrap to the next line. Idempotent; returns the slider. A Layout of its own, since panels share one
    Layout object among several controls and the others stay on one line."""
    if STACKED in slider._dom_classes:
        return slider
    slider.layout = W.Layout(width=slider.layout.width, flex_flow="row wrap", height="auto")
    slider.style.description_width = "100%"
    slider.add_class(STACKED)
    return slider


def track_px(slider_px: float, *, label_px: float | None = None) -> float:
    """The track of a slider `slider_px` wide: less the readout and the track's margins, and, for a label beside
    it (`label_px`; None: stacked above), less the label and its 8 px margin. Measured in Chromium: 167 px for
    a stacked 255 px slider, 16 px beside an 11em label (issue 33 §2)."""
    beside = 0.0 if label_px is None else label_px + 8
    return slider_px - beside - READOUT_PX - READOUT_MARGIN_PX - TRACK_MARGINS_PX


def control(name: str, k: Knob, value: Any) -> W.ValueWidget:
    """One widget for one knob, showing `value`."""
    style = {"description_width": LABEL_WIDTH}
    common = dict(description=k.label, style=style, layout=W.Layout(width=CONTROL_WIDTH))
    if k.options and all(isinstance(o, int) and not isinstance(o, bool) for o in k.options):
        # a slider over listed integers (e.g. parallel degrees 1, 2, 4, ..., 256): every stop is a listed
        # value, so a drag cannot land on 129, and a narrow track still reaches each one
        stops = sorted({*k.options, value})
        return W.SelectionSlider(options=stops, value=value, continuous_update=False, **common)
    if k.options:
        pairs = [o if isinstance(o, tuple) else (str(o), o) for o in k.options]
        _refuse_alike(k.label, pairs)
        none_label = next((label for label, v in pairs if v is None), None)
        if none_label is not None and none_label in [v for _, v in pairs]:
            raise ValueError(f"knob {k.label!r}: the None option's label {none_label!r} is also a value")
        options = [(label, label if v is None else v) for label, v in pairs]
        values = [v for _, v in options]
        shown = none_label if value is None else value
        if shown not in values:
            raise ValueError(f"{name}: value {value!r} is not among the knob's options {values}")
        if max(len(label) for label, _ in options) > LONG_OPTION:
            # a long choice ("A100 SXM, HDR InfiniBand") would be cut in the half a fixed label column leaves:
            # the label takes its own width and the menu the rest
            common["style"] = {"description_width": "initial"}
        return ChoiceDropdown(options=options, index=values.index(shown), none_label=none_label, **common)
    if k.toggle:
        return W.Checkbox(value=value, description=k.label, indent=False, layout=W.Layout(width=CONTROL_WIDTH))
    if k.text:
        return (W.IntText if isinstance(value, int) else W.FloatText)(value=value, **common)
    slider_args = dict(continuous_update=False, **common)
    if k.fmt:
        slider_args["readout_format"] = k.fmt
    if k.log:
        return GridLogSlider(k, value, **slider_args)
    if isinstance(value, int):
        return W.IntSlider(value=value, min=int(k.low), max=int(k.high), step=int(k.step or 1), **slider_args)
    return W.FloatSlider(value=value, min=k.low, max=k.high, step=k.step or (k.high - k.low) / 100, **slider_args)


def controls_for(config: Any) -> dict[str, W.ValueWidget]:
    """A widget per knob of a config dataclass instance, set to the instance's values."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"expected a config dataclass instance, got {type(config).__name__}")
    return {name: control(name, k, getattr(config, name)) for name, k in knobs(type(config)).items()}
