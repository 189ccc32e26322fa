"""A menu's options of mixed kinds are told apart or refused by name (issue 35 §7): options that read the same
(1 and "1") or that Python holds equal (True and 1, 1 and 1.0, 0 and False, None listed twice) used to build a
menu with two identical entries, or one that showed and handed back the other option than the one chosen."""
from __future__ import annotations

import pytest

from wmdist.base.knobs import Knob
from wmdist.ui.controls import control, model_value


@pytest.mark.parametrize("options, value, words", [
    ((1, "1"), "1", "options 1 and '1' both read '1' in the menu"),
    ((2, "2", 3), 3, "options 2 and '2' both read '2' in the menu"),
    ((("same", None), ("same", "fp32")), None, "both read 'same'"),
    ((True, 1), 1, "options 'True' (True) and '1' (1) hold equal values"),
    ((1, 1.0), 1.0, "options '1' (1) and '1.0' (1.0) hold equal values"),
    ((0, False), False, "options '0' (0) and 'False' (False) hold equal values"),
    ((("a", 2), ("b", 2)), 2, "options 'a' (2) and 'b' (2) hold equal values"),
    ((("same", None), "fp32", None), None, "options 'same' (None) and 'None' (None) hold equal values"),
], ids=["int-and-str", "int-and-str-among-others", "one-label-twice", "bool-and-int", "int-and-float",
        "zero-and-false", "one-value-twice", "none-twice"])
def test_options_a_menu_cannot_tell_apart_are_refused_by_name(options, value, words):
    with pytest.raises(ValueError, match="knob 'choice'") as info:
        control("field", Knob(label="choice", options=options), value)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("options, value", [
    (("1", "2"), "2"),
    ((("one", 1), ("the text 1", "1")), "1"),                # mixed kinds, told apart by their labels
    ((("one", 1), ("one point five", 1.5), ("no", False)), False),
    ((("same", None), ("fp32", "fp32")), None),
])
def test_options_that_can_be_told_apart_give_back_exactly_the_one_chosen(options, value):
    menu = control("field", Knob(label="choice", options=options), value)
    chosen = model_value(menu, menu.value)
    assert chosen == value and type(chosen) is type(value)
    for index, option in enumerate(options):               # every entry, chosen in turn, gives its own value
        want = option[1] if isinstance(option, tuple) else option
        menu.index = index
        got = model_value(menu, menu.value)
        assert got == want and type(got) is type(want), (index, got, want)
