"""Slider ranges stated once, next to the config they drive (pure: no widgets here).

A config dataclass declares each user-facing field with `knob(...)`: its
default, a label and the range a control offers. Validation stays in the
config's __post_init__ (it may accept more than a slider shows); the panel
base (wmdist.ui) builds its controls from these declarations, so a slider
cannot drift from the config it sets.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """How a control for one config field looks: label, range, step, log scale, options, readout."""
    label: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False                 # slider moves the exponent: low..high are values, not exponents
    options: tuple[Any, ...] = ()     # a choice among these instead of a range
    fmt: str | None = None            # readout format, e.g. ".2e"
    text: bool = False                # a typed-in number instead of a slider
    toggle: bool = False              # a checkbox (set by `knob` for boolean fields)

    def __post_init__(self) -> None:
        if not (self.options or self.text or self.toggle) and (self.low is None or self.high is None):
            raise ValueError(f"knob {self.label!r}: a slider needs low and high")
        if self.log and (self.low is None or self.low <= 0):
            raise ValueError(f"knob {self.label!r}: a log slider needs low > 0")
        if self.low is not None and self.high is not None and self.high < self.low:
            raise ValueError(f"knob {self.label!r}: high {self.high} < low {self.low}")

    @property
    def exponents(self) -> tuple[float, float]:
        """(log10 low, log10 high) for a log slider."""
        return math.log10(self.low), math.log10(self.high)


def knob(default: Any, label: str, **how: Any) -> Any:
    """A dataclass field with a default and the Knob that describes its control."""
    if isinstance(default, bool):
        how["toggle"] = True
    return dataclasses.field(default=default, metadata={"knob": Knob(label, **how)})


def knobs(config_type: type) -> dict[str, Knob]:
    """The fields of a config dataclass that have a knob, in declaration order."""
    return {f.name: f.metadata["knob"] for f in dataclasses.fields(config_type) if "knob" in f.metadata}
