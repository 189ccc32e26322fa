"""Reports a notebook can query: counts by structured key, checks by name, a table view, JSON."""
from __future__ import annotations

import json

import pytest

from wmdist.course.report import Check, Count, Report, counts_per_rank, fact_check, format_table, to_json


def _report() -> Report:
    exact = counts_per_rank("bytes sent", [10, 12], [10, 12], step=0)
    exact += counts_per_rank("bytes sent", [10, 13], [10, 12], step=1)
    exact += counts_per_rank("held bytes", [4, 4], [4, 4], case="parameters")
    checks = [Check(name="sum == reference", error=1e-7, tolerance=1e-6, reason="reordered float32 sum"),
              Check(name="naive mean is wrong", error=0.2, tolerance=1e-3, reason="1000x rounding", must_differ=True)]
    return Report(name="demo", world_size=2, checks=checks, exact=exact, seconds=0.5, params={"numel": 11})


def test_counts_are_looked_up_by_key_in_rank_order():
    r = _report()
    assert r.measured(quantity="bytes sent", step=1) == [10, 13]
    assert r.predicted(quantity="bytes sent", step=1) == [10, 12]
    assert [c.step for c in r.counts(quantity="bytes sent", rank=1)] == [0, 1]
    assert r.measured(quantity="held bytes", case="parameters") == [4, 4]
    assert r.counts(quantity="no such thing") == []
    with pytest.raises(ValueError, match="unknown keys"):
        r.counts(stage=1)


def test_a_single_wrong_count_fails_the_report_and_is_named():
    r = _report()
    assert not r.passed
    assert r.failures == ["rank 1 bytes sent [step 1]: measured 13 != predicted 12"]
    assert r.check("naive mean is wrong").passed
    with pytest.raises(KeyError, match="sum == reference"):
        r.check("missing")


def test_text_html_and_json_views():
    r = _report()
    text = str(r)
    assert text.splitlines()[0] == "demo on 2 rank(s): FAIL"
    assert "FAIL bytes sent [step 1] per rank: measured [10, 13], predicted [10, 12]" in text
    html = r._repr_html_()
    # one table per reason (two here) and one of exact counts; each reason is said once, above its rows
    assert html.count("<table>") == 3 and "naive mean is wrong" in html and "held bytes [case parameters]" in html
    assert html.count("reordered float32 sum") == 1 and html.count("1000x rounding") == 1
    many = Report(name="many", world_size=2, checks=[Check(name=f"rank {i}", error=0.1, tolerance=1.0, reason="same reason") for i in range(12)])
    folded = many._repr_html_()
    assert folded.count("same reason") == 1 and "<details>" in folded and "all ok</b>, 12 check(s)" in folded
    assert "<details open>" in Report(name="bad", world_size=2, checks=[*many.checks, Check(name="x", error=2.0, tolerance=1.0, reason="same reason")])._repr_html_()
    d = json.loads(to_json([r]))[0]
    assert d["passed"] is False and d["exact"][0] == {"quantity": "bytes sent", "rank": 0, "measured": 10,
                                                      "predicted": 10, "phase": None, "step": 0, "case": None}
    assert "data" not in d
    assert format_table([r], seconds=False).splitlines()[1].split() == ["demo", "2", "2/2", "5/6", "FAIL"]


def test_count_label_names_its_keys():
    assert Count(quantity="bytes sent", rank=0, measured=1, predicted=1, phase="ring", step=2).label == "bytes sent [phase ring, step 2]"
    assert Count(quantity="rounds", rank=0, measured=1, predicted=1).label == "rounds"


def test_the_listing_says_how_each_check_passed_without_its_machine_dependent_numbers():
    """A passing line carries no error value (it would differ between machines); a failing one carries them all."""
    checks = [Check(name="exact", error=0.0, tolerance=0.0, reason="same ops"), Check(name="lucky zero", error=0.0, tolerance=1e-6, reason="rounding"),
              Check(name="close", error=3.1e-7, tolerance=1e-6, reason="rounding"), Check(name="pitfall", error=0.5, tolerance=1e-3, reason="r", must_differ=True),
              fact_check("pointer moved", holds=True, reason="rename"),
              Check(name="worst", error=2e-7, tolerance=1e-6, reason="r", detail="w on 1")]
    report = Report(name="demo", world_size=2, checks=checks, exact=[Count(quantity="bytes", rank=0, measured=8, predicted=8), Count(quantity="bytes", rank=1, measured=8, predicted=8)])
    assert report.listing(counts=True).splitlines() == [
        "PASS exact: bit for bit", "PASS lucky zero: within its tolerance", "PASS close: within its tolerance",
        "PASS pitfall: differs by at least 0.001", "PASS pointer moved: holds", "PASS worst: within its tolerance",
        "PASS bytes: equal to its formula on every rank"]
    assert report.listing(only=lambda c: c.must_differ) == "PASS pitfall: differs by at least 0.001"
    assert "[worst: w on 1]" in report.checks[-1].describe() and "w on 1" not in report.checks[-1].name


def test_failing_lines_keep_their_numbers_and_a_fact_that_does_not_hold_fails():
    wrong = Report(name="demo", world_size=2, checks=[Check(name="close", error=2e-6, tolerance=1e-6, reason="rounding"), Check(name="nan", error=float("nan"), tolerance=1e-6, reason="rounding"),
                               fact_check("pointer moved", holds=False, reason="rename")], exact=[Count(quantity="bytes", rank=0, measured=9, predicted=8)])
    lines = wrong.listing(counts=True).splitlines()
    assert lines[0] == "FAIL close: max abs error 2e-06 > 1e-06 (rounding)"
    assert lines[1].startswith("FAIL nan: not finite")
    assert lines[2] == "FAIL pointer moved: does NOT hold (rename)" and not wrong.passed
    assert lines[3] == "FAIL bytes: measured [9], predicted [8]"
    assert Report(name="demo", world_size=2, error="boom").listing() == "FAIL demo broke while running: boom"
