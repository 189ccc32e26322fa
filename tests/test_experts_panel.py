"""Chapter 10's panel: every number it shows is the costs.experts formula, bad input is refused, "run it" is checked.

The summary's numbers are read back out of the panel's HTML and compared with the formulas evaluated
here, from costs.experts directly, at several settings (skewed and uniform, drops and none, N = 1 to
16), so a wrong formula inlined in the model or the panel fails. The views are checked the same way
on the data they plot.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from wmdist.costs import experts as ecosts
from wmdist.costs.units import seconds, si
from wmdist.experts.panel import RUN_SIZES, ExpertsPanel, run_spec
from wmdist.experts.tradeoff import CAPACITY_SWEEP, ExpertsConfig, capacity_sweep, experts_view, rank_sweep
from wmdist.ui.static import strip_tags

SETTINGS = [ExpertsConfig(),
            ExpertsConfig(experts=16, k=1, ranks=8, capacity_factor=1.0, skew=1.2, tokens=512, width=256),
            ExpertsConfig(experts=4, k=2, ranks=2, capacity_factor=2.0, skew=0.0, element_size=4, link_gbps=12.5),
            ExpertsConfig(experts=64, k=4, ranks=16, capacity_factor=0.75, skew=0.3, hidden=1024, tflops=3.0),
            ExpertsConfig(experts=8, k=2, ranks=1, skew=2.0)]


def expected(c: ExpertsConfig) -> dict[str, float]:
    """The panel's numbers, each straight from costs.experts (written out here, not through the model)."""
    shares = ecosts.skewed_shares(c.experts, c.skew)
    cap = ecosts.capacity(c.ranks * c.tokens, c.k, c.experts, c.capacity_factor)
    loads = [c.ranks * c.tokens * c.k * s for s in shares]
    per_rank = ecosts.rank_loads(loads, c.ranks)
    row = [c.tokens * c.k * s for s in ecosts.rank_loads(shares, c.ranks)]
    traffic = ecosts.rank_traffic([row] * c.ranks, c.width, c.element_size)
    busy = max(max(t.dispatch) for t in traffic)
    kept = ecosts.rank_loads([min(x, cap) for x in loads], c.ranks)
    return {"capacity": cap, "dropped": ecosts.dropped_fraction(shares, c.capacity_factor),
            "imbalance": ecosts.expected_imbalance(shares), "busiest load": max(per_rank),
            "dispatch": busy, "uniform": ecosts.uniform_dispatch_bytes(c.tokens, c.k, c.ranks, c.width, c.element_size),
            "step sent": max(t.sent for t in traffic), "counts": ecosts.counts_exchange_bytes(c.experts, c.ranks),
            "padded": ecosts.padded_dispatch_sent(c.experts, c.ranks, ecosts.capacity(c.tokens, c.k, c.experts,
                                                                                    c.capacity_factor),
                                                  c.width, c.element_size),
            "a2a": 2 * ecosts.transfer_time(busy, c.link_gbps * 1e9),
            "compute": max(ecosts.expert_time(a, c.width, c.hidden, c.tflops * 1e12) for a in kept)}


@pytest.fixture(scope="module")
def panel():
    p = ExpertsPanel()
    yield p
    p.prefetch.idle()


def show(panel: ExpertsPanel, config: ExpertsConfig) -> str:
    with panel.holding():
        for name, c in panel.controls.items():
            c.value = getattr(config, name)
    panel.update()
    assert not panel.error, panel.error
    return strip_tags(panel.summary.value)


@pytest.mark.parametrize("config", SETTINGS, ids=range(len(SETTINGS)))
def test_every_number_shown_is_the_formula(panel, config):
    text, want = show(panel, config), expected(config)
    assert f"C = ⌈c N T k / E⌉ = {want['capacity']:,} per expert" in text
    assert f"{100 * want['dropped']:.1f}% dropped" in text
    assert f"max/mean {want['imbalance']:.2f}" in text
    assert f"get {want['busiest load']:,.0f} assignments" in text
    assert f"one dispatch: up to {si(want['dispatch'], 'B')}" in text
    assert f"uniform routing {si(want['uniform'], 'B')}" in text
    assert f"{si(want['step sent'], 'B')} sent by the busiest" in text
    assert f"plus {si(want['counts'], 'B')} of counts" in text
    assert f"would send {si(want['padded'], 'B')} per rank" in text
    assert f"dispatch + combine {seconds(want['a2a'])}" in text
    assert f"experts {seconds(want['compute'])}" in text
    assert f"take {want['a2a'] / want['compute']:.2f}× the compute" in text
    v = panel.result                      # and unrounded, where the text rounds
    assert v.capacity == want["capacity"] and v.dispatch_bytes == pytest.approx(want["dispatch"], rel=1e-12)
    assert v.a2a_seconds == pytest.approx(want["a2a"], rel=1e-12)
    assert v.compute_seconds == pytest.approx(want["compute"], rel=1e-12)


def test_uniform_routing_gives_the_uniform_formula_on_every_rank():
    v = experts_view(ExpertsConfig(skew=0.0, ranks=8, experts=16))
    assert all(math.isclose(t.dispatch[0], v.uniform_bytes, rel_tol=1e-12) for t in v.traffic)
    assert all(math.isclose(t.dispatch[1], v.uniform_bytes, rel_tol=1e-12) for t in v.traffic)
    assert v.imbalance == pytest.approx(1.0) and v.dropped_fraction == 0.0


def test_views_plot_the_formulas():
    c = SETTINGS[1]
    for v in rank_sweep(c):
        assert v.dispatch_bytes == pytest.approx(expected(v.config)["dispatch"], rel=1e-12)
        assert v.a2a_seconds == pytest.approx(expected(v.config)["a2a"], rel=1e-12)
    assert [v.config.ranks for v in rank_sweep(c)] == ecosts.divisors(c.experts)
    sweep = capacity_sweep(c)
    assert [v.config.capacity_factor for v in sweep] == list(CAPACITY_SWEEP)
    for v in sweep:
        shares = ecosts.skewed_shares(c.experts, c.skew)
        assert v.dropped_fraction == ecosts.dropped_fraction(shares, v.config.capacity_factor)
        assert v.padded_bytes == expected(v.config)["padded"]
    drops = [v.dropped_fraction for v in sweep]
    assert drops == sorted(drops, reverse=True) and drops[0] > drops[-1]       # more room, fewer drops


def test_the_figure_shows_the_loads_and_the_capacity(panel):
    show(panel, SETTINGS[0])
    panel.selector.value = "tokens per expert"
    ax = panel.shown.axes[0]
    kept = [p.get_height() for p in ax.containers[0]]
    cap = panel.result.capacity
    assert kept == pytest.approx([min(x, cap) for x in panel.result.loads])
    assert [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == "--"] == [cap]


def test_capacity_slider_lands_on_its_decimal(panel):
    panel.controls["capacity_factor"].value = 1.1500000000000001     # what a browser's float steps can send
    assert panel.config.capacity_factor == 1.15
    panel.controls["capacity_factor"].value = 1.25


@pytest.mark.parametrize("change, message", [({"ranks": 16}, "experts=8 is not divisible by ranks=16"),
                                             ({"experts": 2, "ranks": 2, "k": 4}, "k=4 must be at most experts=2"),
                                             ({"ranks": 8, "experts": 4}, "try ranks in [1, 2, 4]")])
def test_bad_input_shows_an_error_and_no_picture(panel, change, message):
    with panel.holding():
        for name, value in change.items():
            panel.controls[name].value = value
    panel.update()
    assert message in panel.error and panel.shown is None and panel.png == b""
    assert "cannot compute" in panel.status.value and panel.summary.value == ""
    show(panel, SETTINGS[0])
    assert panel.shown is not None


def test_run_it_is_refused_past_its_limits_before_any_process():
    with pytest.raises(ValueError, match="ranks must be at most 8"):
        run_spec(ExpertsConfig(experts=16, ranks=16))
    with pytest.raises(ValueError, match="experts must be at most 64"):
        run_spec(ExpertsConfig(experts=128, ranks=4))


def test_run_it_returns_a_report_whose_bytes_equal_the_formula():
    panel = ExpertsPanel(replace(ExpertsConfig(), experts=8, k=2, ranks=4, capacity_factor=1.0))
    run = panel.run()
    assert run is not None, panel.status.value
    report = run.report
    assert report.passed, report.failures
    for phase in ("dispatch", "combine", "combine backward", "dispatch backward"):
        for what in ("bytes sent", "bytes received"):
            counts = report.counts(quantity=what, phase=phase, case=run.case)
            assert len(counts) == 4 and all(c.passed for c in counts)
            assert sum(c.measured for c in counts) > 0
    sent = report.measured(quantity="bytes sent", phase="dispatch", case=run.case)
    received = report.measured(quantity="bytes received", phase="dispatch", case=run.case)
    assert sum(sent) == sum(received)                                  # every row sent is received
    assert sum(sent) <= 4 * RUN_SIZES["tokens"] * 2 * RUN_SIZES["width"] * 4
    assert panel.selector.value == "measured" and "ledger bytes equal the formula" in panel.summary.value
    drawn = panel.shown.axes[0]
    heights = [p.get_height() for p in drawn.containers[0]]
    assert heights == sent                                             # the view plots the ledger's bytes
    panel.controls["k"].value = 1                                      # another setting: the run is not claimed
    assert "Measured" not in panel.summary.value
    panel.prefetch.idle()


def test_a_failed_run_is_reported_in_the_panel():
    panel = ExpertsPanel(ExpertsConfig(experts=16, ranks=16))
    assert panel.run() is None and "ranks must be at most 8" in panel.status.value
    panel.prefetch.idle()
