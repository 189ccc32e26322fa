"""The prediction widget: the pure comparison, its text and HTML views, and the widgets driven by `.value`."""
from __future__ import annotations

import pytest

from wmdist.ui import Answer, Prediction
from wmdist.ui.predict import (NO_GUESS, Bounds, compare_guess, format_number, how_far, parse_guess, same_when_shown,
                                 verdict_html, verdict_text)

QUESTION = "How many bytes will rank 2 send in this ring all-reduce?"


@pytest.mark.parametrize("text, value", [("6000", 6000.0), ("6,000", 6000.0), (" 6 000 ", 6000.0),
                                         ("6e3", 6000.0), ("3/11", 3 / 11), ("27%", 0.27), ("-2.5", -2.5),
                                         ("", None), ("   ", None)])
def test_parse_guess_reads_what_a_learner_types(text, value):
    assert parse_guess(text) == pytest.approx(value) if value is not None else parse_guess(text) is None


@pytest.mark.parametrize("text", ["abc", "6 kB", "1/0", "nan", "inf", "1/2/3"])
def test_parse_guess_refuses_non_numbers(text):
    with pytest.raises(ValueError, match="cannot read"):
        parse_guess(text)


def test_compare_signs_the_error_and_gives_the_ratio():
    low = compare_guess(4000, 6000, formula=6000)
    assert low.relative_error == pytest.approx(-1 / 3) and low.ratio == pytest.approx(2 / 3)
    assert low.difference == -2000 and "33.3% below" in low.summary
    high = compare_guess(6600, 6000)
    assert high.relative_error == pytest.approx(0.1) and "above" in high.summary and high.summary.startswith("close")
    assert compare_guess(6000, 6000).summary == "exactly right"
    assert compare_guess(6000, 6000).relative_error == 0.0


def test_compare_without_a_guess_still_gives_the_answer():
    v = compare_guess(None, 0.29, formula=3 / 11)
    assert v.guess is None and v.relative_error is None and v.ratio is None and v.summary == NO_GUESS
    assert v.measured == 0.29 and v.formula == pytest.approx(3 / 11)
    assert v.formula_relative_error == pytest.approx((3 / 11 - 0.29) / 0.29)


def test_compare_with_a_zero_measurement_reports_the_difference():
    v = compare_guess(3, 0)
    assert v.relative_error is None and v.ratio is None and v.difference == 3 and "off by 3" in v.summary


def test_text_view_is_deterministic_and_names_everything():
    v = compare_guess(None, 6000, formula=6000)
    text = verdict_text(QUESTION, v, unit="B", formula_text="2(N-1)/N G", why="see 'Why' above")
    assert text == verdict_text(QUESTION, compare_guess(None, 6000, formula=6000), unit="B", formula_text="2(N-1)/N G",
                                 why="see 'Why' above")
    assert QUESTION in text and NO_GUESS in text and "6,000 B" in text and "2(N-1)/N G" in text
    assert "equals the measurement" in text and "why: see 'Why' above" in text
    html = verdict_html(QUESTION, compare_guess(4000, 6000, formula=6000), unit="B", formula_text="f<x>", why="w")
    assert "class='wmdist-reveal'" in html and "f&lt;x&gt;" in html and "33.3% below" in html


def test_format_number():
    assert format_number(12628, unit="B") == "12,628 B" and format_number(0.2727, unit="") == "0.2727"
    assert format_number(3.0) == "3"


def test_widget_classes_and_value():
    guess = Prediction(QUESTION, unit="B", low=0)
    assert "wmdist-guess" in guess.box._dom_classes
    assert guess.guess is None and guess.status.value == ""
    guess.value = "6,000"
    assert guess.box.value == "6,000" and guess.guess == 6000 and "6,000 B" in guess.status.value
    guess.value = "lots"
    assert guess.guess is None and "not a number" in guess.status.value
    guess.value = "-5"
    assert guess.guess is None and "0 or more" in guess.status.value
    bundle = guess._repr_mimebundle_()
    assert QUESTION in bundle["text/plain"] and "0 or more" in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle


@pytest.mark.parametrize("low, high, stated", [(0, None, "0 or more"), (0, 1, "a number from 0 to 1"),
                                               (None, None, "any number"), (None, 5, "5 or less")])
def test_each_prompt_states_its_range(low, high, stated):
    assert Bounds(low=low, high=high).text() == stated
    assert f"({stated}" in repr(Prediction(QUESTION, low=low, high=high))


class Measure:
    """A stand-in for a chapter's run: counts how often it ran."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> Answer:
        self.calls += 1
        return Answer(measured=600020, formula=600018, formula_text="2(N-1)G/N", why="see above")


def test_nothing_is_measured_until_a_button_is_pressed_and_then_once():
    guess, measure = Prediction(QUESTION, unit="B", low=0), Measure()
    asking = guess.answer_with(measure)
    text = asking._repr_mimebundle_()["text/plain"]
    assert measure.calls == 0 and "600" not in text and "Check my guess" in text
    guess.value = "400000"
    reveal = guess.check()
    assert measure.calls == 1 and reveal.verdict.guess == 400000
    assert reveal.verdict.relative_error == pytest.approx(400000 / 600020 - 1)
    assert "33.3% below" in reveal.text and "33.3% below" in reveal.html
    guess.value = "600020"
    assert guess.check().verdict.summary == "exactly right" and measure.calls == 1    # the same measurement
    guess.answer_with(measure)                                                        # the cell run again
    guess.show()
    assert measure.calls == 2


@pytest.mark.parametrize("typed, why", [("", "no guess entered"), ("abc", "you typed 'abc', which is not a number"),
                                        ("-5", "you typed '-5', outside the range (the answer is 0 or more)")])
def test_a_guess_that_cannot_be_used_is_not_compared_and_says_why(typed, why):
    guess, measure = Prediction(QUESTION, unit="B", low=0), Measure()
    guess.answer_with(measure)
    guess.value = typed
    assert guess.check() is None and measure.calls == 0
    assert why in guess.note and "0 or more" in guess.note
    shown = guess.show()                                 # "show me" still answers, and says why the guess was left out
    assert shown.verdict.guess is None and measure.calls == 1
    assert ("shown without a guess" if not typed else why) in shown.text


def _answer_area(guess: Prediction) -> str:
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in guess.out.outputs)


def test_a_click_that_overtakes_the_typed_value_is_judged_again_when_the_value_arrives():
    """The browser's order on a busy kernel: Check pressed, then the value typed before it arrives.

    The refusal of the old value must not stay (seen in the browser: "abc" typed, "no guess entered"
    shown); nothing is measured without a press, and a measurement already made is compared at once."""
    guess, measure = Prediction(QUESTION, unit="B", low=0), Measure()
    guess.answer_with(measure)
    guess._press(guess.check)                            # the click, judged on the empty box
    assert "no guess entered" in _answer_area(guess) and measure.calls == 0
    guess.value = "abc"                                  # the value typed before the click, arriving late
    assert "not a number" in _answer_area(guess) and "no guess entered" not in _answer_area(guess)
    guess.value = "400000"
    assert "press Check my guess to compare it" in _answer_area(guess) and measure.calls == 0
    guess._press(guess.check)
    assert "33.3% below" in _answer_area(guess) and measure.calls == 1
    guess.value = "abc"                                  # a reveal on screen is left alone by typing
    assert "33.3% below" in _answer_area(guess)
    guess._press(guess.check)
    guess.value = "600020"                               # after a refusal, with the measurement there
    assert "exactly right" in _answer_area(guess) and measure.calls == 1


def test_a_rejudge_of_the_box_leaves_the_buttons_enabled():
    """A re-judge measures nothing, so it must not disable the buttons: a browser that shows them disabled for
    that instant drops a Show me the answer clicked in it (seen: the reveal never came). A press that measures
    still disables both while it works."""
    guess, measure = Prediction(QUESTION, unit="B", low=0), Measure()
    guess.answer_with(measure)
    flips: list[bool] = []
    for button in (guess.check_button, guess.show_button):
        button.observe(lambda change: flips.append(change["new"]), "disabled")
    guess._press(guess.check)                            # a refusal: nothing measured, but a button press
    flips.clear()
    guess.value = "abc"                                  # re-judged: still refused
    guess.value = ""
    assert "no guess entered" in _answer_area(guess) and flips == [] and measure.calls == 0
    assert "measuring" not in _answer_area(guess)
    guess._press(guess.show)
    assert flips == [True, True, False, False] and measure.calls == 1


def test_a_fraction_prompt_refuses_12000():
    guess = Prediction("What fraction of the step is idle?", low=0, high=1)
    guess.answer_with(lambda: Answer(measured=0.28, formula=3 / 11))
    guess.value = "12000"
    assert guess.check() is None and "from 0 to 1" in guess.note
    guess.value = "0.3"
    assert "close" in guess.check().text


def test_measure_must_be_a_function_returning_an_answer():
    guess = Prediction(QUESTION)
    with pytest.raises(TypeError, match="function of no arguments"):
        guess.answer_with(600020)
    guess.answer_with(lambda: 600020)
    with pytest.raises(TypeError, match="must return an Answer"):
        guess.show()
    with pytest.raises(RuntimeError, match="answer_with"):
        Prediction(QUESTION).show()


def test_a_failing_measurement_is_shown_in_the_answer_area():
    guess = Prediction(QUESTION)
    guess.answer_with(lambda: 1 / 0)
    guess._press(guess.show)
    shown = "".join(o.get("text", "") for o in guess.out.outputs)
    assert "ZeroDivisionError" in shown and not guess.show_button.disabled


@pytest.mark.parametrize("guess, measured, said", [(87200, 1000, "87\u00d7 the measurement"),
                                                   (250, 1000, "0.25\u00d7 the measurement"),
                                                   (-0.00833, 1000, "the other sign"), (0.001, 1000, "about 0"),
                                                   (1500, 1000, "50% above"), (970, 1000, "close: 3% below")])
def test_how_far_reads_as_a_learner_reads_it(guess, measured, said):
    assert said in how_far(guess, measured) and "e+" not in how_far(guess, measured)


def test_the_reveal_table_reads_left_to_right():
    html = verdict_html(QUESTION, compare_guess(4000, 6000, formula=6000), unit="B")
    assert "text-align:right" not in html and html.count("text-align:left") == 9


# --- issue 33: "right" is judged at the digits the reveal prints; one format for every echo ----------------

@pytest.mark.parametrize("typed, measured", [(0.1694, 0.16941238), (0.3506, 0.35058), (18022, 18022.4),
                                             (0.16941, 0.16941238), (2, 2.0004)])
def test_a_guess_equal_to_the_shown_value_is_exactly_right(typed, measured):
    assert format_number(typed) == format_number(measured)           # what the reveal prints for both
    assert how_far(typed, measured) == "exactly right" and compare_guess(typed, measured).summary == "exactly right"
    assert same_when_shown(typed, measured)


@pytest.mark.parametrize("typed, measured", [(0.1695, 0.16941238), (0.1693, 0.16941238), (0.3505, 0.35058),
                                             (18023, 18022.4), (0.17, 0.16941238)])
def test_a_guess_off_in_the_last_printed_digit_is_not_exact(typed, measured):
    assert how_far(typed, measured).startswith("close: ") and not same_when_shown(typed, measured)


@pytest.mark.parametrize("measured", [0.16941238, 0.35058, 2.0004, 411.83, 999.97, 18022.4, 6.02e7, 123456789.7,
                                      3 / 11, -0.0421, 1.2345e-5, 7.77e17])
def test_typing_what_the_reveal_prints_as_measured_is_exactly_right(measured):
    guess = Prediction(QUESTION)
    guess.answer_with(lambda: Answer(measured=measured))
    shown = guess.show().text.split("measured", 1)[1].split()[0]       # the measured row's value, as printed
    guess.value = shown
    assert guess.check().verdict.summary == "exactly right", (measured, shown)


@pytest.mark.parametrize("typed, echoed", [("18022", "18,022 B"), ("1.8022e4", "18,022 B"), ("18,022.4", "18,022 B"),
                                           ("4118", "4,118 B"), ("16384", "16,384 B"), ("999.97", "1,000 B"),
                                           ("411.83", "411.8 B"), ("0.1694", "0.1694 B"), ("3", "3 B")])
def test_every_guess_is_echoed_in_one_format(typed, echoed):
    guess = Prediction(QUESTION, unit="B")
    guess.value = typed
    assert guess.status.value == f"your guess: {echoed}"
    guess.answer_with(lambda: Answer(measured=4118, formula=16384))
    rows = guess.check().text.splitlines()[1:]
    assert f" {echoed} " in rows[0] + " " and "4,118 B" in rows[2] and "16,384 B" in rows[1]


def test_no_number_from_one_to_a_million_million_is_printed_with_an_exponent():
    for x in (1000.0, 1802.2, 18022.0, 1.8022e4 + 0.5, 4.4e9, 9.99e13, 1.0e14 + 0.25):
        assert "e" not in format_number(x) and "," in format_number(x), format_number(x)
