"""Chapter 11: the planner panel shows the planner's numbers, every term names a chapter, the views plot the terms,
the exercise is the planner's bubble rule, and the published misses are explained.

The panel's jobs are small ones (a 7.1B model on 64 GPUs) so that each search takes well under a second; the
published runs are the package's own. Float comparisons: a number the panel prints is compared as the same
formatting of the planner's value (`seconds`, one decimal of a percentage), so only a different value fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from wmdist.costs.units import seconds
from wmdist.planner import predictions
from wmdist.planner.breakdown import TERMS
from wmdist.planner.exercises import BUBBLE, bubble_cases, bubble_solution
from wmdist.planner.explore import CHECKED_IN, TOP, PlanCache, PlannerConfig, job_of, planner_view
from wmdist.planner.figures import draw_memory, draw_steps
from wmdist.planner.misses import MISS_POINTS, compare_runs, unexplained
from wmdist.planner.panel import PlannerPanel
from wmdist.planner.published import RUNS
from wmdist.planner.panel_search import panel_search
from wmdist.planner.scoring import EFFICIENCY, published_plan, run_job, scored_runs
from wmdist.planner.stage import stage_work
from wmdist.ui.render import canvas_figure
from wmdist.ui.static import strip_tags

REPO = Path(__file__).resolve().parents[1]
SMALL = PlannerConfig(model="mcore-7.1b", gpu="h100", gpus=64, batch_tokens=2 * 2 ** 20, seq_len=4096)


@pytest.fixture(scope="module")
def panel():
    p = PlannerPanel(SMALL)
    yield p
    p.prefetch.cancel(clear=True)
    p.prefetch.idle()


def test_the_panel_shows_the_planners_ranking_and_its_numbers(panel):
    """The layouts are panel_search's (same order, same steps); the summary prints the chosen one's step, MFU,
    memory and every non-zero term, each with the chapter that checked it."""
    expected = panel_search(job_of(SMALL), top=TOP).plans
    assert [p.layout for p in panel.result.plans] == [p.layout for p in expected]
    assert [p.step.total for p in panel.result.plans] == [p.step.total for p in expected]
    text = strip_tags(panel.summary.value)
    best = expected[0]
    assert f"Step {seconds(best.step.total)}" in text and f"MFU {100 * best.step.mfu:.1f}%" in text
    for term in TERMS:
        value = best.step.terms[term]
        shown = f"{term} {seconds(value)}"
        assert (shown in text) == (value > 0 or term == "compute"), (term, text)
        if value > 0:
            assert f"{shown}" in text and f"(ch. {CHECKED_IN[term]})" in text.split(shown, 1)[1][:40]
    assert panel.error == "" and panel.png


def test_show_layout_picks_the_row_without_searching_again(panel):
    panel.prefetch.idle()        # the look-ahead of earlier moves fills the cache on its own thread: let it finish
    searches, plans = len(panel.cache), panel.result.plans
    assert searches >= 1
    panel.controls["pick"].value = 3
    assert panel.result.chosen is panel.result.plans[2]
    assert strip_tags(panel.summary.value).startswith(f"Layout #3 of {len(panel.result.plans)}")
    assert len(panel.cache) == searches and panel.result.plans is plans     # the same job: a look-up, not a search
    panel.controls["pick"].value = 1


def test_every_term_names_a_chapter_that_exists():
    assert set(CHECKED_IN) == set(TERMS)
    chapters = {p.name[:2] for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for term, where in CHECKED_IN.items():
        named = [c.strip() for c in where.split(",")]
        assert named and all(c in chapters and c < "11" for c in named), (term, where)


def test_nothing_fits_is_said_and_drawn_not_an_error():
    view = planner_view(PlannerConfig(model="llama3-405b", gpus=8, batch_tokens=2 ** 20, seq_len=8192))
    assert view.plans == () and view.chosen is None
    p = PlannerPanel(PlannerConfig(model="llama3-405b", gpus=8, batch_tokens=2 ** 20, seq_len=8192))
    try:
        assert p.error == "" and p.png and "Nothing fits" in strip_tags(p.summary.value)
    finally:
        p.prefetch.cancel(clear=True)
        p.prefetch.idle()


@pytest.mark.parametrize("bad, named", [(dict(model="gpt-9"), "model"), (dict(gpu="tpu"), "gpu"),
                                        (dict(batch_tokens=3000, seq_len=2048), "batch_tokens"),
                                        (dict(gpus=0), "gpus"), (dict(pick=TOP + 1), "pick")])
def test_bad_config_names_the_field(bad, named):
    with pytest.raises(ValueError, match=named):
        PlannerConfig(**bad)


def _rows(ax, n):
    """Per bar row, the sum of the filled bars' widths (the outline of the chosen bar is unfilled)."""
    sums = [0.0] * n
    for patch in ax.patches:
        if patch.get_fill():
            sums[round(patch.get_y() + patch.get_height() / 2)] += patch.get_width()
    return sums


def test_the_views_stack_the_terms_and_the_memory_of_each_layout():
    view = planner_view(SMALL, cache=PlanCache())
    fig = canvas_figure(600, 320)
    draw_steps(fig, view)
    draw_steps(fig, view)                                   # a redraw into the same axes keeps #1 on top
    ax = fig.axes[0]
    assert _rows(ax, len(view.plans)) == pytest.approx([p.step.total for p in view.plans], rel=1e-12)
    assert ax.get_ylim()[0] > ax.get_ylim()[1]              # row 0 (#1) at the top
    draw_memory(fig, view)
    ax = fig.axes[0]
    assert _rows(ax, len(view.plans)) == pytest.approx([p.memory["total"] for p in view.plans], rel=1e-12)
    hbm = [line.get_xdata()[0] for line in ax.lines]
    assert hbm == [view.chosen.hbm_bytes]


def test_the_exercise_is_the_planners_bubble_on_real_layouts():
    """The reference is the breakdown's bubble for equal stages; on published layouts (interleaved or not, padded
    or not, the head on the last stage) the planner fills and drains the other stages at their own pace
    (stage.bubble_ratio), the reference's rule on the busy time scaled by their mean over the slowest's."""
    checked = 0
    for name in ("llama3-405b-8k-16384gpu", "narayanan21-145.6b", "bloom-176b"):
        run = next(r for r in RUNS if r.name == name)
        job = run_job(run, efficiency=EFFICIENCY[run.gpu])
        plan = published_plan(job, run)
        t = plan.step.terms
        busy = t["compute"] + t["elementwise"] + t["tp"] + t["cp"] + t["ep"]
        times = stage_work(job, plan.layout).stage_seconds
        others = (sum(times) - max(times)) / (len(times) - 1) / max(times)
        assert plan.layout.pp > 1 and others < 1
        assert bubble_solution(plan.layout.pp, plan.layout.microbatches(job), plan.layout.virtual,
                               busy * others) == pytest.approx(t["bubble"], rel=1e-12, abs=1e-9)
        checked += 1
    assert checked == 3 and any(c[2] > 1 for c in bubble_cases()) and any(c[0] == 1 for c in bubble_cases())
    assert BUBBLE.cases is bubble_cases


def test_every_published_miss_is_explained_and_is_the_planners_prediction():
    rows = compare_runs()
    assert len(rows) == len(scored_runs()) >= 8
    assert unexplained(rows) == []
    assert any(c.miss for c in rows) and all(abs(c.points) <= MISS_POINTS or c.why for c in rows)
    c = rows[0]
    again = published_plan(run_job(c.run, efficiency=EFFICIENCY[c.run.gpu]), c.run)
    assert c.plan.step.total == again.step.total


def test_the_prompts_answer_is_the_axis_the_published_layouts_add():
    short, long = (next(r for r in RUNS if r.name == n) for n in (predictions.SHORT, predictions.LONG))
    assert predictions.added_axes(short, long) == ["cp"]
    answer = predictions.added_axis()
    assert answer.measured == answer.formula == "cp" and set(answer.values) == {"dp", "tp", "pp", "cp"}
    assert all(v >= 0 for v in answer.values.values())
