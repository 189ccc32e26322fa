"""Limits of what the checks can see: the bubble check tells (P-1)/(M+P-1) from (P-1)/(M+P), and verify's default
sizes split unevenly and run context parallelism (no processes: fabricated measurements, the run plan)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from wmdist.pipeline import measure
from wmdist.pipeline.measure import ALLOWANCE, SMALL_M, MeasuredBubble, off_by_one_gap


def _judged(stages, idle):
    """pp-bubble's verdict on fabricated measurements (no ranks): every timed step's idle fraction is idle(P, M)."""
    plans = measure.bubble_spec(stages)
    fakes = [MeasuredBubble(schedule=s, work=w, timelines=((),) * 3, idle=(x,) * 3, ideal=(), predicted=x)
             for s, w in plans.cases for x in [idle(s.stages, s.microbatches)]]
    return measure.bubble_verdict(plans, fakes)


@pytest.mark.parametrize("stages", range(2, 9))
def test_the_small_m_case_is_where_the_off_by_one_formula_misses_by_more_than_the_allowance(stages):
    gap = Fraction(stages - 1, stages) - Fraction(stages - 1, stages + 1)          # M = 1, by hand
    assert off_by_one_gap(stages, SMALL_M) == pytest.approx(float(gap), rel=1e-15)
    assert float(gap) > 1.9 * ALLOWANCE                                            # far outside the noise
    assert off_by_one_gap(4, 8) < ALLOWANCE                                        # the default M = 2P cannot tell


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_the_bubble_demo_fails_a_pipeline_that_idles_as_m_plus_p_predicts(no_processes, stages):
    assert all(c.passed for c in _judged(stages, lambda p, m: (p - 1) / (m + p - 1)).checks)
    report = _judged(stages, lambda p, m: (p - 1) / (m + p))                       # the off-by-one pipeline
    assert [c.passed for c in report.checks] == [True, False]                      # M = 2P passes; M = 1 catches it
    assert f"M={SMALL_M}: measured idle fraction == (P-1)/(M+P-1)" in report.checks[1].name


def test_one_stage_has_no_bubble_and_no_small_m_case(no_processes):
    report = _judged(1, lambda p, m: 0.0)
    assert report.checks[0].passed and len(report.checks) == 1


def test_verify_default_sizes_split_unevenly_and_run_context_parallel_meshes():
    """`wmdist verify` (default sizes) runs chapter 04 at N = 3, where 8 heads and 128 hidden units split 3, 3, 2 and
    43, 43, 42, the scan's T = 37 over 2, 4 and 8 ranks, and a mesh with cp = 2; and every one of them is planned."""
    from wmdist.costs.scan import time_chunk_sizes
    from wmdist.costs.tensor_parallel import shard_sizes
    from wmdist.registry.demos import plan
    from wmdist.mesh.demos import MESH_CP
    from wmdist.tensor_parallel.demos import CONFIG
    runs, left_out = plan()
    assert left_out == {}
    assert {("tp-block", 3), ("tp-layouts", 3), ("sp-vs-cp", 3)} <= set(runs)
    assert shard_sizes(CONFIG.heads, 3) == [3, 3, 2] and shard_sizes(CONFIG.hidden, 3) == [43, 43, 42]
    assert {("scan-affine", 2), ("scan-affine", 4), ("scan-affine", 8)} <= set(runs)
    assert time_chunk_sizes(37, 4) == [10, 9, 9, 9] and time_chunk_sizes(37, 8)[0] != time_chunk_sizes(37, 8)[-1]
    assert ("mesh-cp", 8) in runs and MESH_CP.cp == 2 and MESH_CP.dp * MESH_CP.tp * MESH_CP.pp * MESH_CP.cp == 8
