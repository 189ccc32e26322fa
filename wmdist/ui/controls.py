"""ipywidgets controls built from a config's knobs (wmdist.knobs), so ranges are stated once."""
from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as W

from wmdist.knobs import Knob, knobs

LABEL_WIDTH = "11em"
CONTROL_WIDTH = "22em"


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
        values = [o[1] if isinstance(o, tuple) else o for o in k.options]
        # by index: a Dropdown given value=None shows nothing selected, though ("same", None) is an option
        return W.Dropdown(options=list(k.options), index=values.index(value), **common)
    if k.toggle:
        return W.Checkbox(value=value, description=k.label, indent=False, layout=W.Layout(width=CONTROL_WIDTH))
    if k.text:
        return (W.IntText if isinstance(value, int) else W.FloatText)(value=value, **common)
    slider_args = dict(continuous_update=False, **common)
    if k.fmt:
        slider_args["readout_format"] = k.fmt
    if k.log:
        low, high = k.exponents
        return W.FloatLogSlider(value=value, base=10, min=low, max=high, step=k.step or 0.05, **slider_args)
    if isinstance(value, int):
        return W.IntSlider(value=value, min=int(k.low), max=int(k.high), step=int(k.step or 1), **slider_args)
    return W.FloatSlider(value=value, min=k.low, max=k.high, step=k.step or (k.high - k.low) / 100, **slider_args)


def controls_for(config: Any) -> dict[str, W.ValueWidget]:
    """A widget per knob of a config dataclass instance, set to the instance's values."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"expected a config dataclass instance, got {type(config).__name__}")
    return {name: control(name, k, getattr(config, name)) for name, k in knobs(type(config)).items()}
