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


@dataclass(frozen=True, kw_only=True)
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


DEFAULT_LOG_STEP = 0.05      # decades per slider stop: 20 stops a decade, each 12% above the one before


@dataclass(frozen=True)
class LogGrid:
    """The stops of a log slider: anchor * 10 ** (n * step) for n in [-below, above], the anchor one of them.

    A browser slider snaps to min + n * step; if min were log10(low), a default
    between two stops (3e-3 on a grid of 0.05 from 1e-7) would come back from
    one step right and one left as the nearest stop (3.16e-3). Anchoring the
    grid at the default keeps it a stop, and `snap` turns the float the browser
    computed for a stop (10 ** exponent, off in the last digits) into the stop
    itself, so the anchor comes back exactly.
    """
    anchor: float
    step: float
    below: int
    above: int

    @property
    def exponents(self) -> tuple[float, float]:
        """(min, max) exponents of the slider: its lowest and highest stop."""
        e = math.log10(self.anchor)
        return e - self.below * self.step, e + self.above * self.step

    def stop(self, n: int) -> float:
        """The value of stop n (n = 0: the anchor itself, exactly)."""
        if not -self.below <= n <= self.above:
            raise ValueError(f"stop {n} outside [-{self.below}, {self.above}]")
        return self.anchor if n == 0 else self.anchor * 10 ** (n * self.step)

    def snap(self, value: float) -> float:
        """`value` as the stop it stands for: within float rounding of stop n (relative 1e-9, far closer than the
        next stop) it becomes stop n exactly; any other value (e.g. a fitted number set by code) is unchanged."""
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            return value
        n = round(math.log10(value / self.anchor) / self.step)
        if not -self.below <= n <= self.above:
            return value
        stop = self.stop(n)
        return stop if math.isclose(value, stop, rel_tol=1e-9) else value


def log_grid(k: Knob, value: float) -> LogGrid:
    """The stops of `k`'s log slider through `value`: every stop within [k.low, k.high] (ValueError if `value`
    is outside it or `k` is not a log knob)."""
    if not k.log:
        raise ValueError(f"knob {k.label!r} is not a log slider")
    if not (isinstance(value, (int, float)) and k.low <= value <= k.high):
        raise ValueError(f"knob {k.label!r}: value {value!r} outside [{k.low}, {k.high}]")
    step = k.step or DEFAULT_LOG_STEP
    e, (low, high) = math.log10(value), k.exponents
    fuzz = 1e-9                                  # an end exactly n steps away counts as a stop
    return LogGrid(anchor=float(value), step=step, below=math.floor((e - low) / step + fuzz),
                   above=math.floor((high - e) / step + fuzz))


def pow2(low: int, high: int) -> tuple[int, ...]:
    """Slider stops 2**low .. 2**high, for a knob's `options`."""
    return tuple(2 ** i for i in range(low, high + 1))


def knob(default: Any, label: str, **how: Any) -> Any:
    """A dataclass field with a default and the Knob that describes its control."""
    if isinstance(default, bool):
        how["toggle"] = True
    return dataclasses.field(default=default, metadata={"knob": Knob(label=label, **how)})


def knobs(config_type: type) -> dict[str, Knob]:
    """The fields of a config dataclass that have a knob, in declaration order."""
    return {f.name: f.metadata["knob"] for f in dataclasses.fields(config_type) if "knob" in f.metadata}
