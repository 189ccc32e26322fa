"""The prediction prompts as widgets: ask first, and measure only when the learner acts.

A chapter asks `guess = Prediction("How many bytes will rank 2 send?", unit="B", low=0)`: the
question, the range its answer lies in, and a box (CSS class `wmdist-guess`). Further down, after
the text that sets the scene (never the answer), `guess.answer_with(measure)` shows the box again
(the same widget: what was typed above is there) with two buttons, "Check my guess" (class
`wmdist-check`) and "Show me the answer" (`wmdist-show`).

`measure` takes no arguments, runs the chapter's demo and returns an `Answer`; it is a function of
the chapter's `predictions` module, so the cell above the buttons states neither the formula nor
the why (they belong to the reveal). It runs when a
button is pressed, never on Run All, so neither the page nor the stored notebook shows the
answer before the learner acts; it runs once, and a second guess is compared with the same
measurement at once. A guess that cannot be used (empty, not a number, outside the stated range)
is not compared: the answer area says what was typed and why, and nothing is measured.

`check()` and `show()` are what the buttons call; they return the `Reveal` (None when the guess
cannot be used, with the reason in `.note`), so tests drive a prediction by setting `.value`.
How the box is read, echoed and revealed are methods (`_read`, `_echo`, `reveal`), so `Choice`
(choose.py) asks for one of a few names with the same box, buttons and answer area.
"""
from __future__ import annotations

import html
import traceback
from typing import Any, Callable

import ipywidgets as W

from wmdist.ui.predict import SHOWN, Answer, Bounds, Reveal, compare_guess, format_number, read_guess

WAITING = "nothing is measured until you press a button"


class Prediction:
    """A question with a number box; `answer_with(measure)` adds the buttons that answer it."""

    answer_type: type = Answer        # what measure() must return

    def __init__(self, question: str, unit: str = "", *, low: float | None = None, high: float | None = None,
                 placeholder: str = "your guess"):
        self.question, self.unit, self.bounds = question, unit, Bounds(low=low, high=high)
        self.box = W.Text(placeholder=placeholder, layout=W.Layout(width="10em"))
        self.box.add_class("wmdist-guess")
        self.status = W.Label()
        in_unit = f", in {self.box_unit}" if self.box_unit else ""
        prompt = W.HTML(f"<b>Predict:</b> {html.escape(question)} <i>({self._expects()}{in_unit})</i>")
        self.widget = W.VBox([prompt, W.HBox([self.box, W.Label(self.box_unit), self.status])])
        self.check_button = W.Button(description="Check my guess", button_style="primary", layout=W.Layout(width="auto"))
        self.show_button = W.Button(description="Show me the answer", layout=W.Layout(width="auto"))    # whole label
        self.check_button.add_class("wmdist-check")
        self.show_button.add_class("wmdist-show")
        self.out = W.Output()
        self.out.add_class("wmdist-answer")
        self.check_button.on_click(lambda _b: self._press(self.check))
        self.show_button.on_click(lambda _b: self._press(self.show))
        self.box.observe(lambda _change: self._box_changed(), "value")
        self.note = ""
        self._refused = False     # the answer area shows a Check's refusal (see _box_changed)
        self._measure: Callable[[], Answer] | None = None
        self._answer: Answer | None = None
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
        """The learner's number, or None (empty, not a number, or outside the stated range)."""
        return self._read()[0]

    @property
    def box_unit(self) -> str:
        """The unit written beside the box: the answer's."""
        return self.unit

    def _expects(self) -> str:
        """What the box takes, as the prompt and a refusal state it ("0 or more", "a number from 0 to 1")."""
        return self.bounds.text()

    def _read(self) -> tuple[Any, str]:
        """The usable guess in the box and "", or None and why not (a subclass reads other kinds of answer)."""
        return read_guess(self.box.value, self.bounds)

    def _echo(self, value: Any) -> str:
        """A usable guess as the status and the notes repeat it: the reveal's own format."""
        return format_number(value, unit=self.unit)

    def _update_status(self) -> None:
        value, why = self._read()
        if value is None:
            self.status.value = "" if not self.box.value.strip() else why
        else:
            self.status.value = f"your guess: {self._echo(value)}"

    def _box_changed(self) -> None:
        """The status beside the box, and a refusal in the answer area brought up to date with the box.

        The browser sends a button's click at once but holds a box's new value back while an earlier
        update of the box is unanswered (ipywidgets' sync throttle), so on a busy kernel a click can
        arrive before the value typed just before it and be judged on the old one (seen: "abc" typed,
        "no guess entered" shown). So while a Check's refusal is shown, each new value is judged
        again: still unusable, the refusal names it; usable, it is compared if the measurement is
        already there, and otherwise the note asks for the press (nothing is measured without one).
        """
        self._update_status()
        if not self._refused:
            return
        if self._answer is not None or self.guess is None:
            self._press(self.check, lock=False)       # nothing to measure: the buttons stay as they are
        else:
            self.note = (f"your guess: {self._echo(self.guess)}; press Check my guess to "
                         "compare it")
            self.out.outputs = ({"output_type": "stream", "name": "stdout", "text": self.note + "\n"},)

    def reveal(self, answer: Answer, *, unused: str = "") -> Reveal:
        """The box's guess, the formula and the measurement side by side (no guess: `unused` says why)."""
        value, why = self._read()
        if not self.box.value.strip():
            why = unused or why
        verdict = compare_guess(value, answer.measured, formula=answer.formula, unused=why)
        return Reveal(question=self.question, unit=self.unit, verdict=verdict, formula_text=answer.formula_text,
                      why=answer.why)

    def answer_with(self, measure: Callable[[], Answer]) -> Asking:
        """Show the box again with the buttons; `measure()` runs at the first press, not now."""
        if not callable(measure):
            raise TypeError(f"measure must be a function of no arguments returning an Answer, not {measure!r}")
        self._measure, self._answer, self.note, self._refused = measure, None, "", False
        self.out.outputs = ()
        return Asking(self)

    def _measured(self) -> Answer:
        if self._measure is None:
            raise RuntimeError("nothing to measure yet: run the cell that calls answer_with(...) first")
        if self._answer is None:
            answer = self._measure()
            if not isinstance(answer, self.answer_type):
                name = self.answer_type.__name__
                raise TypeError(f"measure() must return {'an' if name[0] in 'AEIOU' else 'a'} {name}, not "
                                f"{type(answer).__name__}")
            self._answer = answer
        return self._answer

    def check(self) -> Reveal | None:
        """Compare the typed guess with the measurement; None (and `.note` says why) if it cannot be used."""
        value, why = self._read()
        if value is None:
            self.note = (f"{why}. Type {self._expects()} in the box and press Check my guess again, "
                         "or press Show me the answer.")
            return None
        self.note = ""
        return self.reveal(self._measured())

    def show(self) -> Reveal:
        """The answer, with the typed guess compared if there is a usable one."""
        self.note = ""
        return self.reveal(self._measured(), unused=SHOWN)

    def _press(self, action: Callable[[], Reveal | None], *, lock: bool = True) -> None:
        """A button's work: measure (once) and show the reveal, or say why not, in the answer area.

        Written to the Output widget's `outputs` directly (not `with out:`), so it also works
        where no kernel captures output, as in the tests. `lock` disables both buttons while it works
        (a measurement takes seconds); a re-judge of the box that measures nothing leaves them alone,
        since a button the browser shows disabled for that instant swallows a click made in it.
        """
        if lock:
            self.check_button.disabled = self.show_button.disabled = True
        self._refused = False
        try:
            if lock and self._answer is None:
                self.out.outputs = ({"output_type": "stream", "name": "stdout", "text": "measuring...\n"},)
            try:
                result = action()
            except Exception:                    # a callback's exception would vanish into the kernel log
                self.out.outputs = ({"output_type": "stream", "name": "stderr", "text": traceback.format_exc()},)
                return
            self._refused = result is None and action == self.check
            if result is None:
                self.out.outputs = ({"output_type": "stream", "name": "stdout", "text": self.note + "\n"},)
            else:
                self.out.outputs = ({"output_type": "display_data", "metadata": {},
                                     "data": result._repr_mimebundle_()},)
        finally:
            if lock:
                self.check_button.disabled = self.show_button.disabled = False

    def __repr__(self) -> str:
        return f"Predict: {self.question} ({self._expects()}) [{self.box.value or '...'}] {self.box_unit}".rstrip()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = repr(self)
        return bundle


class Asking:
    """The answering half of a `Prediction` as a cell shows it: the box again, the buttons, the answer area."""

    def __init__(self, prediction: Prediction):
        p = prediction
        self.prediction = p
        self.widget = W.VBox([W.HBox([p.box, W.Label(p.box_unit), p.check_button, p.show_button]), p.out])

    def __repr__(self) -> str:
        return (f"Prediction: {self.prediction.question}\n  press Check my guess (or Show me the answer): "
                f"{WAITING}")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = repr(self)
        return bundle
