"""Ask before telling: the learner commits to a number, then the run shows how far off it was.

A chapter puts `guess = Prediction("How many bytes will rank 2 send?", unit="B")` before its
main run: a question and a small text box (CSS class `wmdist-guess`). After the run,
`guess.reveal(measured=..., formula=..., formula_text=..., why=...)` shows the guess, the
formula and the measurement side by side, how far off the guess was (signed relative error and
ratio), and a pointer to the sentence that explains the difference (CSS class `wmdist-reveal`).

The comparison itself is pure: `parse_guess` reads the box, `compare` turns guess, formula and
measurement into a frozen `Verdict`, and `verdict_text` / `verdict_html` render it, with no
timestamps or widget ids, so a reveal without a guess ("no guess entered") prints the same on
every run and nbval can store it. Only the question and its box are a widget; the reveal is a
static record of the comparison (run its cell again after changing the guess).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import ipywidgets as W

NO_GUESS = "no guess entered"
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


@dataclass(frozen=True)
class Verdict:
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


def compare(guess: float | None, measured: float, *, formula: float | None = None) -> Verdict:
    """How far `guess` (None: no guess) and `formula` are from `measured`, with a one-line summary."""
    measured = float(measured)
    formula = None if formula is None else float(formula)
    if guess is None:
        return Verdict(None, measured, formula, None, None, None,
                       None if formula is None else _relative(formula, measured), NO_GUESS)
    guess = float(guess)
    rel = _relative(guess, measured)
    ratio = None if measured == 0 else guess / measured
    if guess == measured:
        summary = "exactly right"
    elif rel is None:
        summary = f"off by {format_number(guess - measured)} (the measurement is 0)"
    else:
        side = "above" if rel > 0 else "below"
        word = "close: " if abs(rel) <= CLOSE else ""
        summary = f"{word}{_percent(rel)} {side} the measurement ({ratio:.3g}x it)"
    return Verdict(guess, measured, formula, guess - measured, rel, ratio,
                   None if formula is None else _relative(formula, measured), summary)


def format_number(x: float, *, unit: str = "") -> str:
    """`x` with thousands separators when it is a whole number, else 4 significant digits."""
    body = f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"
    return f"{body} {unit}".rstrip()


def _percent(rel: float) -> str:
    """|rel| as a percentage with 3 significant digits (33.3%, 0.000333%)."""
    return f"{abs(rel) * 100:.3g}%"


def _formula_line(v: Verdict) -> str:
    if v.formula is None:
        return ""
    if v.formula == v.measured:
        return "equals the measurement"
    if v.formula_relative_error is None:
        return f"differs from the measurement by {format_number(v.formula - v.measured)}"
    side = "above" if v.formula_relative_error > 0 else "below"
    return f"{_percent(v.formula_relative_error)} {side} the measurement"


def _rows(v: Verdict, unit: str, formula_text: str) -> list[tuple[str, str, str]]:
    guess = "-" if v.guess is None else format_number(v.guess, unit=unit)
    rows = [("your guess", guess, v.summary)]
    if v.formula is not None:
        name = f"formula {formula_text}".rstrip()
        rows.append((name, format_number(v.formula, unit=unit), _formula_line(v)))
    rows.append(("measured", format_number(v.measured, unit=unit), "this run"))
    return rows


def verdict_text(question: str, v: Verdict, *, unit: str = "", formula_text: str = "", why: str = "") -> str:
    """The plain-text view of a reveal (what nbval and static renderers show)."""
    rows = _rows(v, unit, formula_text)
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    lines = [f"Prediction: {question}"]
    lines += [f"  {a:{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows]
    if why:
        lines.append(f"  why: {why}")
    return "\n".join(lines)


def verdict_html(question: str, v: Verdict, *, unit: str = "", formula_text: str = "", why: str = "") -> str:
    """The HTML view of a reveal: a small table inside a div of class `wmdist-reveal`."""
    e = html.escape
    cells = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{e(a)}</th>"
                    f"<td style='text-align:right;padding-right:1em'>{e(b)}</td><td>{e(c)}</td></tr>"
                    for a, b, c in _rows(v, unit, formula_text))
    tail = f"<div><i>why:</i> {e(why)}</div>" if why else ""
    return (f"<div class='wmdist-reveal'><div><b>Prediction:</b> {e(question)}</div>"
            f"<table>{cells}</table>{tail}</div>")


@dataclass(frozen=True)
class Reveal:
    """The answer to one `Prediction`, for the guess that was in its box when `reveal` ran.

    Static on purpose: a notebook stores it as plain text and HTML (class `wmdist-reveal`), the
    same on every run without a guess, with no widget id that a freshly opened notebook could
    not find. To compare a new guess, run the reveal cell again.
    """

    question: str
    unit: str
    verdict: Verdict
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


class Prediction:
    """A question and a number box (class `wmdist-guess`); `reveal(...)` compares the guess with a run.

    Set the guess by typing in the box or with `.value = "6000"`; `.guess` is the number read from
    it (None when empty or unreadable, in which case `.status` says why).
    """

    def __init__(self, question: str, unit: str = "", placeholder: str = "your guess"):
        self.question, self.unit = question, unit
        self.box = W.Text(placeholder=placeholder, layout=W.Layout(width="10em"))
        self.box.add_class("wmdist-guess")
        self.status = W.Label()
        prompt = W.HTML(f"<b>Predict:</b> {html.escape(question)}")
        self.widget = W.VBox([prompt, W.HBox([self.box, W.Label(unit), self.status])])
        self.box.observe(lambda _change: self._update_status(), "value")
        self._update_status()

    @property
    def value(self) -> str:
        """The text in the box."""
        return self.box.value

    @value.setter
    def value(self, text: str) -> None:
        self.box.value = str(text)

    @property
    def guess(self) -> float | None:
        """The learner's number, or None (empty box, or text that is not a number)."""
        try:
            return parse_guess(self.box.value)
        except ValueError:
            return None

    def _update_status(self) -> None:
        try:
            g = parse_guess(self.box.value)
        except ValueError as err:
            self.status.value = str(err)
            return
        self.status.value = "" if g is None else f"your guess: {format_number(g, unit=self.unit)}; the reveal cell compares it"

    def reveal(self, measured: float, *, formula: float | None = None, formula_text: str = "",
               why: str = "") -> Reveal:
        """The guess, the formula and the measurement side by side, and what explains the gap."""
        return Reveal(self.question, self.unit, compare(self.guess, measured, formula=formula), formula_text, why)

    def __repr__(self) -> str:
        return f"Predict: {self.question} [{self.box.value or '...'}] {self.unit}".rstrip()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = repr(self)
        return bundle
