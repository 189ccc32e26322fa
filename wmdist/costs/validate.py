"""Argument checks shared by every formula and config: one place, one wording.

Each returns the value it accepts, so a dataclass can validate and normalise
in one line, and raises ValueError naming the argument and what was expected.
Integer-like numpy scalars are accepted (learners compute sizes with numpy);
bools are refused, since True silently means 1.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable


def _is_int(value: Any) -> bool:
    # A plain int first: the planner's search checks hundreds of thousands of sizes, and the abstract-class
    # test below costs ten times as much (a bool's type is bool, never int, so it still falls through).
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def require_int(name: str, value: int, low: int, *, high: int | None = None) -> int:
    """Return `value` as an int if it is an integer in [low, high] (bools refused), else a ValueError naming `name`."""
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def require_fields(config: Any, names: Iterable[str], low: int) -> None:
    """Each named field of `config` (a dataclass being built) an integer >= low; a ValueError names the first not."""
    for name in names:
        require_int(name, getattr(config, name), low)


def require_heads(width: int, heads: int) -> int:
    """The head dimension width / heads, if `heads` divides `width` (a ValueError naming both otherwise)."""
    if width % heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}")
    return width // heads


def require_real(name: str, value: float, *, low: float = 0.0, high: float | None = None) -> float:
    """Return `value` as a float if it is a finite number in [low, high], else a ValueError naming `name`."""
    ok = (type(value) in (float, int) or (isinstance(value, numbers.Real) and not isinstance(value, bool))) \
        and math.isfinite(value)
    if not ok or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def require_positive(name: str, value: float) -> float:
    """Return `value` as a float if it is a finite number > 0."""
    v = require_real(name, value)
    if v == 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def require_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return `value` if it is one of `choices`, else a ValueError listing them."""
    options = tuple(choices)
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in options) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def require_bool(name: str, value: Any) -> bool:
    """Return `value` if it is True or False (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value
