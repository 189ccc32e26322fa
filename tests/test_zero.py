"""ZeRO-1/2/3 on real ranks: held bytes and ledger bytes exactly as predicted, weights as single-process Adam."""
from __future__ import annotations

import pytest

from wmdist import costs
from wmdist.exercises import check
from wmdist.memory import exercises, zero, zero_demos
from wmdist.models import count_parameters, make_model

P = count_parameters(make_model())   # 2,105: not divisible by 3, so the chunks are uneven


def held(report, kind):
    return report.counts(quantity="held bytes", case=kind)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_held_and_sent_bytes_exact_on_uneven_chunks(stage):
    assert P % 3 != 0
    report = zero_demos.zero_memory_report(3, stage)
    assert not report.failures, report.failures
    for kind in zero.HELD_KINDS:                       # measured from tensors == memory.per_rank_bytes, every rank
        rows = held(report, kind)
        assert [r.rank for r in rows] == [0, 1, 2] and all(r.passed for r in rows)
    sharded = {1: ["optimizer_state"], 2: ["optimizer_state", "gradients"],
               3: ["optimizer_state", "gradients", "parameters"]}[stage]
    for kind in zero.HELD_KINDS:
        measured = report.measured(quantity="held bytes", case=kind)
        per_element = 8 if kind == "optimizer_state" else 4
        expected = [n * per_element for n in costs.ring_chunk_sizes(P, 3)] if kind in sharded else [P * per_element] * 3
        assert measured == expected                   # and the uneven split really shows: 702, 702, 701
    sent = report.counts(quantity="bytes sent per step")
    assert len(sent) == (9 if stage == 3 else 6) and all(r.passed for r in sent)
    assert all(r.passed for r in report.counts(quantity="rounds per step"))


def test_stage3_sends_one_and_a_half_times_an_allreduce():
    for r in range(3):
        allreduce = costs.ring_allreduce_bytes(P, 3, r)
        assert sum(costs.zero_step_bytes(P, 3, r, 1).values()) == allreduce
        assert sum(costs.zero_step_bytes(P, 3, r, 2).values()) == allreduce
        s3 = costs.zero_step_bytes(P, 3, r, 3)
        assert sum(s3.values()) == allreduce + costs.ring_all_gather_bytes(P, 3, r)


def test_replicated_workers_do_not_shrink_the_footprint():
    one, three = zero_demos.zero_memory_report(1, 0), zero_demos.zero_memory_report(3, 0)
    assert one.passed and three.passed
    for kind in zero.HELD_KINDS:
        assert set(three.measured(quantity="held bytes", case=kind)) == set(one.measured(quantity="held bytes", case=kind))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_rank_is_bitwise_torch_adam(stage):
    report = zero_demos.zero_memory_report(1, stage)
    assert report.checks[0].tolerance == 0.0 and report.checks[0].error == 0.0


def test_weights_match_single_process_adam_within_reduction_order_tolerance():
    cfg = zero.ZeroConfig(stage=3, steps=5)
    report = zero_demos.zero_memory_report(3, 3, cfg)
    check_ = report.checks[0]
    assert 0 < check_.tolerance < 1e-5 and check_.passed, str(report)


def test_our_zero1_matches_torch_zero_redundancy_optimizer():
    report = zero_demos.torch_zero_report(3)
    assert report.passed, str(report)
    assert [c.name for c in report.checks][1] == "our ZeRO-1 == ZeroRedundancyOptimizer"


def test_shard_range_tiles_the_vector():
    ranges = [zero.shard_range(P, 4, r) for r in range(4)]
    assert ranges[0][0] == 0 and ranges[-1][1] == P
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    with pytest.raises(ValueError, match="rank"):
        zero.shard_range(P, 4, 4)


def test_bad_inputs_fail_before_any_process(monkeypatch):
    def no_processes(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(zero_demos, "run", no_processes)
    with pytest.raises(ValueError, match="stage must be one of"):
        zero_demos.zero_memory_report(2, 4)
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        zero_demos.zero_memory_report(0, 1)
    with pytest.raises(ValueError, match="stage must be one of"):
        zero.ZeroConfig(stage=True)
    with pytest.raises(ValueError, match="steps"):
        zero.ZeroConfig(steps=-1)
    with pytest.raises(ValueError, match="stage must be one of"):
        costs.zero_step_bytes(10, 2, 0, 5)


def test_exercise_accepts_the_reference_and_rejects_a_wrong_chunk():
    assert check(exercises.SHARD_UPDATE, exercises.shard_update_solution).passed

    def whole_vector(ctx, params, local_grad):          # forgets to keep only its own chunk
        return params - 0.01 * local_grad.sign()
    verdict = check(exercises.SHARD_UPDATE, whole_vector)
    assert not verdict.passed and "shape" in str(verdict)
