"""The prediction widget: the pure comparison, its text and HTML views, and the widgets driven by `.value`."""
from __future__ import annotations

import pytest

from wmdist.ui import Prediction
from wmdist.ui.predict import NO_GUESS, compare, format_number, parse_guess, verdict_html, verdict_text

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
    low = compare(4000, 6000, formula=6000)
    assert low.relative_error == pytest.approx(-1 / 3) and low.ratio == pytest.approx(2 / 3)
    assert low.difference == -2000 and "33.3% below" in low.summary
    high = compare(6600, 6000)
    assert high.relative_error == pytest.approx(0.1) and "above" in high.summary and high.summary.startswith("close")
    assert compare(6000, 6000).summary == "exactly right"
    assert compare(6000, 6000).relative_error == 0.0


def test_compare_without_a_guess_still_gives_the_answer():
    v = compare(None, 0.29, formula=3 / 11)
    assert v.guess is None and v.relative_error is None and v.ratio is None and v.summary == NO_GUESS
    assert v.measured == 0.29 and v.formula == pytest.approx(3 / 11)
    assert v.formula_relative_error == pytest.approx((3 / 11 - 0.29) / 0.29)


def test_compare_with_a_zero_measurement_reports_the_difference():
    v = compare(3, 0)
    assert v.relative_error is None and v.ratio is None and v.difference == 3 and "off by 3" in v.summary


def test_text_view_is_deterministic_and_names_everything():
    v = compare(None, 6000, formula=6000)
    text = verdict_text(QUESTION, v, unit="B", formula_text="2(N-1)/N G", why="see 'Why' above")
    assert text == verdict_text(QUESTION, compare(None, 6000, formula=6000), unit="B", formula_text="2(N-1)/N G",
                                 why="see 'Why' above")
    assert QUESTION in text and NO_GUESS in text and "6,000 B" in text and "2(N-1)/N G" in text
    assert "equals the measurement" in text and "why: see 'Why' above" in text
    html = verdict_html(QUESTION, compare(4000, 6000, formula=6000), unit="B", formula_text="f<x>", why="w")
    assert "class='wmdist-reveal'" in html and "f&lt;x&gt;" in html and "33.3% below" in html


def test_format_number():
    assert format_number(12628, unit="B") == "12,628 B" and format_number(0.2727, unit="") == "0.2727"
    assert format_number(3.0) == "3"


def test_widget_classes_and_value():
    guess = Prediction(QUESTION, unit="B")
    assert "wmdist-guess" in guess.box._dom_classes
    assert guess.guess is None and guess.status.value == ""
    guess.value = "6,000"
    assert guess.box.value == "6,000" and guess.guess == 6000 and "6,000 B" in guess.status.value
    guess.value = "lots"
    assert guess.guess is None and "cannot read" in guess.status.value
    bundle = guess._repr_mimebundle_()
    assert QUESTION in bundle["text/plain"] and "application/vnd.jupyter.widget-view+json" in bundle


def test_reveal_without_a_guess_then_with_one():
    guess = Prediction(QUESTION, unit="B")
    reveal = guess.reveal(measured=600020, formula=600018, formula_text="2(N-1)G/N", why="see above")
    assert reveal.verdict.guess is None and NO_GUESS in repr(reveal)
    assert "0.000333% below the measurement" in reveal.text
    bundle = reveal._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}          # static: nothing a fresh notebook cannot render
    assert bundle["text/plain"] == reveal.text and "wmdist-reveal" in bundle["text/html"]
    assert repr(guess.reveal(measured=600020, formula=600018, formula_text="2(N-1)G/N", why="see above")) == reveal.text
    guess.value = "400000"          # a guess typed, then the reveal cell run again
    again = guess.reveal(measured=600020, formula=600018)
    assert again.verdict.relative_error == pytest.approx(400000 / 600020 - 1)
    assert "33.3% below" in again.text and "33.3% below" in again.html
