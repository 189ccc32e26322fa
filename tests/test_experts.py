"""Chapter 10, experts: the formulas by hand, the layer against a token-by-token loop, every demo at its sizes,
bad input refused first, uneven routing, tolerances pinned (0.4x passes, 3x fails), NaN failing, the exercise."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from wmdist import runtime
from wmdist.costs import experts as ec
from wmdist.experts import balance, demos, ep_dp
from wmdist.experts.moe import balance_loss, dispatch_order, moe_forward, route
from wmdist.experts.reference import layer_tolerance
from wmdist.experts.spec import LayerCase, LayerSpec, layer_spec

U32 = 2.0 ** -24


# --- formulas, by hand --------------------------------------------------------------------------

def test_capacity_is_the_ceiling_of_the_decimal_factor():
    assert ec.capacity(32, 2, 8, 1.0) == 8
    assert ec.capacity(10, 1, 4, 1.1) == 3                 # 11/10 * 10 / 4 = 2.75
    assert ec.capacity(100, 1, 10, 1.1) == 11              # the binary 1.1 * 100 / 10 is 11.000000000000002
    assert ec.capacity(0, 1, 4, 1.0) == 0
    with pytest.raises(ValueError, match="k=3 must be at most experts=2"):
        ec.capacity(8, 3, 2, 1.0)


def test_drops_kept_mask_imbalance_and_loads():
    assert ec.kept_mask([0, 0, 1, 0, 0], 2, 2) == [True, True, True, False, False]
    assert ec.kept_mask([0, 0, 1], 2, None) == [True] * 3
    assert ec.dropped([5, 1, 0], 2) == 3 and ec.dropped([5, 1, 0], None) == 0
    assert ec.imbalance([4, 0, 0, 0]) == 4.0 and ec.imbalance([2, 2]) == 1.0 and ec.imbalance([0, 0]) == 1.0
    assert ec.rank_loads([1, 2, 3, 4], 2) == [3, 7]
    assert ec.expert_counts([0, 3, 3], 4) == [1, 0, 0, 2]


def test_all_to_all_bytes_from_the_routing():
    # rank 0 routes to experts 0, 2, 3, 1; rank 1 to 3, 3. Experts 0, 1 on rank 0; 2, 3 on rank 1.
    m = ec.rank_matrix([[0, 2, 3, 1], [3, 3]], 4)
    assert m == [[2, 2], [0, 2]]
    t0, t1 = ec.rank_traffic(m, 16, 4)
    assert t0.dispatch == (2 * 64, 0) and t1.dispatch == (0, 2 * 64)
    assert t0.combine == (0, 128) and t0.combine_backward == (128, 0) and t0.dispatch_backward == (0, 128)
    assert t0.sent == 256 and t1.sent == 256
    assert ec.counts_exchange_bytes(8, 4) == 3 * 2 * 8
    assert ec.uniform_dispatch_bytes(8, 2, 4, 16, 4) == 8 * 2 * 3 / 4 * 64
    assert ec.padded_dispatch_bytes(8, 5, 16, 4) == 8 * 5 * 16 * 4


def test_skew_drop_fraction_and_times():
    assert ec.skewed_shares(4, 0.0) == [0.25] * 4
    assert ec.dropped_fraction([0.25] * 4, 1.0) == 0.0
    assert ec.dropped_fraction([0.5, 0.25, 0.25, 0.0], 1.0) == 0.25
    assert ec.dropped_fraction([0.5, 0.25, 0.25, 0.0], 2.0) == 0.0
    assert ec.expected_imbalance([0.5, 0.25, 0.25, 0.0]) == 2.0
    assert ec.transfer_time(1e9, 1e10) == 0.1
    assert ec.expert_time(10, 8, 16, 5120.0) == 4 * 10 * 8 * 16 / 5120
    with pytest.raises(ValueError, match="add up to 1"):
        ec.dropped_fraction([0.5, 0.6], 1.0)


def test_experts_must_divide_over_the_ranks():
    with pytest.raises(ValueError, match="experts=8 is not divisible by ranks=3"):
        ec.experts_per_rank(8, 3)


# --- the algorithm on one process -------------------------------------------------------------------

def _router(logits: list[float]) -> torch.nn.Linear:
    """A router whose logits for the input [[1.0]] are `logits` (weights set by hand, no bias)."""
    router = torch.nn.Linear(1, len(logits), bias=False)
    with torch.no_grad():
        router.weight.copy_(torch.tensor(logits, dtype=torch.float32).unsqueeze(1))
    return router


def test_routing_by_hand_top_2_gates_sum_to_one():
    # logits ln 1, ln 2, ln 3: probabilities 1/6, 2/6, 3/6; top 2 are experts 2 and 1, gates 3/5 and 2/5.
    # Tolerance 1e-6: a few float32 roundings of numbers near 1 (exp, one sum, one division).
    x = torch.ones(1, 1)
    with torch.no_grad():
        two = route(_router([math.log(1), math.log(2), math.log(3)]), x, k=2)
        one = route(_router([math.log(1), math.log(2), math.log(3)]), x, k=1)     # Switch: the probability itself
    assert two.experts.tolist() == [[2, 1]]
    assert torch.allclose(two.probs, torch.tensor([[1 / 6, 2 / 6, 3 / 6]]), atol=1e-6, rtol=0)
    assert torch.allclose(two.gates, torch.tensor([[0.6, 0.4]]), atol=1e-6, rtol=0)
    assert abs(float(two.gates.sum()) - 1.0) <= 1e-6
    assert one.experts.tolist() == [[2]] and abs(float(one.gates) - 0.5) <= 1e-6


def test_the_balancing_loss_by_hand():
    # Switch (k = 1), E = 2, T = 2: both tokens pick expert 0, so f = (1, 0); P = (0.65, 0.35); E * f.P = 1.3.
    probs = torch.tensor([[0.7, 0.3], [0.6, 0.4]], dtype=torch.float64)
    assert float(balance_loss(probs, torch.tensor([2, 0]), tokens=2, k=1)) == pytest.approx(1.3, abs=1e-12)
    # k = 2, E = 3, T = 2: token 0 picks experts 0, 1 and token 1 picks 1, 2, so counts (1, 2, 1) and
    # f = counts / (T k) = (1/4, 1/2, 1/4); P = (0.3, 0.45, 0.25); E * f.P = 3 * 0.3625 = 1.0875.
    # Dropping k from f would double it (2.175). Tolerance 1e-12: float64 sums of five terms.
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)
    assert float(balance_loss(probs, torch.tensor([1, 2, 1]), tokens=2, k=2)) == pytest.approx(1.0875, abs=1e-12)
    uniform = torch.full((4, 4), 0.25, dtype=torch.float64)            # perfectly balanced: the minimum, 1
    assert float(balance_loss(uniform, torch.tensor([2, 2, 2, 2]), tokens=4, k=2)) == pytest.approx(1.0, abs=1e-12)


def test_dispatch_order_groups_by_expert_in_token_order_and_inverts():
    ids = torch.tensor([2, 0, 2, 1, 0])
    order, inverse = dispatch_order(ids)
    assert order.tolist() == [1, 4, 3, 0, 2]
    assert torch.equal(order[inverse], torch.arange(5)) and torch.equal(ids[order][inverse], ids)


@pytest.mark.parametrize("router", ["random", "skewed", "one expert"])
@pytest.mark.parametrize("k,cap", [(1, None), (2, None), (1, 3), (2, 5)])
def test_layer_equals_a_token_by_token_loop(router, k, cap):
    """The grouped, permuted layer against the plain definition: for each token in order, sum over its k choices
    of gate x expert(token), an expert taking at most `cap` assignments (the first in token order)."""
    spec = LayerSpec(world_size=1, cases=(LayerCase(router=router, k=k),))
    moe = spec.layer(spec.cases[0])
    x, _ = spec.inputs()
    out = moe_forward(moe, x, cap=cap)
    taken = [0] * spec.experts
    want = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(out.routing.experts[t, j])
            if cap is None or taken[e] < cap:
                want[t] += out.routing.gates[t, j] * moe.experts[str(e)](x[t:t + 1])[0]
            taken[e] += 1
    assert torch.allclose(out.y, want, atol=1e-6, rtol=0)
    assert out.counts.tolist() == taken


# --- refused before any process starts ----------------------------------------------------------------

@pytest.mark.usefixtures("no_processes")
def test_bad_sizes_are_refused_before_any_process_starts():
    from wmdist.registry.demos import plan
    with pytest.raises(ValueError, match="not divisible by ranks=3"):
        demos.EP_DEMO.run(3)
    with pytest.raises(ValueError, match="moe-ep.*divisible"):
        plan(["moe-ep"], world_size=3)
    with pytest.raises(ValueError, match="ep=3 must divide the world size 4"):
        ep_dp.MeshTrainSpec(world_size=4, ep=3)
    with pytest.raises(ValueError, match="k <= E/N = 1"):
        LayerSpec(world_size=8, cases=(LayerCase(router="local", k=2),))
    with pytest.raises(ValueError, match="router must be one of"):
        LayerSpec(world_size=1, cases=(LayerCase(router="rnd", k=1),))          # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens=30 must be divisible by the world size 4"):
        LayerSpec(world_size=4, cases=(LayerCase(router="random", k=1),), tokens=30)


# --- every demo at every size it lists ------------------------------------------------------------------

@pytest.mark.parametrize("demo", demos.DEMOS + balance.DEMOS + ep_dp.DEMOS, ids=lambda d: d.name)
def test_each_demo_passes_at_its_world_sizes(demo):
    for n in demo.world_sizes:
        report = demo.run(n)
        assert report.passed, str(report)
        assert report.exact, "bytes and counts are checked against formulas"


def test_uneven_routing_is_in_the_demo_an_idle_expert_a_silent_rank_and_one_expert():
    report = demos.EP_DEMO.run(4)
    assert report.passed, str(report)
    rows = dict(zip(range(4), report.measured(quantity="rows received by this rank's experts", case="skewed, k=1")))
    assert rows[3] == 0                                                             # the last expert gets nothing
    assert report.measured(quantity="bytes sent", phase="dispatch", case="local, k=2")[0] == 0
    assert report.measured(quantity="bytes received", phase="dispatch", case="local, k=2")[0] == 0
    assert report.measured(quantity="bytes received", phase="dispatch", case="one expert, k=1") == [0, 0, 0, 3 * 8 * 32]


# --- tolerances pinned, NaN failing ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layer_results():
    spec = layer_spec(2, routers=("random",), ks=(2,))
    return spec, runtime.run(demos.layer_rank, 2, spec)


def _moved_run(results, rank: int, **changes):
    out = list(results)
    run = dataclasses.replace(out[rank].runs[0], **changes)
    out[rank] = demos.LayerRanks((run,))
    return out


def test_layer_tolerance_is_its_formula_and_the_checks_are_tight(layer_results):
    from wmdist.experts.reference import layer_reference
    spec, results = layer_results
    assert demos.compare_layer(spec, results).checks
    ref = layer_reference(spec, spec.cases[0], None)
    tol = layer_tolerance(spec, ref.y)
    assert tol == 2 * (max(8, 16, 32) - 1) * U32 * float(ref.y.abs().max())
    name = "random, k=2: output == one process"
    for times, passes in ((0.4, True), (3.0, False)):
        y = results[1].runs[0].y.clone()
        y[0, 0] += times * tol
        verdict = demos.compare_layer(spec, _moved_run(results, 1, y=y))
        assert next(c for c in verdict.checks if c.name == name).passed is passes
    g = dict(results[1].runs[0].grads)
    key = next(n for n in g if n.startswith("experts."))
    gtol = layer_tolerance(spec, ref.grads[key])
    for times, passes in ((0.4, True), (3.0, False)):
        moved = {**g, key: g[key].clone()}
        moved[key].view(-1)[0] += times * gtol
        verdict = demos.compare_layer(spec, _moved_run(results, 1, grads=moved))
        check = next(c for c in verdict.checks if "gradients" in c.name)
        assert check.passed is passes and (passes or check.detail == f"{key} on rank 1")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_inf_in_any_rank_result_fails(layer_results, bad):
    spec, results = layer_results
    for field in ("y", "dx"):
        t = getattr(results[0].runs[0], field).clone()
        t[0, 0] = bad
        verdict = demos.compare_layer(spec, _moved_run(results, 0, **{field: t}))
        assert any(not c.passed and not c.finite for c in verdict.checks), field


def test_ep_dp_parameter_check_is_tight():
    spec = ep_dp.mesh_train_spec(2)
    results = runtime.run(ep_dp.mesh_train_rank, 2, spec)
    ref = ep_dp.mesh_train_reference(spec)
    name = "moe.router.weight"
    for times, passes in ((0.4, True), (3.0, False)):
        params = {**results[1].params, name: ref.params[name].clone()}
        params[name].view(-1)[0] += times * ref.tolerances[name]
        moved = [results[0], dataclasses.replace(results[1], params=params)]
        check = ep_dp.compare_mesh_train(spec, moved).checks[-1]
        assert check.passed is passes


# --- our autograd all-to-all against torch's own, and the exercise ------------------------------------------

def _both_all_to_alls(ctx):
    import warnings

    import torch.distributed.nn.functional as dnn
    from wmdist.experts.dispatch import AllToAll, ExpertGroup
    torch.set_num_threads(1)
    send = [[1, 3], [0, 2]][ctx.rank]
    recv = [[1, 0], [3, 2]][ctx.rank]
    x = torch.randn(sum(send), 3, generator=torch.Generator().manual_seed(ctx.rank), requires_grad=True)
    w = torch.randn(sum(recv), 3, generator=torch.Generator().manual_seed(9 + ctx.rank))
    ep = ExpertGroup(ctx=ctx, group=None, rank=ctx.rank, size=2, experts=2)
    ours = AllToAll.apply(x, ep, send, recv, "dispatch")
    (ours * w).sum().backward()
    g_ours, x.grad = x.grad.clone(), None
    with warnings.catch_warnings():                 # torch 2.13 marks torch.distributed.nn's version deprecated
        warnings.simplefilter("ignore", FutureWarning)
        theirs = dnn.all_to_all_single(torch.empty(sum(recv), 3), x, output_split_sizes=recv,
                                       input_split_sizes=send)
    (theirs * w).sum().backward()
    return ours.detach(), theirs.detach(), g_ours, x.grad, [r.bytes_sent for r in ctx.ledger.records]


def test_our_all_to_all_equals_torch_distributed_nn_forward_and_backward():
    for rank, (ours, theirs, g_ours, g_theirs, sent) in enumerate(runtime.run(_both_all_to_alls, 2)):
        assert torch.equal(ours, theirs) and torch.equal(g_ours, g_theirs)
        assert sent == [[36, 0], [0, 36]][rank]     # 3 rows of 12 B from rank 0 to 1 forward, their gradients back


def test_exercise_solution_passes_and_a_wrong_inverse_fails():
    from wmdist.course.exercises import check
    from wmdist.experts.exercises import DISPATCH, dispatch_solution

    def wrong(ctx, expert_ids):
        order = torch.sort(expert_ids, stable=True).indices
        return torch.stack([order, order])              # the permutation is not its own inverse

    def stub(ctx, expert_ids):
        raise NotImplementedError

    assert check(DISPATCH, dispatch_solution).passed
    verdict = check(DISPATCH, wrong)
    assert not verdict.passed and "rank" in str(verdict)
    assert check(DISPATCH, stub).status == "not attempted yet"
