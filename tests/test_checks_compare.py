"""The one comparison helper and Check: NaN and inf never pass, exact values where they are exact (no processes)."""
from __future__ import annotations

import math

import pytest
import torch

from wmdist.course.compare import ROUNDOFF, bound_ratio, one_thread, reordered_terms, worst
from wmdist.course.report import Check, Report, close_check, differ_check, exact_check, format_table, max_abs_error

NAN, INF = math.nan, math.inf


def test_the_issue_repro_a_nan_gradient_no_longer_passes():
    ratio = bound_ratio(torch.full((5,), NAN), torch.ones(5), torch.full((5,), 1e-6))
    assert math.isnan(ratio)
    check = Check(name="gradient == full-batch gradient", error=ratio, tolerance=1.0, reason="rounding")
    assert not check.passed and "not finite" in check.describe()


@pytest.mark.parametrize("where", ["got", "want", "bound"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_a_non_finite_element_anywhere_makes_the_ratio_nan(where, bad):
    got, want, bound = torch.ones(4), torch.ones(4), torch.full((4,), 0.5)
    {"got": got, "want": want, "bound": bound}[where][2] = bad
    assert math.isnan(bound_ratio(got, want, bound))


def test_ratio_values_are_exact_where_they_are_exact():
    got, want = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.5, 2.0, 2.0])
    assert bound_ratio(got, want, torch.tensor([1.0, 1.0, 4.0])) == 0.5       # max(0.5/1, 0/1, 1/4)
    assert bound_ratio(got, want, 0.25) == 4.0                               # a scalar bound applies to every element
    assert bound_ratio(got, got, torch.zeros(3)) == 0.0                      # 0/0: nothing moved that may not
    assert bound_ratio(got, want, torch.tensor([1.0, 1.0, 0.0])) == INF      # x/0
    assert bound_ratio(got, want, torch.tensor([1.0, 1.0, 0.0]), covered_only=True) == 0.5
    assert bound_ratio(torch.ones(2, 3), torch.zeros(2, 3), torch.tensor([[1.0], [2.0]])) == 1.0   # broadcast rows
    assert bound_ratio(torch.ones(3), torch.ones(4), 1.0) == INF             # shapes differ
    assert bound_ratio(torch.empty(0), torch.empty(0), 1.0) == 0.0
    with pytest.raises(ValueError, match="a bound must be >= 0"):
        bound_ratio(got, want, -1.0)


def test_check_refuses_non_finite_errors_and_tolerances_both_ways():
    assert Check(name="x", error=1.0, tolerance=1.0, reason="r").passed and Check(name="x", error=1.0, tolerance=1.0, reason="r", must_differ=True).passed   # the edges
    assert not Check(name="x", error=1.0000001, tolerance=1.0, reason="r").passed and not Check(name="x", error=0.9999999, tolerance=1.0, reason="r", must_differ=True).passed
    for error, tol in [(NAN, 1.0), (INF, 1.0), (-INF, 1.0), (0.0, NAN), (0.0, INF), (1.0, -INF)]:
        for must_differ in (False, True):
            check = Check(name="x", error=error, tolerance=tol, reason="r", must_differ=must_differ)
            assert not check.passed, (error, tol, must_differ)
            assert check.describe().startswith("FAIL x: not finite")


def test_max_abs_error_never_maps_nan_to_a_number():
    ok, bad = torch.ones(3), torch.tensor([1.0, NAN, 1.0])
    assert math.isnan(max_abs_error(bad, ok)) and math.isnan(max_abs_error(ok, bad))
    assert math.isnan(max_abs_error([ok, bad], [ok, ok]))            # Python's max would pass over a later NaN
    assert math.isnan(max_abs_error([bad, 2 * ok], [ok, ok]))
    assert math.isnan(max_abs_error(torch.tensor([INF]), torch.tensor([INF])))
    assert math.isnan(max_abs_error(torch.tensor([1.0]), torch.tensor([INF])))
    assert max_abs_error([ok, 2 * ok], [ok, ok]) == 1.0
    assert max_abs_error(torch.ones(3), torch.ones(2)) == INF and max_abs_error([ok], [ok, ok]) == INF
    assert max_abs_error([], []) == 0.0 and max_abs_error(3, 1) == 2.0


def test_every_check_builder_fails_on_nan_and_inf():
    ok = torch.ones(3)
    for bad in (NAN, INF):
        poisoned = torch.tensor([1.0, bad, 1.0])
        assert not close_check("c", poisoned, ok, 1e9, "r").passed
        assert not exact_check("e", poisoned, ok).passed and not exact_check("e", poisoned, poisoned).passed
        assert not differ_check("d", poisoned, ok, 1e-9, "r").passed


def test_worst_picks_the_largest_and_a_nan_before_any_number():
    assert worst([0.1, 3.0, 2.0]) == 1
    assert worst([5.0, NAN, 1.0]) == 1 and worst([NAN, NAN]) == 0
    assert worst([1.0, INF, NAN]) == 2
    with pytest.raises(ValueError):
        worst([])


def test_roundoff_and_reordered_terms_are_their_formulas():
    assert ROUNDOFF[torch.float32] == 2.0 ** -24 and ROUNDOFF[torch.float64] == 2.0 ** -53
    with pytest.raises(TypeError):
        ROUNDOFF[torch.float16] = 2.0 ** -11                                 # shared, so read-only
    assert reordered_terms(8, 16, 12) == 24 and reordered_terms(8, 30, 12) == 30 and reordered_terms(8, 16, 40) == 40
    with pytest.raises(ValueError, match="width"):
        reordered_terms(0, 16, 12)


def test_chapter_term_counts_are_the_shared_formula():
    from wmdist.costs.tensor_parallel import BlockShape
    from wmdist.mesh.reference import mesh_terms as mesh_terms
    from wmdist.mesh.spec import MeshSpec
    from wmdist.tensor_parallel.compare import shape_terms as tp_terms
    shape = BlockShape(width=16, heads=4, hidden=64, batch=2, seq=8)
    assert tp_terms(shape) == max(3 * 16, 64, 2 * 8) == 64
    spec = MeshSpec()
    assert mesh_terms(spec) == max(3 * spec.width, spec.mlp_ratio * spec.width, spec.batch * spec.seq_len)


def test_one_thread_sets_one_and_puts_the_setting_back_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError
    assert torch.get_num_threads() == before


def test_a_report_that_broke_while_running_fails_and_says_why():
    broke = Report(name="demo", world_size=2, checks=[Check(name="x", error=0.0, tolerance=1.0, reason="r")], error="ValueError: tolerance must be finite, got nan")
    assert not broke.passed
    assert broke.failures[0] == "broke while running: ValueError: tolerance must be finite, got nan"
    assert "FAIL broke while running" in str(broke) and "broke while running" in broke._repr_html_()
    assert broke.to_dict()["error"].startswith("ValueError") and broke.to_dict()["passed"] is False
    assert format_table([broke], seconds=False).splitlines()[1].split() == ["demo", "2", "1/1", "-", "FAIL"]


def test_the_one_guard_stops_a_run_before_any_rank_starts(no_processes):
    from wmdist import runtime
    with pytest.raises(pytest.fail.Exception, match="a process was started"):
        runtime.run(lambda ctx: 0, 2)
