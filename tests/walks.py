"""How often a reader following a panel's numbers goes back to a module already left (issue 32 §2).

The walk is one control move's path from the slider to the numbers, without the drawing: the control
is set (its update held), then `Panel.update` is traced with the subtrees of `_draw` and `_draw_ahead`
(matplotlib, the prefetcher) cut out. So it covers read_config (the config dataclass and its
checks), compute (the pure model) and describe/details (the numbers shown).

What is recorded, with sys.setprofile on this thread only:

- each Python function of wmdist the first time it is called, in call order (a reader reads a
  function once; a loop over 64 actions is one visit, not 64). Its module is the frame's
  `__name__` global, so a dataclass's generated `__init__` belongs to the module of its class;
- the panel base (`wmdist.ui.*`) is left out: it is the same plumbing for every panel, and the
  issue follows the chapter's rooms. Module-level code (an import on the way) is left out too;
- `nested=True` (the issue's count) records comprehensions, generator expressions and lambdas as
  functions of their own, as Python 3.11 runs them (own frames); `nested=False` folds them into the
  function whose text holds them, which is what a reader reads, and is the same on 3.12+, where
  comprehensions are inlined (PEP 709).

Consecutive visits to one module collapse into one *stay*; a stay in a module the walk has
already stayed in is a *return*. On c6505d9, nested: 19 stays / 13 returns for chapter 05's bubble
panel (M 8 -> 16), the issue's numbers exactly, and 24 / 19 for chapter 10's experts panel (skew
0.5 -> 0.8), where the issue says 24 / 20; folded: 17 / 11 and 22 / 17.

`validator_callers` counts every call into costs.validate on the same path (not first calls),
by the function that makes it: where the checks are made, and how many.
"""
from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CUT = frozenset({"_draw", "_draw_ahead"})     # Panel methods whose subtrees are the drawing
LEFT_OUT = ("wmdist.ui.",)
VALIDATE = "wmdist.costs.validate"


@dataclass(frozen=True, kw_only=True)
class Walk:
    """The modules a walk visits, consecutive repeats collapsed, and the functions behind each stay."""
    stays: tuple[str, ...]                       # module of each stay, in order
    functions: tuple[tuple[str, ...], ...]       # qualnames first called during each stay

    @property
    def returns(self) -> int:
        """Stays in a module the walk had already left."""
        seen: set[str] = set()
        count = 0
        for module in self.stays:
            count += module in seen
            seen.add(module)
        return count

    def returns_between(self, a: str, b: str) -> int:
        """Returns that step from module a to b or from b to a."""
        seen = {self.stays[0]} if self.stays else set()
        count = 0
        for before, after in zip(self.stays, self.stays[1:]):
            count += after in seen and {before, after} == {a, b}
            seen.add(after)
        return count

    def listing(self) -> str:
        """One line per stay: its module and the functions first read there (for a failing assertion)."""
        return "\n".join(f"{i:2d} {m}: {', '.join(f)}" for i, (m, f) in enumerate(zip(self.stays, self.functions)))


def _traced(fn: Callable[[], Any], on_call: Callable[[Any], None]) -> None:
    """Run `fn` with `on_call(frame)` for each Python call on this thread, the drawing subtrees cut."""
    cut = 0
    me = threading.get_ident()

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal cut
        if event not in ("call", "return") or threading.get_ident() != me:
            return
        if cut:
            cut += 1 if event == "call" else -1
            return
        if event != "call":
            return
        if frame.f_code.co_name in CUT and frame.f_globals.get("__name__", "").startswith("wmdist.ui."):
            cut = 1
            return
        on_call(frame)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)


def first_calls(fn: Callable[[], Any], *, nested: bool = True) -> list[tuple[str, str]]:
    """(module, qualname) of each wmdist function the first time `fn` calls it, drawing subtrees cut.

    nested=False leaves out <listcomp>, <genexpr>, <lambda> ... frames (their text is their function's)."""
    seen: set[Any] = set()
    out: list[tuple[str, str]] = []

    def on_call(frame: Any) -> None:
        module, code = frame.f_globals.get("__name__", ""), frame.f_code
        if not module.startswith("wmdist.") or module.startswith(LEFT_OUT) or code.co_name == "<module>":
            return
        if not nested and code.co_name.startswith("<"):
            return
        if code not in seen:
            seen.add(code)
            out.append((module.removeprefix("wmdist."), code.co_qualname))

    _traced(fn, on_call)
    return out


def validator_callers(fn: Callable[[], Any]) -> Counter[tuple[str, str]]:
    """(module, qualname) -> how many calls it makes into wmdist.costs.validate while `fn` runs, drawing cut
    (every call, not first calls; calls inside costs.validate itself are not counted)."""
    callers: Counter[tuple[str, str]] = Counter()

    def on_call(frame: Any) -> None:
        back = frame.f_back
        if frame.f_globals.get("__name__") == VALIDATE and back is not None:
            module = back.f_globals.get("__name__", "")
            if module != VALIDATE:
                callers[(module.removeprefix("wmdist."), back.f_code.co_qualname)] += 1

    _traced(fn, on_call)
    return callers


def collapse(calls: list[tuple[str, str]]) -> Walk:
    """Group consecutive calls in one module into stays."""
    stays: list[str] = []
    functions: list[list[str]] = []
    for module, name in calls:
        if not stays or stays[-1] != module:
            stays.append(module)
            functions.append([])
        functions[-1].append(name)
    return Walk(stays=tuple(stays), functions=tuple(tuple(f) for f in functions))


def move(panel: Any, control: str, value: Any) -> Callable[[], None]:
    """Set the control without an update; return the update it would make (to trace)."""
    with panel.holding():
        panel.controls[control].value = value
    return panel.update


def panel_walk(panel: Any, control: str, value: Any, *, nested: bool = True) -> Walk:
    """Move `panel.controls[control]` to `value` and walk the update it makes (read_config, compute, describe)."""
    calls = first_calls(move(panel, control, value), nested=nested)
    if panel.error:
        raise AssertionError(f"the move {control} = {value!r} was refused: {panel.error}")
    return collapse(calls)


def call_count(fn: Callable[[], Any], module: str, qualname: str) -> int:
    """How many times `fn` calls the function `qualname` of wmdist module `module` (e.g. "costs.pipeline")."""
    count = 0

    def on_call(frame: Any) -> None:
        nonlocal count
        count += (frame.f_globals.get("__name__") == f"wmdist.{module}" and frame.f_code.co_qualname == qualname)

    _traced(fn, on_call)
    return count
