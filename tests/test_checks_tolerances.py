"""Every tolerance helper pinned to its formula, and tight: no processes, fabricated rank results.

Pinned: each helper equals its formula, written out again here by hand (u = 2^-24 for float32), so a
tolerance widened by any factor fails. Tight: the chapter's own check is fed the single-device
answer with one element of one rank moved by 0.4 and by 3 times the stated bound; it passes the
first and fails the second, so the check compares at its tolerance (a x10 or x100 widening in
the check's call site passes 3x and is caught). Shared pattern: `_edges`.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from wmdist.costs.scan import time_chunk_sizes

U32 = 2.0 ** -24
EDGES = ((0.4, True), (3.0, False))      # (times the stated bound, check passes)

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the references as on a rank


def _moved(t: torch.Tensor, index: tuple[int, ...], by: float) -> torch.Tensor:
    out = t.clone()
    out[index] += by
    return out


# --- chapter 04: tensor parallelism -------------------------------------------------------------

def test_tp_tolerance_is_2_k_minus_1_u_max_ref_and_the_agreement_check_is_tight():
    from wmdist.tensor_parallel.compare import agreement_checks, reordered_tolerance
    ref = torch.tensor([[0.5, -3.0], [2.0, 1.0]], dtype=torch.float64)
    assert reordered_tolerance(ref, 48) == 2 * 47 * U32 * 3.0
    tol = 2 * 47 * U32 * 3.0
    for times, passes in EDGES:                     # rank 1 of 2 is off; rank 0 exact
        got = [{"out": ref.clone()}, {"out": _moved(ref, (1, 0), times * tol)}]
        check, = agreement_checks("tp", got, [{"out": ref}, {"out": ref}], 48)
        assert check.passed is passes and "worst: rank 1" in check.reason
    got = [{"out": ref.clone()}, {"out": _moved(ref, (0, 1), math.nan)}]      # a NaN on rank 1 is the worst rank
    check, = agreement_checks("tp", got, [{"out": ref}, {"out": ref}], 48)
    assert not check.passed and "worst: rank 1" in check.reason


# --- chapter 06: ring attention -----------------------------------------------------------------

def _attention_case():
    from wmdist.ring_attention.spec import RingSpec
    spec = RingSpec(seq_len=16)
    q, k, v, dout = spec.inputs(dtype="float32")
    return spec, q, k, v, dout


def test_ring_attention_tolerance_is_the_sum_of_both_first_order_bounds():
    from wmdist.costs.ring_attention import lse_rounding_bound, weight_rounding_bound
    from wmdist.ring_attention.tolerance import exact_attention, attention_tolerance
    _, q, k, v, dout = _attention_case()
    ex = exact_attention(q, k, v, dout, causal=True)
    d, s = q.shape[-1], k.shape[-2]
    mags = (ex.score_abs, ex.exponent_range, ex.lse_abs, U32)
    ours_w = weight_rounding_bound(d, 4, 8, *mags, exp_ulps=1.0)
    sdpa_w = weight_rounding_bound(d, s, s, *mags, exp_ulps=2.0)
    ours_l, sdpa_l = lse_rounding_bound(d, 4, 8, *mags, exp_ulps=1.0), lse_rounding_bound(d, s, s, *mags, exp_ulps=2.0)
    tol = attention_tolerance(ex, torch.float32, block_keys=4, key_blocks=8)
    pv = ex.p @ ex.v.abs()                           # sum_j p_ij |v_j|: the output's first-order bound per element
    assert torch.allclose(tol.out, 1.01 * (ours_w + sdpa_w) * pv, rtol=1e-12, atol=0)
    assert tol.lse == pytest.approx(1.01 * (ours_l + sdpa_l), rel=1e-12)
    assert tol.dq.shape == q.shape and tol.dk.shape == k.shape and bool((tol.dv > 0).all())


@pytest.mark.parametrize("key", ["out", "dk"])
def test_ring_attention_checks_are_tight_at_their_elementwise_bound(key):
    from wmdist.ring_attention.demos import RankCase, _checks, case_name
    from wmdist.ring_attention.ring import positions
    from wmdist.ring_attention.tolerance import exact_attention, attention_tolerance
    spec, q, k, v, dout = _attention_case()
    n, layout = 2, "zigzag"
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=True)
    want = dict(zip(("out", "dq", "dk", "dv"), (want.detach(), *torch.autograd.grad(want, leaves, dout))))
    bound = getattr(attention_tolerance(exact_attention(q, k, v, dout, causal=True), torch.float32, spec.tile(n),
                              spec.key_blocks(n)), key)
    where = (1, 0, 5, 3)                             # row 5 belongs to rank 1 in the zigzag layout of 16 on 2
    for times, passes in EDGES:
        moved = {**want, key: _moved(want[key], where, times * float(bound[where]))}
        ranks = []
        for r in range(n):
            rows = positions(spec.seq_len, n, r, layout=layout).tolist()
            grads = tuple(moved[g][:, :, rows] for g in ("dq", "dk", "dv"))
            case = RankCase(rows=rows, out=moved["out"][:, :, rows], grads=grads, sent={}, forward=None, backward=None)
            ranks.append({case_name("float32", causal=True, layout=layout): case})
        assert 5 in ranks[1][case_name("float32", causal=True, layout=layout)].rows
        checks = {c.name.rsplit(": ", 1)[1]: c for c in _checks(spec, n, ranks, "float32", True, layout)}
        assert checks[f"{key} == SDPA"].passed is passes
        assert all(c.passed for name, c in checks.items() if name != f"{key} == SDPA")


# --- chapter 07: the affine scan ----------------------------------------------------------------

def _abs_loop(case) -> float:
    """max over t of the loop run on |A|, |b|, |h0| in float64, written out again."""
    a, b, h = case.A.double().abs(), case.b.double().abs(), case.h0.double().abs()
    top = 0.0
    for t in range(case.steps):
        h = (a[:, t] * h if case.diagonal else torch.einsum("bij,bj->bi", a[:, t], h)) + b[:, t]
        top = max(top, float(h.max()))
    return top


@pytest.mark.parametrize("diagonal", [True, False])
def test_scan_affine_tolerance_is_two_gammas_times_the_absolute_loop(diagonal):
    from wmdist.scan.affine_demos import affine_tolerance
    from wmdist.scan.affine_ranks import AffineCase
    case = AffineCase.random(2, 37, 4, diagonal=diagonal, seed=3)
    c = 2 if diagonal else 4 + 1                      # roundings per compose/apply on a path
    depth = (10 - 1) + (4 - 1) + 9                    # N = 4: chunks 10, 9, 9, 9; fold, pass down, replay
    gamma = [c * d * U32 / (1 - c * d * U32) for d in (depth, 37)]
    assert affine_tolerance(case, 4) == pytest.approx(sum(gamma) * _abs_loop(case), rel=1e-12)


def test_scan_affine_agreement_check_is_tight_for_each_case():
    from wmdist.scan.affine import sequential
    from wmdist.scan.affine_demos import affine_cases, affine_agreement_checks, affine_tolerance
    from wmdist.scan.affine_ranks import RankOutcome, ScanRank
    cases, n = affine_cases(steps=13, state_sizes=(3,)), 3
    sizes = time_chunk_sizes(13, n)
    loops = [sequential(c.A, c.b, c.h0) for c in cases]
    for times, passes in EDGES:
        moved = [loops[0], _moved(loops[1], (1, 12, 2),                  # case 1, last rank's step
                                  times * affine_tolerance(cases[1], n))]
        outcomes = [ScanRank(tuple((RankOutcome(states=h[:, sum(sizes[:r]):sum(sizes[:r + 1])], composes=0, applies=0, bytes_sent=0, bytes_recv=0, messages=0),) * 2
                                   for h in moved)) for r in range(n)]
        checks = affine_agreement_checks(cases, outcomes, n)
        assert [c.passed for c in checks] == [True, True, passes, True]      # hand-off == all-gather: both moved


# --- chapter 08: token-sharded sampling ---------------------------------------------------------

def test_diffusion_shard_tolerance_is_eight_reordered_sums_and_the_velocity_check_is_tight():
    from wmdist.diffusion.denoiser import shard_tolerance
    from wmdist.diffusion.spec import SamplingSpec
    from wmdist.diffusion.token_parallel import _velocity_check
    spec = SamplingSpec()
    cfg = spec.model
    terms = max(cfg.tokens, cfg.dim, cfg.hidden, cfg.channels)
    whole = torch.randn(3, spec.batch, cfg.tokens, cfg.channels, generator=torch.Generator().manual_seed(0))
    assert shard_tolerance(cfg, 0.5 * whole[0] / whole[0].abs().max()) == 8 * 2 * (terms - 1) * U32 * 1.0
    tol = min(8 * 2 * (terms - 1) * U32 * float(w.abs().max()) for w in whole)
    for times, passes in EDGES:
        got = _moved(whole, (2, 0, cfg.tokens - 1, 0), times * tol)      # the last step, the last rank's token
        assert _velocity_check("v", spec, got, whole).passed is passes


# --- chapter 09: the mesh -----------------------------------------------------------------------

def test_mesh_tolerances_are_their_formulas_and_the_worst_entry_check_is_tight():
    from wmdist.mesh.reference import Reference, _worst
    ref = Reference(loss=0.25, pred_abs=2.0, grads={}, params={}, terms=96)
    g, p = torch.tensor([0.5, -4.0]), torch.tensor([1.0, -2.0])
    assert ref.grad_tolerance(g) == 2 * 95 * U32 * 4.0
    assert ref.param_tolerance(0.1, g, p) == pytest.approx(0.1 * 2 * 95 * U32 * 4.0 + 2 * U32 * (0.1 * 4.0 + 2.0),
                                                           rel=1e-15)
    assert ref.loss_tolerance(2, 8, 3) == pytest.approx(2 * 47 * U32 * 0.25 + 2 * 0.5 * 2 * 95 * U32 * 2.0, rel=1e-15)
    want = [{"w": g.double()}, {"w": p.double()}]
    for times, passes in EDGES:
        got = [{"w": g.double()}, {"w": _moved(p.double(), (1,), times * ref.grad_tolerance(p))}]
        check = _worst("grads", got, want, lambda r, n, w: ref.grad_tolerance(w), "why")
        assert check.passed is passes and check.detail == "w on rank 1"
    got = [{"w": g.double()}, {"w": _moved(p.double(), (0,), math.inf)}]
    check = _worst("grads", got, want, lambda r, n, w: ref.grad_tolerance(w), "why")
    assert not check.passed and check.detail == "w on rank 1" and "not finite" in check.describe()


# --- chapters 01 and 05: data-parallel and pipeline gradients -------------------------------------

def test_dp_gradient_bound_and_pipeline_tolerances_are_their_formulas():
    from wmdist.data_parallel.training import TrainSpec, gradient_bound
    from wmdist.pipeline.plan import PipeWork
    from wmdist.pipeline.stages import gradient_tolerance, loss_tolerance
    from wmdist.models.transformer import TransformerConfig
    spec = TrainSpec(batch_size=4, seq_len=6)
    sums = torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64)
    assert torch.equal(gradient_bound(spec, sums), (2 * (4 * 6 - 1) + 3) * U32 * sums)
    work = PipeWork()
    bt = work.batch_size * work.seq_len
    assert gradient_tolerance(work, 0.5) == 2 * (bt - 1) * U32 * 0.5
    o = TransformerConfig().obs_dim
    assert loss_tolerance(work, -0.75, 4) == pytest.approx((2 * (bt * o - 1) + 2 * 4 + 2) * U32 * 0.75, rel=1e-15)


def test_picard_rounding_level_is_the_running_sum_reordered():
    from wmdist.diffusion.sampler import running_sum_tolerance
    traj = torch.tensor([[1.0, -2.0], [1.5, -1.0], [0.5, -1.5]])               # K = 2 steps, 2 elements
    partial = max(1.0 + 0.5 + 1.0, 2.0 + 1.0 + 0.5)                             # |x_0| + sum |increments|, by hand
    assert running_sum_tolerance(traj) == 2 * (3 - 1) * U32 * partial


def test_ring_attention_gradient_bounds_are_their_first_order_formulas():
    """rounding_bounds' backward, written out again from its docstring: P recomputed (relative error E_P), dP and
    rowsum(dO * O) (Dv u each, plus O's error), dS = P (dP - delta) (3 u), sums over S rows ((S + 1) u)."""
    from wmdist.costs.ring_attention import lse_rounding_bound
    from wmdist.ring_attention.tolerance import exact_attention, rounding_bounds
    _, q, k, v, dout = _attention_case()
    ex = exact_attention(q, k, v, dout, causal=False)
    d, dv_dim, s_q, s_k = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    a, r, m = ex.score_abs, ex.exponent_range, ex.lse_abs
    got = rounding_bounds(ex, U32, 4, 8, 1.0)
    lse = lse_rounding_bound(d, 4, 8, a, r, m, U32, exp_ulps=1.0)
    e_p = (d + 1) * U32 * a + lse + U32 * (r + 2 * 1.0)
    p, do = ex.p, ex.dout.abs()
    dv = (p.transpose(-2, -1) @ do) * (e_p + (s_q + 1) * U32)
    delta = (do * got.out).sum(-1, keepdim=True) + dv_dim * U32 * (ex.dout * ex.o).abs().sum(-1, keepdim=True)
    ds = p * (dv_dim * U32 * (do @ ex.v.abs().transpose(-2, -1)) + delta + (ex.dp - ex.delta).abs() * (e_p + 3 * U32))
    dq = ex.scale * (ds @ ex.k.abs() + (s_k + 1) * U32 * (ex.ds.abs() @ ex.k.abs()))
    dk = ex.scale * (ds.transpose(-2, -1) @ ex.q.abs() + (s_q + 1) * U32 * (ex.ds.abs().transpose(-2, -1) @ ex.q.abs()))
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.allclose(getattr(got, name), want, rtol=1e-12, atol=0), name
