"""The planner's small end: chapter 09's 8-rank mesh step from counted operators and messages and measured costs,
worked by hand.

Default mesh (wmdist.mesh.spec.MeshSpec): width 32, 4 heads, MLP 128, 4 layers, context 8, batch 8 in 2
microbatches per dp rank, dp 2 x tp 2 x pp 2. A rank holds 2 layers, 2 heads and 64 MLP units; stage 0 also
the embedding, stage 1 the head. Its microbatches are 2 trajectories x 8 tokens. Per step each rank sends 32 tp
messages (2 layers x 2 microbatches x 4 all-reduces x 2 ring rounds) of 2048 B per all-reduce, 2 pp messages of
2048 B and 4 dp messages (2 buckets x 2 rounds) carrying its whole gradient once; cp sends nothing.
"""
from __future__ import annotations

import math

import pytest

from wmdist.mesh.spec import MeshSpec
from wmdist.planner.small import (CalibrationPoint, LocalCosts, fit_local_costs, mesh_step_prediction,
                                  own_cores_step, shared_cores_step)

OP, RATE, MSG, ALPHA, BETA = 5e-6, 4e10, 5e-4, 1e-3, 1e-9
OPS, OPT = [400, 430], [81, 84]                  # made-up operator counts per stage (step, optimizer step)
REL = 1e-12
SHAPE = MeshSpec().shape


def costs(cores: int) -> LocalCosts:
    return LocalCosts(op_s=OP, flops_per_s=RATE, message_s=MSG, alpha_s=ALPHA, beta_s_per_byte=BETA, cores=cores)


# FLOPs of one step on a rank, forward and backward (3x), per microbatch of 2 x 8 = 16 tokens:
MATMUL = 2 * (4 * 32 * 2 * 8 + 2 * 32 * 64)      # per token and layer: QKV + output of 2 heads, 64 MLP units
ATTN = 4 * 8 * 2 * 2 * (8 * 9 // 2)              # per layer: 4 d per causal pair, 2 heads, 2 rows
FLOPS = [2 * 3 * (2 * (MATMUL * 16 + ATTN) + 2 * (16 + 4) * 32 * 16),    # stage 0: the embedding
         2 * 3 * (2 * (MATMUL * 16 + ATTN) + 2 * 32 * 16 * 16)]          # stage 1: the head
# Parameters of a rank: per block 4H (LayerNorms) + 3*16*33 (QKV) + 32*16+32 (out) + 64*33+32*64+32 (MLP) = 6448;
# stage 0 adds the embedding (21 x 32) and positions (8 x 32), stage 1 ln_f (64) and the head (16 x 33).
PARAMS = [2 * 6448 + 21 * 32 + 8 * 32, 2 * 6448 + 64 + 16 * 33]
MESSAGES = {"tp": 32, "pp": 2, "dp": 4}
BYTES = {"tp": [16 * 2048] * 2, "pp": [2 * 2048] * 2, "dp": [4 * n for n in PARAMS]}   # dp: 2(N-1)/N = 1 at N=2


def test_shared_cores_every_ranks_cpu_over_the_cores():
    """8 ranks on 2 cores: each term is the 8 ranks' CPU seconds for it (4 per stage) / 2, and no bubble."""
    step = shared_cores_step(SHAPE, costs(2), stage_ops=OPS, optimizer_ops=OPT)
    assert step.compute == pytest.approx(sum(4 * (OPS[p] * OP + FLOPS[p] / RATE) for p in (0, 1)) / 2, rel=REL)
    assert step.optimizer == pytest.approx(4 * (81 + 84) * OP / 2, rel=REL)
    for axis, n in MESSAGES.items():
        cpu = sum(4 * (n * MSG + BYTES[axis][p] * BETA) for p in (0, 1))
        assert step.axes[axis].exposed == step.axes[axis].seconds == pytest.approx(cpu / 2, rel=REL), axis
    assert step.axes["cp"].exposed == step.bubble == step.elementwise == step.recompute == 0.0
    assert step.total == pytest.approx(sum(step.terms.values()), rel=REL)
    assert mesh_step_prediction(SHAPE, costs(2), stage_ops=OPS, optimizer_ops=OPT) == step    # the larger bound


def test_own_cores_the_clusters_rule_with_alpha_and_beta():
    """Rank 0 on a core of its own: its compute, messages at alpha and beta, nothing hidden, the GPipe bubble
    (P - 1)/M = 1/2 of compute + tp. With 8 cores for 8 ranks it is the larger bound, so it is the prediction."""
    step = own_cores_step(SHAPE, costs(8), stage_ops=OPS, optimizer_ops=OPT)
    compute = 400 * OP + FLOPS[0] / RATE
    assert step.compute == pytest.approx(compute, rel=REL) and step.optimizer == pytest.approx(81 * OP, rel=REL)
    for axis, n in MESSAGES.items():
        assert step.axes[axis].exposed == pytest.approx(n * ALPHA + BYTES[axis][0] * BETA, rel=REL), axis
    assert step.bubble == pytest.approx((compute + 32 * ALPHA + 16 * 2048 * BETA) / 2, rel=REL)
    shared = shared_cores_step(SHAPE, costs(8), stage_ops=OPS, optimizer_ops=OPT)
    assert shared.total < step.total
    assert mesh_step_prediction(SHAPE, costs(8), stage_ops=OPS, optimizer_ops=OPT) == step
    far = {"dp": 1, "tp": 1, "pp": 1, "cp": 0}
    last = own_cores_step(SHAPE, costs(8), stage_ops=OPS, optimizer_ops=OPT, coords=far)
    assert last.compute == pytest.approx(430 * OP + FLOPS[1] / RATE, rel=REL)


def test_context_parallel_ring_hides_under_attention():
    shape = MeshSpec(dp=1, tp=1, pp=2, cp=4, seq_len=64, batch=4).shape
    slow = LocalCosts(op_s=OP, flops_per_s=1e9, message_s=MSG, alpha_s=1e-3, beta_s_per_byte=BETA, cores=8)
    cp = own_cores_step(shape, slow, stage_ops=OPS, optimizer_ops=OPT).axes["cp"]
    assert 0 < cp.exposed < cp.seconds                              # part of the ring is under the attention
    fast = LocalCosts(op_s=OP, flops_per_s=1e9, message_s=MSG, alpha_s=1e-9, beta_s_per_byte=1e-15, cores=8)
    assert own_cores_step(shape, fast, stage_ops=OPS, optimizer_ops=OPT).axes["cp"].exposed == 0.0


def test_the_fit_recovers_the_costs_that_made_the_points():
    """cpu = ops op_s + flops / rate + messages message_s, exactly, at five cases: the fit gives back the three."""
    cases = [(97, 3e5, 0), (190, 6e5, 0), (97, 1.9e7, 8), (194, 6e5, 16), (98, 3e5, 4)]
    points = [CalibrationPoint(o, f, m, o * 4e-6 + f / 3e10 + m * 6e-4) for o, f, m in cases]
    op_s, rate, message_s = fit_local_costs(points)
    assert (op_s, rate, message_s) == pytest.approx((4e-6, 3e10, 6e-4), rel=1e-9)
    with pytest.raises(ValueError, match="points do not resolve"):          # no messages: message_s fits at 0
        fit_local_costs([CalibrationPoint(o, f, 0, o * 4e-6 + f / 3e10) for o, f, _ in cases])
    with pytest.raises(ValueError, match="points must hold at least 3"):
        fit_local_costs(points[:2])
    with pytest.raises(ValueError, match="points' cpu_s"):
        fit_local_costs([*points[:2], CalibrationPoint(1, 1.0, 1, 0.0)])


def test_bad_inputs_are_refused_naming_the_argument():
    good = dict(op_s=OP, flops_per_s=RATE, message_s=MSG, alpha_s=ALPHA, beta_s_per_byte=BETA, cores=2)
    for name, bad in (("op_s", 0.0), ("flops_per_s", -1.0), ("message_s", math.inf), ("alpha_s", 0.0),
                      ("beta_s_per_byte", -1e-9), ("cores", 0), ("cores", 1.5)):
        with pytest.raises(ValueError, match=name):
            LocalCosts(**{**good, name: bad})
    with pytest.raises(ValueError, match="stage_ops must give one count per pipeline stage"):
        mesh_step_prediction(SHAPE, costs(2), stage_ops=[400], optimizer_ops=OPT)
    with pytest.raises(ValueError, match="optimizer_ops entry"):
        mesh_step_prediction(SHAPE, costs(2), stage_ops=OPS, optimizer_ops=[81, -1])
    with pytest.raises(ValueError, match="coords\\['tp'\\]"):
        own_cores_step(SHAPE, costs(2), stage_ops=OPS, optimizer_ops=OPT, coords={"dp": 0, "tp": 2, "pp": 0, "cp": 0})


def test_the_operator_counts_are_exact():
    """One warm step of each stage of MESH_3D, counted twice (the same): the matmuls, LayerNorms, attentions and
    gradient accumulations derived by hand below, and the totals this torch dispatches (views included)."""
    from wmdist.mesh.calibrate import OpCounter, count_optimizer_ops, count_stage_ops
    from wmdist.mesh.scenarios import MESH_3D
    import torch
    a = torch.ones(2, 2)
    with OpCounter() as tiny:
        _ = a @ a + 1                                               # one mm, one add
    assert tiny.counts == {"aten.mm.default": 1, "aten.add.Tensor": 1}
    stages = count_stage_ops(MESH_3D)
    assert stages == count_stage_ops(MESH_3D)
    for p, c in enumerate(stages):
        # per microbatch: forward, the row layers (out, fc2) of 2 blocks are mm and the column layers (qkv, fc1)
        # addmm, as is the embedding or head; backward, every linear's weight and input gradient is an mm, but
        # the embedding's input (the data) needs none.
        assert c["aten.mm.default"] == 2 * (2 * 2 + 2 * 4 * 2 + (1 if p == 0 else 2)), p
        assert c["aten.addmm.default"] == 2 * (2 * 2 + 1), p
        assert c["aten.native_layer_norm.default"] == c["aten.native_layer_norm_backward.default"] == 2 * (4 + p)
        assert c["aten._scaled_dot_product_flash_attention_for_cpu.default"] == 2 * 2
        assert c["aten.add_.Tensor"] == [27, 28][p]                # the 2nd microbatch accumulates each gradient
    assert [c.total() for c in stages] == [406, 430]
    # Momentum's warm step: buf.mul_(m), buf.add_(g), p.add_(buf): 3 per parameter tensor (27 and 28 of them).
    assert [c.total() for c in count_optimizer_ops(MESH_3D)] == [3 * 27, 3 * 28]
    with pytest.raises(ValueError, match="cp"):
        count_stage_ops(MeshSpec(dp=2, tp=2, pp=1, cp=2))


def test_the_calibration_runs_every_case_on_the_meshs_ranks():
    """Eight real ranks, one timed iteration per case: the counts are the cases' (by hand), the times finite."""
    from wmdist.mesh.calibrate import CASES, measure_calibration
    from wmdist.mesh.scenarios import MESH_3D
    points = measure_calibration(MESH_3D, repeats=1)
    assert len(points) == len(CASES)
    for (depth, width, per_block), p in zip(CASES, points):
        assert p.messages == 2 * per_block * depth * 2                # forward and backward, 2 rounds of a pair
        assert math.isfinite(p.cpu_s) and p.cpu_s > 0
    attention = 4 * 4 * 4 * 2 * (8 * 9 // 2)                         # head width 4, 4 heads, 2 rows, causal
    assert points[0].flops == 3 * (24 * 16 * 16 * 16 + attention)    # one block of width 16 on 16 tokens
    assert points[3].ops == points[0].ops + 1                        # the message's own view of its input
    with pytest.raises(ValueError, match="repeats"):
        measure_calibration(MESH_3D, repeats=0)
    with pytest.raises(ValueError, match="nothing to calibrate"):
        measure_calibration(MeshSpec(dp=1, tp=1, pp=1, batch=2), repeats=1)


def test_the_warm_steps_are_timed_in_parts_that_add_up():
    """Eight real ranks, two warm steps: every part is a finite positive time and the parts sum to the step (the
    same perf_counter readings, so only float addition separates them: 1e-12 s)."""
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
