"""Chapter 11's panel search: exact within its stated space, close to the CLI's full search, and bounded in work.

No clock: a move's cost is counted as calls of partial_breakdown and gpu_memory (the search's only expensive
work), so a regression that searches more fails whatever the machine's load. Steps compared exactly are the
same formula on the same layout (equal floats); the full search comparison allows 2% at the default job
(measured 1.005 there).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from wmdist.planner import panel_search as ps
from wmdist.planner.explore import TOP, PlannerConfig, job_of
from wmdist.planner.panel import PlannerPanel
from wmdist.planner.rank import plan, rank_layouts

SMALL = PlannerConfig(model="mcore-7.1b", gpu="h100", gpus=64, batch_tokens=2 * 2 ** 20, seq_len=4096)
MOE = PlannerConfig(model="mixtral-8x22b", gpu="h100", gpus=256, batch_tokens=4 * 2 ** 20, seq_len=4096)
TIGHT = PlannerConfig(model="gpt3-175b", gpu="h100", gpus=64, batch_tokens=2 ** 20, seq_len=2048)   # needs every pair


def brute_force(config: PlannerConfig) -> list:
    """Every shape with its first fitting SECONDARY pair, fully evaluated, fastest first (ties by enumeration)."""
    job, found = job_of(config), []
    for i, shape in enumerate(ps.panel_shapes(job)):
        for zero, recompute in ps.SECONDARY:
            p = plan(job, replace(shape, zero=zero, recompute=recompute))
            if p.fits:
                found.append((p.step.total, i, p))
                break
    return [p for _, _, p in sorted(found, key=lambda t: t[:2])][:TOP]


@pytest.mark.parametrize("config", [SMALL, MOE, TIGHT], ids=["dense", "moe", "tight"])
def test_the_search_is_exact_within_its_space(config):
    got = ps.panel_search(job_of(config), top=TOP)
    expected = brute_force(config)
    assert not got.exhausted and len(expected) == TOP
    assert [p.layout for p in got.plans] == [p.layout for p in expected]
    assert [p.step.total for p in got.plans] == [p.step.total for p in expected]
    assert [p.memory for p in got.plans] == [p.memory for p in expected]
    if config is TIGHT:          # the memory-tight job's best layouts use every SECONDARY pair
        assert {(p.layout.zero, p.layout.recompute) for p in got.plans} == set(ps.SECONDARY)


def test_the_panels_best_is_within_two_per_cent_of_the_full_search():
    """At the default 405B job (measured 1.005; 1.00-1.01 at 2,048 GPUs, 128K context and GPT-3 on 1,024). A small
    job can gain more from the knobs the panel fixes: 7.1B on 64 GPUs runs 8% faster with 4 sequences per
    microbatch, which the page's rule says the CLI may find."""
    job = job_of(PlannerConfig())
    full = rank_layouts(job, top=1)[0].step.total
    best = ps.panel_search(job, top=TOP).plans[0].step.total
    assert full <= best <= 1.02 * full


def test_the_evaluation_count_is_the_work_done(monkeypatch):
    calls = {"n": 0}

    def counted(f):
        def wrapper(*a, **k):
            calls["n"] += 1
            return f(*a, **k)
        return wrapper
    monkeypatch.setattr(ps, "gpu_memory", counted(ps.gpu_memory))
    monkeypatch.setattr(ps, "partial_breakdown", counted(ps.partial_breakdown))
    got = ps.panel_search(job_of(PlannerConfig()), top=TOP)
    assert calls["n"] == got.evaluations > 0


def test_the_cap_stops_the_search_and_says_so(monkeypatch):
    monkeypatch.setattr(ps, "MAX_EVALUATIONS", 30)
    job = job_of(PlannerConfig())
    shapes = len(ps.panel_shapes(job))
    got = ps.panel_search(job, top=TOP)
    assert got.exhausted and got.evaluations <= max(30, shapes) + 1


@pytest.mark.parametrize("change", [dict(), dict(gpus=512), dict(gpus=65536, batch_tokens=2 ** 20),
                                    dict(seq_len=131072), dict(model="mixtral-8x22b"),
                                    dict(model="bloom-176b", gpu="a100-80gb", gpus=256, seq_len=2048)])
def test_a_move_costs_at_most_the_stated_evaluations(change):
    """The panel's presets, the default and its corners: each search within MAX_EVALUATIONS (a regression to the
    full search costs thousands), and none of them stopped by the cap."""
    got = ps.panel_search(job_of(replace(PlannerConfig(), **change)), top=TOP)
    assert got.evaluations <= ps.MAX_EVALUATIONS and not got.exhausted and got.plans


def test_the_page_states_the_rule():
    p = PlannerPanel(SMALL)
    try:
        shown = p.details(p.config, p.result)
        assert "may find a faster layout" in shown and "<table>" in shown
    finally:
        p.prefetch.cancel(clear=True)
        p.prefetch.idle()


def test_a_panel_move_to_a_new_job_is_one_bounded_search(monkeypatch):
    """Counted at both searches' expensive calls: a panel wired back to rank.rank_layouts spends thousands."""
    from wmdist.planner import rank
    calls = {"n": 0}

    def counted(f):
        def wrapper(*a, **k):
            calls["n"] += 1
            return f(*a, **k)
        return wrapper
    for module in (ps, rank):
        monkeypatch.setattr(module, "gpu_memory", counted(module.gpu_memory))
        monkeypatch.setattr(module, "partial_breakdown", counted(module.partial_breakdown))
    p = PlannerPanel()
    try:
        p.prefetch.cancel(clear=True)
        p.prefetch.idle()
        monkeypatch.setattr(p.prefetch, "schedule", lambda jobs: None)   # no look-ahead: count this move alone
        for gpus in (8192, 2048):
            before = calls["n"]
            p.controls["gpus"].value = gpus
            assert p.result.job.gpus == gpus and p.result.plans
            assert 0 < calls["n"] - before <= ps.MAX_EVALUATIONS, gpus
    finally:
        p.prefetch.cancel(clear=True)
        p.prefetch.idle()
