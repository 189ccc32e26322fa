"""The question does not sit under its answer (issue 33 §1): above a prediction's "Check my guess" nothing
states the answer's formula or its reasoning, in a cell's source or in a stored output.

Each prompt's answer is a function of its chapter's `predictions` module; its `formula_text=` and
`why=` texts are read from that module's source (so the test fails when either is copied back into
a notebook) and looked for in every cell up to and including the one that shows the buttons, as
letters and digits only (so a text wrapped over source lines, cut into quoted pieces or set as
markdown still matches): a formula whole, a why as any run of WHY_WORDS consecutive words (a why
restated in other words around the same sentence is still caught; shorter runs, like "N - 1
passes", are the vocabulary of the questions themselves). The browser test uses the same rule on
the page (tests/test_browser.py).

A `Choice` (chapter 09: which axis sends the most bytes) is answered by a name, so its answer is
given away by a sentence naming it as the leader ("dp sends the most bytes", "most bytes: DP"):
`answer_phrase` finds one, and none may be above the buttons. Its answering function has a pure
companion `<function>_formula()` (the formula's pick and its value per name, no process); those
values, as the reveal prints them, are nowhere in the stored notebook, above or below the buttons,
since a checked table of them would answer the question before any press.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from wmdist.ui.predict import format_number

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ASKED = ".answer_with("
WHY_WORDS = 8                     # a why is looked for as every run of this many consecutive words


def _letters(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def stated(text: str, above: str, words: int | None = None) -> str:
    """The part of `text` that `above` states ("" if none): all of it, or (`words`) any run of that many words
    (of 20 letters or more), compared as letters and digits only."""
    flat = _letters(above)
    if words is None:
        return text if _letters(text) and _letters(text) in flat else ""
    split = text.split()
    for i in range(max(1, len(split) - words + 1)):
        run = " ".join(split[i:i + words])
        if len(_letters(run)) >= 20 and _letters(run) in flat:
            return run
    return ""


LEADS = ("{a} (?:sends|moves|carries) (?:the )?most", "{a} (?:sends|moves|carries) (?:far )?more bytes",
         "most bytes (?:are sent )?(?:along |on |go to )?{a}", "{a} (?:is|comes out|is by far) (?:the )?(?:largest|biggest|busiest)",
         "{a} leads", "answer is {a}")    # ways a page names an axis (any name) as the one that sends the most


def answer_phrase(name: str, text: str) -> str:
    """The phrase in `text` that names `name` as the leader ("dp sends the most bytes", "Most bytes: DP 55 kB",
    "**tp** is the largest"), compared in lower case with markup as spaces; "" if none. A sentence's end
    (". ? ! ;") breaks a phrase, so a question followed by its choices ("the most bytes? (dp, tp, ...)") is none."""
    flat = " " + re.sub(r"[^a-z0-9|]+", " ", re.sub(r"[?!;]|\.(?!\d)", " | ", text.lower())) + " "
    for pattern in LEADS:
        found = re.search(r"(?<![a-z0-9])" + pattern.format(a=re.escape(name.lower())) + r"(?![a-z0-9])", flat)
        if found:
            return found.group(0).strip()
    return ""


def shown_values(values: dict[str, float], unit: str = "") -> list[str]:
    """The values a choice's reveal lists, as it prints them without the unit, those with 3+ digits (a shorter
    number cannot tell an answer from any other number on a page)."""
    out = [format_number(v, unit=unit).removesuffix(unit).strip() for v in values.values()]
    return [v for v in out if sum(ch.isdigit() for ch in v) >= 3]


def _asked(path: Path) -> list[int]:
    cells = nbformat.read(path, as_version=4).cells
    return [i for i, c in enumerate(cells) if c.cell_type == "code" and ASKED in c.source]


ASKING = [p for p in NOTEBOOKS if _asked(p)]


def _pieces(node: ast.expr) -> list[str]:
    """The literal text of a str constant, or the literal pieces of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant)]
    return []


def answer_texts(module: str) -> dict[str, list[str]]:
    """{"formula_text": [...], "why": [...]}: the literal texts each Answer / ChoiceAnswer of `module` is built with."""
    path = Path(importlib.import_module(module).__file__)
    out: dict[str, list[str]] = {"formula_text": [], "why": []}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("Answer", "ChoiceAnswer"):
            for kw in node.keywords:
                if kw.arg in out:
                    out[kw.arg] += [p for p in _pieces(kw.value) if len(p.strip()) >= 5]
    return out


def _module_of(cells, asked: int) -> str:
    """The predictions module the answering cell calls (`from wmdist.X import predictions`)."""
    source = "\n".join(c.source for c in cells[: asked + 1] if c.cell_type == "code")
    found = re.findall(r"from (wmdist\.\w+) import predictions", source)
    assert found, f"the cell answering a prediction imports no chapter predictions module:\n{cells[asked].source}"
    return found[-1] + ".predictions"


def _above(cells, asked: int) -> str:
    """Everything a learner scrolls past to reach the buttons: every cell's source and stored text output."""
    parts = []
    for c in cells[: asked + 1]:
        parts.append(c.source)
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            parts.append(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"]))
            for key in ("text/plain", "text/html", "text/markdown"):
                value = o.get("data", {}).get(key, "")
                parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def test_every_prompt_is_answered_by_a_predictions_function():
    """A prompt's answering cell names a module function; it defines no measure() of its own."""
    assert len(ASKING) >= 11, [p.name for p in ASKING]
    for path in ASKING:
        cells = nbformat.read(path, as_version=4).cells
        for i in _asked(path):
            src = cells[i].source
            assert "formula_text" not in src and "why=" not in src and "def " not in src, f"{path.name} cell {i}"
            assert "predictions." in src, f"{path.name} cell {i} answers with something else:\n{src}"


@pytest.mark.parametrize("path", ASKING, ids=lambda p: p.stem)
def test_nothing_above_the_buttons_states_the_formula_or_the_why(path):
    cells = nbformat.read(path, as_version=4).cells
    for asked in _asked(path):
        module = _module_of(cells, asked)
        texts = answer_texts(module)
        assert texts["formula_text"] and texts["why"], f"{module} builds no Answer with a formula_text and a why"
        above = _above(cells, asked)
        for kind, pieces in texts.items():
            for piece in pieces:
                said = stated(piece, above, WHY_WORDS if kind == "why" else None)
                assert not said, f"{path.name}: the {kind} of {module} is above the buttons: {said!r}"


def test_the_scan_finds_a_why_put_back_in_a_cell():
    """The check itself: a cell holding a predictions module's why (or formula), as the old cells did, fails."""
    texts = answer_texts("wmdist.ring_attention.predictions")
    old = f'return Answer(measured=2, formula_text="{texts["formula_text"][0]}",\n    why="{texts["why"][0]}")'
    above = _above([nbformat.v4.new_code_cell(old)], 0)
    assert stated(texts["why"][0], above, WHY_WORDS) and stated(texts["formula_text"][0], above)
    said = "A block goes round the ring: after N - 1 passes, every query has met every key, and it stops."
    assert stated(texts["why"][0], said, WHY_WORDS)                  # the same words in markdown, with $N-1$
    assert not stated(texts["why"][0], "Is it N - 1 blocks, N, or something else?", WHY_WORDS)


def _choice_function(cells, asked: int) -> str | None:
    """The predictions function answering a `Choice` at cell `asked` (None when the prompt is a number's)."""
    found = re.search(r"(\w+)\.answer_with\(.*?predictions\.(\w+)", cells[asked].source, re.S)
    assert found, f"cell {asked} answers with no predictions function:\n{cells[asked].source}"
    name, function = found.groups()
    made = [c.source for c in cells[:asked] if c.cell_type == "code" and re.search(rf"\b{name}\s*=\s*Choice\(", c.source)]
    return function if made else None


CHOOSING = [p for p in ASKING if any(_choice_function(nbformat.read(p, as_version=4).cells, i) for i in _asked(p))]


def choice_problems(cells) -> list[str]:
    """What gives a Choice's answer away in `cells`: a phrase naming it above its buttons, or its values anywhere."""
    problems = []
    whole = _above(cells, len(cells) - 1)
    for asked in _asked_cells(cells):
        function = _choice_function(cells, asked)
        if function is None:
            continue
        module = importlib.import_module(_module_of(cells, asked))
        pure = getattr(module, f"{function}_formula", None)
        assert callable(pure), f"{module.__name__}.{function} has no pure companion {function}_formula()"
        pick, values = pure()
        said = answer_phrase(pick, _above(cells, asked))
        if said:
            problems.append(f"cell {asked}: the answer {pick!r} is stated above the buttons: {said!r}")
        problems += [f"cell {asked}: the value {v} (of {pick!r}'s reveal) is in the notebook before any press"
                     for v in shown_values(values) if v in whole]
    return problems


def _asked_cells(cells) -> list[int]:
    return [i for i, c in enumerate(cells) if c.cell_type == "code" and ASKED in c.source]


def test_chapter_09_asks_a_choice():
    assert [p.stem for p in CHOOSING] == ["09_putting_it_together"]


@pytest.mark.parametrize("path", CHOOSING, ids=lambda p: p.stem)
def test_nothing_on_the_page_gives_a_choice_away(path):
    """Above the buttons no sentence names the answer as the leader; nowhere is a value its reveal lists."""
    assert choice_problems(nbformat.read(path, as_version=4).cells) == []


def test_the_choice_scan_finds_the_answer_stated():
    """The check itself: the phrases a page would use are found, for the named axis only; and chapter 09 with
    the answer planted back fails: a sentence above the buttons, or a checked table of the reveal's bytes
    below them (as the chapter had before issue 33's fix: the width-32 question over the width-32 table)."""
    for text in ("- **dp** sends the most bytes: each rank's", "Most bytes: DP 55.30 kB > TP", "here dp is the largest",
                 "tiny: most bytes dp > tp > pp"):
        assert answer_phrase("dp", text) and not answer_phrase("tp", text), text
    assert not answer_phrase("dp", "a different axis sends the most bytes on each mesh; dpx sends the most")
    assert not answer_phrase("dp", 'Choice("along which axis will rank 0 send the most bytes?", ("dp", "tp"))')
    assert shown_values({"dp": 55296, "tp": 32768, "pp": 4096, "cp": 0}, "B") == ["55,296", "32,768", "4,096"]
    path = REPO / "notebooks" / "09_putting_it_together.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    asked = _asked_cells(cells)[0]
    pick, values = importlib.import_module("wmdist.mesh.predictions").busiest_axis_formula()
    said = nbformat.v4.new_markdown_cell(f"At half the width **{pick}** sends the most bytes.")
    assert "above the buttons" in " ".join(choice_problems(cells[:asked - 1] + [said] + cells[asked - 1:]))
    table = nbformat.v4.new_code_cell("print(tables.side_by_side(narrow.data))")
    table.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                            text="  ".join(f"{k} {v:,}" for k, v in values.items()))]
    assert "before any press" in " ".join(choice_problems(cells + [table]))
