"""A prediction whose answer is one of a few names ("dp", "tp", "pp" or "cp"), not a number.

`Choice("Which axis will rank 0 send the most bytes along?", ("dp", "tp", "pp", "cp"), unit="B")`
asks like `Prediction` (the same box, class `wmdist-guess`, the same two buttons and answer area,
nothing measured before a press): the learner types one of the names. `measure()` returns a
`ChoiceAnswer`: the name the run picked, the name the formulas pick, and each name's measured
value (say, the bytes per axis), which the reveal lists so the learner sees by how much.

The pure half is here too: `read_choice` reads the box against the names, `choice_rows` and
`choice_text` / `choice_html` render the reveal.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from wmdist.ui.ask import Prediction
from wmdist.ui.predict import NO_GUESS, format_number


def read_choice(text: str, choices: tuple[str, ...]) -> tuple[str | None, str]:
    """The name typed in `text` (case and spaces ignored) and "", or None and why it cannot be used."""
    typed = text.strip()
    if not typed:
        return None, NO_GUESS
    for name in choices:
        if typed.lower() == name.lower():
            return name, ""
    return None, f"not used: you typed {typed!r}, which is not one of {', '.join(choices)}"


@dataclass(frozen=True, kw_only=True)
class ChoiceAnswer:
    """A choice's measurement: the name the run picked, the one the formulas pick, and each name's value."""

    measured: str
    formula: str | None = None
    values: dict[str, float] = field(default_factory=dict)     # name -> its measured value, shown in the reveal
    formula_text: str = ""
    why: str = ""


def choice_rows(guess: str | None, unused: str, answer: ChoiceAnswer, unit: str) -> list[tuple[str, str, str]]:
    """The reveal's rows: the guess and whether it was right, the formulas' pick, the measured pick, each value."""
    verdict = unused if guess is None else "exactly right" if guess == answer.measured else \
        f"not it: the run picked {answer.measured}"
    rows = [("your guess", guess or "-", verdict)]
    if answer.formula is not None:
        agrees = "equals the measurement" if answer.formula == answer.measured else "differs from the measurement"
        rows.append((f"formula {answer.formula_text}".rstrip(), answer.formula, agrees))
    rows.append(("measured", answer.measured, "this run"))
    rows += [(f"  {name}", format_number(value, unit=unit), "") for name, value in answer.values.items()]
    return rows


def choice_text(question: str, rows: list[tuple[str, str, str]], why: str) -> str:
    """The plain-text view of a choice's reveal."""
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    lines = [f"Prediction: {question}"] + [f"  {a:{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
    return "\n".join(lines + ([f"  why: {why}"] if why else []))


def choice_html(question: str, rows: list[tuple[str, str, str]], why: str) -> str:
    """The HTML view: the same table as a number's reveal, in a div of class `wmdist-reveal`."""
    e = html.escape
    cells = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{e(a)}</th>"
                    f"<td style='text-align:left;padding-right:1em'>{e(b)}</td>"
                    f"<td style='text-align:left'>{e(c)}</td></tr>" for a, b, c in rows)
    tail = f"<div><i>why:</i> {e(why)}</div>" if why else ""
    return f"<div class='wmdist-reveal'><div><b>Prediction:</b> {e(question)}</div><table>{cells}</table>{tail}</div>"


@dataclass(frozen=True)
class ChoiceReveal:
    """A choice's answer beside the guess that was in its box: a static record, text and HTML."""

    question: str
    guess: str | None
    rows: tuple[tuple[str, str, str], ...]
    why: str = ""

    @property
    def right(self) -> bool:
        return self.rows[0][2] == "exactly right"

    @property
    def text(self) -> str:
        return choice_text(self.question, list(self.rows), self.why)

    @property
    def html(self) -> str:
        return choice_html(self.question, list(self.rows), self.why)

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": self.html}


class Choice(Prediction):
    """A question answered by one of `choices`; `unit` is the unit of the values the reveal lists."""

    answer_type = ChoiceAnswer

    def __init__(self, question: str, choices: tuple[str, ...], unit: str = "", *, placeholder: str = "your guess"):
        if len(choices) < 2 or len(set(c.lower() for c in choices)) != len(choices):
            raise ValueError(f"choices must be two or more different names, not {choices!r}")
        self.choices = tuple(choices)
        super().__init__(question, unit, placeholder=placeholder)

    @property
    def box_unit(self) -> str:
        return ""                        # `unit` is the listed values', not the answer's: a name has none

    def _expects(self) -> str:
        return "one of " + ", ".join(self.choices)

    def _read(self) -> tuple[str | None, str]:
        return read_choice(self.box.value, self.choices)

    def _echo(self, value: Any) -> str:
        return str(value)

    def reveal(self, answer: ChoiceAnswer, *, unused: str = "") -> ChoiceReveal:   # type: ignore[override]
        value, why = self._read()
        if not self.box.value.strip():
            why = unused or why
        return ChoiceReveal(self.question, value, tuple(choice_rows(value, why, answer, self.unit)), answer.why)
