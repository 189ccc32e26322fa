"""Ask before telling: the learner commits to a number, then the run shows how far off it was.

The pure half of the prediction prompts (the widgets are in ask.py): `read_guess` reads the box
against the range the question states, `compare_guess` turns guess, formula and measurement into a
frozen `GuessComparison`, and `verdict_text` / `verdict_html` render it, with no timestamps or widget
ids. An `Answer` is what a chapter's measurement hands back; a `Reveal` is the rendered record.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any


NO_GUESS = "no guess entered"
SHOWN = "shown without a guess"
CLOSE = 0.10          # a guess within 10 % of the measurement is called close


def parse_guess(text: str) -> float | None:
    """The number in `text`, or None for an empty box.

    Accepts what a learner types: `6000`, `6,000`, `6 000`, `6e3`, a fraction `3/11` and a
    percentage `27%` (read as 0.27). Raises ValueError for anything else, so the box can say so
    instead of silently treating a typo as "no guess".
    """
    s = text.strip().replace(",", "").replace("_", "").replace(" ", "")
    if not s:
        return None
    scale = 1.0
    if s.endswith("%"):
        s, scale = s[:-1], 0.01
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(s)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"cannot read {text.strip()!r} as a number") from None
    if not math.isfinite(value):
        raise ValueError(f"cannot read {text.strip()!r} as a finite number")
    return value * scale


@dataclass(frozen=True, kw_only=True)
class GuessComparison:
    """Guess, formula and measurement side by side, and how far the guess and formula were off.

    `relative_error` is (guess - measured) / |measured|, signed (positive: the guess was high);
    `ratio` is guess / measured. Both are None without a guess or with a zero measurement (then
    `difference`, guess - measured, still says how far off it was).
    """

    guess: float | None
    measured: float
    formula: float | None
    difference: float | None
    relative_error: float | None
    ratio: float | None
    formula_relative_error: float | None
    summary: str


def _relative(value: float, measured: float) -> float | None:
    return None if measured == 0 else (value - measured) / abs(measured)


def compare_guess(guess: float | None, measured: float, *, formula: float | None = None, unused: str = NO_GUESS) -> GuessComparison:
    """How far `guess` (None: no guess; `unused` says why) and `formula` are from `measured`."""
    measured = float(measured)
    formula = None if formula is None else float(formula)
    formula_rel = None if formula is None else _relative(formula, measured)
    if guess is None:
        return GuessComparison(guess=None, measured=measured, formula=formula, difference=None, relative_error=None,
                       ratio=None, formula_relative_error=formula_rel, summary=unused)
    guess = float(guess)
    ratio = None if measured == 0 else guess / measured
    return GuessComparison(guess=guess, measured=measured, formula=formula, difference=guess - measured,
                   relative_error=_relative(guess, measured), ratio=ratio, formula_relative_error=formula_rel,
                   summary=how_far(guess, measured))


def how_far(value: float, measured: float) -> str:
    """How far `value` is from `measured`, as a learner reads it.

    Equal at the digits the reveal prints (`same_when_shown`): "exactly right", so typing the value
    the reveal shows is right. Within 2x either way as a percentage (a guess within 10 % is called
    close); beyond that as a
    multiple ("87x the measurement", "0.25x the measurement"); a value under 1 % of the
    measurement is "about 0", and one of the other sign says so, never a negative multiple.
    """
    if value == measured or same_when_shown(value, measured):
        return "exactly right"
    if measured == 0:
        return f"off by {format_number(value - measured)} (the measurement is 0)"
    ratio = value / measured
    if ratio < 0:
        return f"{format_number(value)}: the other sign from the measurement"
    if ratio < 0.01:
        return "about 0: far below the measurement"
    if 0.5 <= ratio <= 2:
        rel = (value - measured) / abs(measured)
        side = "above" if rel > 0 else "below"
        word = "close: " if abs(rel) <= CLOSE else ""
        return f"{word}{_percent(rel)} {side} the measurement"
    times = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.2g}"
    return f"{times}\u00d7 the measurement"


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """The range a question's answer lies in (None: open on that side), stated in its prompt."""

    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        """How the prompt states the range: "a number from 0 to 1", "0 or more", "any number"."""
        lo, hi = (None if b is None else format_number(b) for b in (self.low, self.high))
        if lo is not None and hi is not None:
            return f"a number from {lo} to {hi}"
        if lo is not None:
            return f"{lo} or more"
        return "any number" if hi is None else f"{hi} or less"

    def refuses(self, value: float) -> str:
        """Why `value` is outside the range ("" when it is inside)."""
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            return f"outside the range (the answer is {self.text()})"
        return ""


def read_guess(text: str, bounds: Bounds) -> tuple[float | None, str]:
    """The guess in `text` and "", or None and why it cannot be used (empty, unreadable, out of range)."""
    typed = text.strip()
    try:
        value = parse_guess(text)
    except ValueError:
        return None, f"not used: you typed {typed!r}, which is not a number"
    if value is None:
        return None, NO_GUESS
    why = bounds.refuses(value)
    return (None, f"not used: you typed {typed!r}, {why}") if why else (value, "")


def format_number(x: float, *, unit: str = "") -> str:
    """`x` as every echo and reveal prints it: one format for a guess, a formula and a measurement.

    From 1,000 up (and for any whole number) a whole number with thousands separators (18,022 B,
    never 1.802e+04 B); below, 4 significant digits in plain notation (0.1694, 411.8). Only the
    extremes, under 1e-4 or from 1e15 up, take an exponent.
    """
    x = float(x)
    big = 1000 <= abs(float(f"{x:.4g}")) < 1e15           # 999.97 rounds to 1,000, not 1000
    body = f"{round(x):,}" if (big or x.is_integer()) and abs(x) < 1e15 else f"{x:.4g}"
    return f"{body} {unit}".rstrip()


def same_when_shown(guess: float, measured: float) -> bool:
    """Whether `guess` equals `measured` at the digits the reveal prints (format_number): typing the
    value the reveal shows, 0.1694 for a measured 0.169412, is exactly right; 0.1695 is not."""
    return format_number(guess) == format_number(measured)


def _percent(rel: float) -> str:
    """|rel| as a percentage with 3 significant digits (33.3%, 0.000333%)."""
    return f"{abs(rel) * 100:.3g}%"


def _formula_line(v: GuessComparison) -> str:
    if v.formula is None:
        return ""
    if v.formula == v.measured:
        return "equals the measurement"
    if v.formula_relative_error is None:
        return f"differs from the measurement by {format_number(v.formula - v.measured)}"
    if abs(v.formula_relative_error) < 0.01:       # rounding-size gaps read as a percentage, not "close"
        side = "above" if v.formula_relative_error > 0 else "below"
        return f"{_percent(v.formula_relative_error)} {side} the measurement"
    return how_far(v.formula, v.measured)


def _rows(v: GuessComparison, unit: str, formula_text: str) -> list[tuple[str, str, str]]:
    guess = "-" if v.guess is None else format_number(v.guess, unit=unit)
    rows = [("your guess", guess, v.summary)]
    if v.formula is not None:
        name = f"formula {formula_text}".rstrip()
        rows.append((name, format_number(v.formula, unit=unit), _formula_line(v)))
    rows.append(("measured", format_number(v.measured, unit=unit), "this run"))
    return rows


def verdict_text(question: str, v: GuessComparison, *, unit: str = "", formula_text: str = "", why: str = "") -> str:
    """The plain-text view of a reveal (what nbval and static renderers show)."""
    rows = _rows(v, unit, formula_text)
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    lines = [f"Prediction: {question}"]
    lines += [f"  {a:{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
    if why:
        lines.append(f"  why: {why}")
    return "\n".join(lines)


def verdict_html(question: str, v: GuessComparison, *, unit: str = "", formula_text: str = "", why: str = "") -> str:
    """The HTML view of a reveal: a small table inside a div of class `wmdist-reveal`."""
    e = html.escape
    cells = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{e(a)}</th>"
                    f"<td style='text-align:left;padding-right:1em'>{e(b)}</td>"
                    f"<td style='text-align:left'>{e(c)}</td></tr>"
                    for a, b, c in _rows(v, unit, formula_text))
    tail = f"<div><i>why:</i> {e(why)}</div>" if why else ""
    return (f"<div class='wmdist-reveal'><div><b>Prediction:</b> {e(question)}</div>"
            f"<table>{cells}</table>{tail}</div>")


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What a chapter's measurement hands its prediction: the measured value, the formula's, why they differ."""

    measured: float
    formula: float | None = None
    formula_text: str = ""
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class Reveal:
    """One prediction's answer set beside the guess that was in its box: a static record.

    It renders as plain text and HTML (class `wmdist-reveal`) with no widget id, the same for the
    same guess on every run.
    """

    question: str
    unit: str
    verdict: GuessComparison
    formula_text: str = ""
    why: str = ""

    @property
    def text(self) -> str:
        return verdict_text(self.question, self.verdict, unit=self.unit, formula_text=self.formula_text, why=self.why)

    @property
    def html(self) -> str:
        return verdict_html(self.question, self.verdict, unit=self.unit, formula_text=self.formula_text, why=self.why)

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": self.html}


