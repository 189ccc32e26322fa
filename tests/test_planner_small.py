"""The planner's small end: chapter 09's 8-rank mesh step from alpha, beta and matmul FLOP/s, worked by hand.

Default mesh (wmdist.mesh.spec.MeshSpec): width 32, 4 heads, MLP 128, 4 layers, context 8, batch 8 in 2
microbatches per dp rank, dp 2 x tp 2 x pp 2. Rank 0 holds 2 layers, 2 heads and 64 MLP units, and the
embedding; its microbatches are 2 trajectories each. Bytes and messages come from costs.mesh.axis_traffic
(checked against the ledger in chapter 09); what is pinned here is the time each becomes and what overlaps.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from wmdist.costs.mesh import axis_traffic
from wmdist.mesh.spec import MeshSpec
from wmdist.planner.small import mesh_step_prediction

ALPHA, BETA, FLOPS, CORES = 1e-4, 1e-9, 1e9, 2
REL = 1e-12


def test_each_term_of_the_local_step():
    shape = MeshSpec().shape
    step = mesh_step_prediction(shape, alpha_s=ALPHA, beta_s_per_byte=BETA, flops_per_s=FLOPS, cores=CORES)
    matmul = 2 * (4 * 32 * 2 * 8 + 2 * 32 * 64)                    # QKV + output of 2 heads, 64 MLP units
    attention = 4 * 8 * 2 * 2 * (8 * 9 // 2)                       # 4 d per causal pair, 2 heads, 2 rows
    per_micro = 3 * (2 * (matmul * 2 * 8 + attention) + 2 * (16 + 4) * 32 * 2 * 8)
    rate = FLOPS * CORES / 8                                        # 8 ranks share 2 cores
    assert step.compute == pytest.approx(2 * per_micro / rate, rel=REL)
    traffic = axis_traffic(shape, {"dp": 0, "tp": 0, "pp": 0, "cp": 0})
    for axis in ("tp", "pp", "dp"):
        expected = traffic[axis].messages * ALPHA + traffic[axis].bytes_sent * BETA
        assert step.axes[axis].exposed == pytest.approx(expected, rel=REL), axis   # nothing hides them
    assert step.axes["cp"].exposed == 0.0 and step.elementwise == step.optimizer == 0.0
    assert step.bubble == pytest.approx((2 - 1) / 2 * (step.compute + step.axes["tp"].exposed), rel=REL)
    assert step.total == pytest.approx(sum(step.terms.values()), rel=REL)


def test_context_parallel_ring_hides_under_attention():
    shape = MeshSpec(dp=1, tp=1, pp=2, cp=4, seq_len=64, batch=4).shape
    slow_link = mesh_step_prediction(shape, alpha_s=1e-3, beta_s_per_byte=BETA, flops_per_s=FLOPS, cores=CORES)
    cp = slow_link.axes["cp"]
    assert 0 < cp.exposed < cp.seconds                              # part of the ring is under the attention
    fast = mesh_step_prediction(shape, alpha_s=1e-9, beta_s_per_byte=1e-15, flops_per_s=FLOPS, cores=CORES)
    assert fast.axes["cp"].exposed == 0.0


def test_more_cores_than_ranks_do_not_speed_a_rank_up():
    shape = MeshSpec().shape
    eight = mesh_step_prediction(shape, alpha_s=ALPHA, beta_s_per_byte=BETA, flops_per_s=FLOPS, cores=8)
    many = mesh_step_prediction(shape, alpha_s=ALPHA, beta_s_per_byte=BETA, flops_per_s=FLOPS, cores=64)
    assert eight.compute == many.compute == pytest.approx(4 * eight.compute / 4)
    with pytest.raises(ValueError, match="alpha_s"):
        mesh_step_prediction(shape, alpha_s=-1.0, beta_s_per_byte=BETA, flops_per_s=FLOPS, cores=CORES)
    assert replace(MeshSpec(), cp=1).world_size == 8


def test_the_warm_steps_are_timed_in_parts_that_add_up():
    """Eight real ranks, two warm steps: every part is a finite positive time and the parts sum to the step (the
    same perf_counter readings, so only float addition separates them: 1e-12 s)."""
    import math

    from wmdist.mesh.scenarios import MESH_3D
    from wmdist.mesh.warm import measure_mesh_steps, slowest_steps
    ranks = measure_mesh_steps(MESH_3D, repeats=2)
    assert len(ranks) == MESH_3D.world_size and all(len(r) == 2 for r in ranks)
    for p in (p for r in ranks for p in r):
        assert all(math.isfinite(x) and x > 0 for x in (p.schedule, p.sync, p.optimizer))
        assert abs(p.schedule + p.sync + p.optimizer - p.total) <= 1e-12
    slow = slowest_steps(ranks)
    assert [s.total for s in slow] == [max(r[k].total for r in ranks) for k in range(2)]


def test_bad_repeats_is_refused_before_any_rank_starts():
    from wmdist.mesh.scenarios import MESH_3D
    from wmdist.mesh.warm import measure_mesh_steps
    with pytest.raises(ValueError, match="repeats"):
        measure_mesh_steps(MESH_3D, repeats=0)
