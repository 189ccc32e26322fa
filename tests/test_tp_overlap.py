"""tp-overlap: the MLP's all-reduce overlapped with the next microbatch's matmuls moves the same bytes and gives the
same output as the blocking schedule; the checks that say so can fail; the timings are reported, never asserted."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from wmdist.tensor_parallel.compare import reordered_tolerance
from wmdist.tensor_parallel.overlap import (SCHEDULES, TP_OVERLAP, TPOverlapSpec, compare_tp_overlap, overlap_reference,
                                            tp_overlap_rank)
from wmdist import runtime

SMALL = dict(tokens=64, width=16, hidden=64, microbatches=4, repeats=2)


@pytest.fixture(scope="module")
def run2():
    spec = TPOverlapSpec(world_size=2, **SMALL)
    return spec, runtime.run(tp_overlap_rank, 2, spec)


def test_both_schedules_same_bytes_same_output(run2):
    spec, results = run2
    verdict = compare_tp_overlap(spec, results)
    assert all(c.passed for c in verdict.checks), [c.line() for c in verdict.checks]
    assert all(c.measured == c.predicted for c in verdict.exact)
    for r in results:                                   # the schedule moves no byte: equal, and equal to M (T/M) H 4
        assert r.payload["blocking"] == r.payload["overlapped"] == 64 * 16 * 4
        assert r.all_reduces == {"blocking": 4, "overlapped": 4}


def test_timings_are_reported_not_checked(run2):
    spec, results = run2
    times = compare_tp_overlap(spec, results).data
    assert set(times.median) == {*SCHEDULES, "compute alone"}
    assert all(math.isfinite(t) and t > 0 for ts in times.median.values() for t in ts)
    assert math.isfinite(times.ratio())
    assert not any("second" in c.name or "faster" in c.name for c in compare_tp_overlap(spec, results).checks)


def _with(results, rank: int, **changes):
    out = list(results)
    out[rank] = dataclasses.replace(out[rank], **changes)
    return out


def test_overlapped_output_must_equal_blocking_bit_for_bit(run2):
    spec, results = run2
    moved = dict(results[1].outputs)
    moved["overlapped"] = moved["overlapped"].clone()
    moved["overlapped"][0, 0] = torch.nextafter(moved["overlapped"][0, 0], torch.tensor(math.inf))
    checks = compare_tp_overlap(spec, _with(results, 1, outputs=moved)).checks
    assert [c.name for c in checks if not c.passed] == ["overlapped == blocking on rank 1"]


@pytest.mark.parametrize("factor, passes", [(0.4, True), (3.0, False), (math.nan, False)])
def test_one_process_tolerance_is_pinned(run2, factor, passes):
    """The blocking output moved from the one-process MLP by 0.4x its allowance passes; 3x or NaN fails."""
    spec, results = run2
    ref = overlap_reference(spec)
    tol = reordered_tolerance(ref, spec.hidden)
    assert 0 < tol < 1e-3 * float(ref.abs().max())       # a few ulps' worth, not a loose allowance
    got = ref.clone()
    got[3, 5] = ref[3, 5] + factor * tol if not math.isnan(factor) else math.nan
    outs = {"blocking": got, "overlapped": got.clone()}
    check = [c for c in compare_tp_overlap(spec, _with(results, 0, outputs=outs)).checks
             if c.name == "blocking == one process on rank 0"][0]
    assert check.passed is passes


def test_a_schedule_that_moved_other_bytes_fails_its_count(run2):
    spec, results = run2
    extra = dict(results[0].payload, overlapped=results[0].payload["overlapped"] + 4)
    exact = compare_tp_overlap(spec, _with(results, 0, payload=extra)).exact
    wrong = [c for c in exact if c.measured != c.predicted]
    assert [(c.case, c.rank, c.quantity) for c in wrong] == [("overlapped", 0, "payload bytes")]


@pytest.mark.parametrize("bad, word", [(dict(tokens=10, microbatches=4), "microbatches"),
                                       (dict(hidden=1), "hidden"), (dict(repeats=0), "repeats")])
def test_bad_sizes_are_refused_before_any_process(bad, word):
    with pytest.raises(ValueError, match=word):
        TPOverlapSpec(world_size=2, **bad)


def test_registered_sizes_build():
    assert TP_OVERLAP.refuses(2) is None and TP_OVERLAP.refuses(4) is None
    assert TPOverlapSpec(world_size=4).payload_bytes() == 512 * 128 * 4
