"""Issue 32 §2: a panel's numbers are checked once, where its values enter, and the walk from the slider to
the numbers goes back to rooms already left at most half as often as it did (tests/walks.py defines the walk).

Baselines, measured with tests/walks.py on c6505d9 (before the change): chapter 05's bubble panel, M 8 -> 16,
19 stays / 13 returns (nested: the issue's count) and 17 / 11 (comprehensions folded into their function);
chapter 10's experts panel, skew 0.5 -> 0.8, 24 / 19 and 22 / 17; calls into costs.validate on the path,
481 (05) and 85 (10). After it: 05 9 / 3 both ways and 10 validator calls; 10 12 / 7 and 10 / 5, 14 calls.
"""
from __future__ import annotations

import itertools

import pytest
from walks import Walk, call_count, collapse, first_calls, move, panel_walk, validator_callers

from wmdist.costs import experts as ecosts
from wmdist.costs import pipeline as pcosts
from wmdist.experts.panel import ExpertsPanel
from wmdist.pipeline.bubble import BubbleConfig, bubble_curve, curve_points
from wmdist.pipeline.panel import BubblePanel
from wmdist.pipeline.schedules import Action, Schedule, make_schedule
from wmdist.pipeline.simulate import simulate

BASELINE_COMMIT = "c6505d9"
MOVES = {"05": (BubblePanel, "microbatches", 16), "10": (ExpertsPanel, "skew", 0.8)}
BASELINE = {("05", True): (19, 13), ("05", False): (17, 11),          # (stays, returns) on BASELINE_COMMIT
            ("10", True): (24, 19), ("10", False): (22, 17)}
BASELINE_CHECKS = {"05": 481, "10": 85}                                # calls into costs.validate, same commit
ROOMS = {"05": {"pipeline.bubble", "pipeline.schedules", "pipeline.simulate", "costs.pipeline", "pipeline.panel"},
         "10": {"experts.tradeoff", "costs.experts", "experts.panel", "costs.units"}}
# Who may check on the path: the config (where the slider's values enter), make_schedule (the public face that
# builds the config's schedule, checking its shape) and the text's number formatting (costs.units, public).
CHECKERS = {"05": {("pipeline.bubble", "BubbleConfig.__post_init__"), ("pipeline.schedules", "make_schedule"),
                   ("pipeline.schedules", "check_size")},
            "10": {("experts.tradeoff", "ExpertsConfig.__post_init__"), ("costs.units", "si"),
                   ("costs.units", "seconds")}}


@pytest.fixture(scope="module")
def panels():
    made = {chapter: cls() for chapter, (cls, _, _) in MOVES.items()}
    yield made
    for panel in made.values():
        panel.prefetch.idle()


def walk(panels, chapter: str, *, nested: bool = True) -> Walk:
    _, control, value = MOVES[chapter]
    return panel_walk(panels[chapter], control, value, nested=nested)


def test_stays_and_returns_are_counted_over_first_calls():
    calls = [("a", "f"), ("b", "g"), ("a", "h"), ("a", "i"), ("c", "j"), ("b", "k"), ("a", "f2")]
    w = collapse(calls)
    assert w.stays == ("a", "b", "a", "c", "b", "a") and w.functions[2] == ("h", "i")
    assert w.returns == 3 and w.returns_between("a", "b") == 2 and w.returns_between("a", "c") == 0
    # bubble_over_ideal checks three arguments with require_int: one visit to costs.validate, then its core
    traced = first_calls(lambda: pcosts.bubble_over_ideal(4, 8, chunks=2))
    assert traced == [("costs.pipeline", "bubble_over_ideal"), ("costs.validate", "require_int"),
                      ("costs.validate", "_is_int"), ("costs.pipeline", "_over_ideal_unchecked")]
    assert collapse(traced).returns == 1
    nested = [name for _, name in first_calls(lambda: ecosts.skewed_shares(8, 0.5))]
    folded = [name for _, name in first_calls(lambda: ecosts.skewed_shares(8, 0.5), nested=False)]
    assert any("<listcomp>" in n for n in nested) and not any("<" in n for n in folded)


@pytest.mark.parametrize("chapter", sorted(MOVES))
def test_the_walk_goes_through_the_model(panels, chapter):
    """The walk is the real path: each of the chapter's model rooms is on it (an empty trace fails here)."""
    w = walk(panels, chapter)
    assert ROOMS[chapter] <= set(w.stays), w.listing()
    assert panels[chapter].config is not None and not panels[chapter].error


@pytest.mark.parametrize("chapter, nested", sorted(BASELINE), ids=[f"{c}-{'nested' if n else 'folded'}"
                                                                   for c, n in sorted(BASELINE)])
def test_the_walk_returns_at_most_half_as_often_as_before(panels, chapter, nested):
    w = walk(panels, chapter, nested=nested)
    stays, returns = BASELINE[(chapter, nested)]
    assert w.returns <= returns // 2, f"{len(w.stays)} stays, {w.returns} returns (baseline {stays} / {returns}):\n" \
                                      + w.listing()
    assert w.returns_between("costs.experts", "costs.validate") == 0, w.listing()


@pytest.mark.parametrize("chapter", sorted(MOVES))
def test_values_are_checked_where_they_enter_and_not_again(panels, chapter):
    _, control, value = MOVES[chapter]
    callers = validator_callers(move(panels[chapter], control, value))
    assert set(callers) <= CHECKERS[chapter], sorted(set(callers) - CHECKERS[chapter])
    assert 0 < sum(callers.values()) <= BASELINE_CHECKS[chapter] // 2, callers


@pytest.mark.parametrize("config", [BubbleConfig(), BubbleConfig(schedule="interleaved", chunks=2),
                                    BubbleConfig(schedule="1f1b", unequal=True)], ids=["gpipe", "interleaved", "1f1b"])
def test_bubble_curve_computes_bubble_over_ideal_once_per_point(config):
    points = len(curve_points(config))
    assert call_count(lambda: bubble_curve(config), "costs.pipeline", "_over_ideal_unchecked") == points
    assert call_count(lambda: bubble_curve(config), "costs.pipeline", "bubble_over_ideal") == 0


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_schedules_built_unchecked_are_ones_the_checks_accept(name):
    """make_schedule's builders skip Schedule's and Action's checks (their sizes are checked once, up front):
    each schedule they make, rebuilt through the checking constructors, passes and is equal."""
    for p, m, v in itertools.product((1, 2, 3, 4), (1, 2, 4, 6, 8), (1, 2, 3) if name == "interleaved" else (1,)):
        if name == "interleaved" and m % p:
            continue
        built = make_schedule(name, p, m, chunks=v)
        ranks = tuple(tuple(Action(a.kind, a.microbatch, a.stage) for a in actions) for actions in built.ranks)
        checked = Schedule(name=built.name, stages=p, microbatches=m, chunks=v, ranks=ranks)
        assert checked == built and simulate(built).makespan > 0
