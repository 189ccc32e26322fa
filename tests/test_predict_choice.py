"""A prediction answered by a name (chapter 09: which axis sends the most bytes), driven by `.value`."""
from __future__ import annotations

import pytest

from wmdist.ui import Answer, Choice, ChoiceAnswer
from wmdist.ui.choose import read_choice

AXES = ("dp", "tp", "pp", "cp")
QUESTION = "Along which axis will rank 0 send the most bytes?"


class Measure:
    """A stand-in for the mesh run: counts how often it ran."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> ChoiceAnswer:
        self.calls += 1
        return ChoiceAnswer(measured="dp", formula="dp", values={"dp": 55296, "tp": 32768, "pp": 4096, "cp": 0},
                            formula_text="the largest of costs.mesh", why="the gradient outweighs the activations")


@pytest.mark.parametrize("typed, read", [("dp", "dp"), (" TP ", "tp"), ("Cp", "cp"), ("", None), ("d p", None),
                                         ("4", None), ("dp/", None)])
def test_read_choice_takes_one_of_the_names(typed, read):
    value, why = read_choice(typed, AXES)
    assert value == read and (why == "" if read else why)
    if read is None and typed.strip():
        assert "not one of dp, tp, pp, cp" in why


def test_nothing_is_measured_until_a_press_and_a_right_name_is_exactly_right():
    guess, measure = Choice(QUESTION, AXES, unit="B"), Measure()
    asking = guess.answer_with(measure)
    text = asking._repr_mimebundle_()["text/plain"] + repr(guess)
    assert measure.calls == 0 and "55" not in text and "largest" not in text and "one of dp, tp, pp, cp" in text
    guess.value = "tp"
    assert guess.status.value == "your guess: tp"
    wrong = guess.check()
    assert measure.calls == 1 and not wrong.right and "not it: the run picked dp" in wrong.text
    assert "55,296 B" in wrong.text and "32,768 B" in wrong.text and "why: the gradient" in wrong.text
    assert "class='wmdist-reveal'" in wrong.html and "55,296 B" in wrong.html
    guess.value = "DP"
    right = guess.check()
    assert right.right and "exactly right" in right.text and measure.calls == 1


def test_a_name_that_is_not_a_choice_is_refused_without_measuring():
    guess, measure = Choice(QUESTION, AXES, unit="B"), Measure()
    guess.answer_with(measure)
    guess.value = "ep"
    assert guess.check() is None and measure.calls == 0 and "not one of dp, tp, pp, cp" in guess.note
    shown = guess.show()
    assert measure.calls == 1 and "you typed 'ep'" in shown.text and "measured" in shown.text


def test_a_choice_wants_a_choice_answer_and_real_choices():
    guess = Choice(QUESTION, AXES)
    guess.answer_with(lambda: Answer(measured=3))
    with pytest.raises(TypeError, match="must return a ChoiceAnswer"):
        guess.show()
    for bad in (("dp",), ("dp", "DP")):
        with pytest.raises(ValueError, match="two or more different names"):
            Choice(QUESTION, bad)


def test_largest_refuses_a_tie():
    from wmdist.mesh.predictions import largest
    assert largest({"dp": 3, "tp": 5, "pp": 0}) == "tp"
    with pytest.raises(ValueError, match="dp and tp tie"):
        largest({"dp": 5, "tp": 5, "pp": 0})


def test_chapter_09s_answer_is_read_from_the_ledger_and_agrees_with_costs_mesh():
    """One real step of the 2 x 2 x 2 mesh at half the demos' width (8 ranks): rank 0's bytes per axis from the
    ledger equal costs.mesh.axis_traffic's (the pure companion's), and the axis with the most is the answer
    both ways. It is not the demo's own leader: at width 32 dp leads, at 16 the page has not shown it."""
    from wmdist.costs.mesh import axis_traffic
    from wmdist.mesh.predictions import busiest_axis, busiest_axis_formula, largest
    from wmdist.mesh.scenarios import MESH_3D, MESH_3D_NARROW
    answer = busiest_axis()
    pick, predicted = busiest_axis_formula()
    spec = MESH_3D_NARROW
    assert predicted == {a: t.bytes_sent for a, t in axis_traffic(spec.shape, spec.mesh.coords(0)).items()}
    assert set(answer.values) == set(AXES) and answer.values == predicted
    assert answer.measured == largest(answer.values) == answer.formula == pick
    assert sorted(answer.values.values())[-1] > sorted(answer.values.values())[-2]    # a clear leader
    shown = largest({a: t.bytes_sent for a, t in axis_traffic(MESH_3D.shape, MESH_3D.mesh.coords(0)).items()})
    assert spec.width * 2 == MESH_3D.width and pick != shown
