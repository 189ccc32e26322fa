"""Chapter 09: one step on a combined mesh, every axis counted, against one device, the formulas and the calculator."""
from __future__ import annotations

import dataclasses
from itertools import permutations

import pytest
import torch

from wmdist.comm import Mesh
from wmdist.costs import collectives as coll
from wmdist.costs import pipeline as pcosts
from wmdist.costs import ring_attention as racosts
from wmdist.costs import tensor_parallel as tpcosts
from wmdist.costs.mesh import (
    TRAFFIC_AXES,
    StepShape,
    axis_in_node,
    axis_traffic,
    microbatch_rows,
    rank_params,
    stage_layers,
    strides,
)
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.mesh import demos as D
from wmdist.mesh.exercises import axis_group_cases, axis_group_solution
from wmdist.mesh.patterns import PatternsConfig, patterns, place
from wmdist.mesh.reference import agreement, reference_step
from wmdist.mesh.scenarios import LONG_CONTEXT, MESH_3D, MESH_CP, TINY, WIDE
from wmdist.mesh.spec import MeshSpec
from wmdist.mesh.stage import MeshStage, full_model
from wmdist.mesh.step import mesh_step
from wmdist.mesh.tables import mesh_memory_table, side_by_side
from wmdist.runtime import run

SHAPE = StepShape(width=24, heads=6, hidden=96, layers=5, seq_len=12, batch=7, microbatches=3, dp=2, tp=4, pp=2,
                  cp=3, buckets=3, max_len=12)       # uneven heads (6 over 4), layers (5 over 2), rows (7 over 2, 3)


pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks


# --- the formulas, without processes ------------------------------------------------------------

@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2), (4, 2), (3, 3)])
def test_rank_params_counts_the_tensors_a_stage_holds(tp, pp):
    spec = MeshSpec(width=24, heads=6, layers=5, seq_len=12, batch=8, microbatches=1, dp=1, tp=tp, pp=pp, cp=1)
    for t in range(tp):
        for p in range(pp):
            stage = MeshStage(full_model(spec), spec, t, p)
            assert sum(x.numel() for x in stage.parameters()) == rank_params(spec.shape, t, p)
    assert rank_params(dataclasses.replace(spec.shape, tp=1, pp=1), 0, 0) == sum(
        x.numel() for x in full_model(spec).parameters())


def test_per_axis_formulas_agree_with_each_chapters_own():
    s = SHAPE
    mesh = Mesh(dp=s.dp, tp=s.tp, pp=s.pp, cp=s.cp)
    per_rank = [axis_traffic(s, mesh.coords(r)) for r in range(mesh.world_size)]
    # pp: M(P-1) boundary transfers each way (chapter 05), summed over one pipeline of each (dp, tp, cp) position
    line = mesh.axis_ranks(0, "pp")
    assert sum(per_rank[r]["pp"].messages for r in line) == 2 * pcosts.boundary_transfers(s.pp, s.microbatches)
    for r in range(mesh.world_size):
        c = mesh.coords(r)
        rows = microbatch_rows(s, c["dp"])
        layers = stage_layers(s, c["pp"])
        # tp: chapter 04's Megatron schedule per block and microbatch
        tp = sum(tpcosts.schedule_bytes(tpcosts.block_schedule(tpcosts.BlockShape(batch=b, seq=s.tokens, width=s.width,
                                                                                    heads=s.heads, hidden=s.hidden),
                                                             s.tp, layout="tp"), c["tp"])
                 for b in rows) * layers
        assert per_rank[r]["tp"].bytes_sent == tp
        # cp: chapter 06's ring, forward N-1 sends and backward 2(N-1), per block and microbatch, plus the grad sum
        heads = coll.ring_chunk_sizes(s.heads, s.tp)[c["tp"]]
        ring = sum(racosts.ring_kv_bytes_per_rank(s.seq_len, s.cp, 2 * heads * s.head_dim, batch=b, elem_size=4)
                   + sum(racosts.ring_backward_bytes_per_rank(s.seq_len, s.cp, 2 * heads * s.head_dim, batch=b,
                                                              elem_size=4))
                   for b in rows) * layers
        grads = sum(coll.ring_allreduce_bytes(n, s.cp, c["cp"])
                    for n in coll.ring_chunk_sizes(rank_params(s, c["tp"], c["pp"]), s.buckets))
        assert per_rank[r]["cp"].bytes_sent == ring + grads
        assert per_rank[r]["cp"].messages == 3 * racosts.ring_kv_sends(s.cp) * layers * len(rows) + 3 * 2 * (s.cp - 1)
        # dp: the ring all-reduce of the buckets, 2(N-1) rounds each
        assert per_rank[r]["dp"].messages == s.buckets * coll.ring_allreduce_rounds(s.dp)


def test_the_axis_that_sends_most_changes_with_the_mesh():
    """Notebook 09's opening claim: rank 0's largest sender is dp on the 3-D mesh and cp on the context mesh."""
    rank0 = {"dp": 0, "tp": 0, "pp": 0, "cp": 0}
    heaviest = [max(t := axis_traffic(s.shape, rank0), key=lambda a: t[a].bytes_sent) for s in (MESH_3D, MESH_CP)]
    assert heaviest == ["dp", "cp"]


def test_axis_in_node_matches_the_groups_of_a_mesh():
    for dp, tp, pp, cp in [(2, 2, 2, 1), (3, 2, 2, 2), (2, 4, 1, 2), (4, 1, 3, 1)]:
        sizes = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}
        for order in permutations(("dp", "cp", "tp", "pp")):
            mesh = Mesh(dp=dp, tp=tp, pp=pp, cp=cp, order=order)
            where = strides(sizes, order)
            for per_node in (1, 2, 3, 4, 8):
                for axis in TRAFFIC_AXES:
                    brute = all(len({r // per_node for r in g}) == 1 for g in mesh.groups(axis))
                    assert axis_in_node(sizes[axis], where[axis], per_node, mesh.world_size) == brute


def test_no_universal_ranking_and_the_best_order_beats_every_other():
    results = [patterns(c) for c in (TINY, WIDE, LONG_CONTEXT)]          # notebook 09's three models
    assert [r.by_bytes[0] for r in results] == ["dp", "tp", "cp"]            # three different leaders
    assert set(results[0].latency_bound()) == {"dp", "tp", "pp"}             # tiny messages: latency-bound
    assert results[1].latency_bound() == []                                 # huge ones: bandwidth-bound
    assert results[2].best.order != results[2].default.order                # long context: cp gets the node
    assert results[2].best.inside["cp"] and not results[2].default.inside["cp"]
    for r in results:
        totals = [place(r.config, r.traffic, o).total for o in permutations(("dp", "cp", "tp", "pp"))]
        assert r.best.total == min(totals)


def test_bad_sizes_are_refused_with_the_argument_named(no_processes):
    for call, words in [(lambda: MeshSpec(tp=8), "tp 8 is more than the 4 heads"),
                        (lambda: MeshSpec(cp=3), "seq_len 8 must be divisible by cp 3"),
                        (lambda: MeshSpec(pp=8), "pp 8 is more than the 4 layers"),
                        (lambda: MeshSpec(batch=3), "batch 3 is less than dp \\* microbatches"),
                        (lambda: MeshSpec(seq_len=65), "seq_len must be an integer from 1 to 64"),
                        (lambda: D.mesh_3d_demo(4), "world_size 4 does not fit the mesh 2dp x 2tp x 2pp"),
                        (lambda: D.mesh_2d_demo(8), "needs exactly dp \\* tp \\* pp \\* cp = 4 ranks"),
                        (lambda: D.run_mesh(MESH_CP, 4), "world_size 4 does not fit the mesh 2dp x 2cp x 2tp"),
                        (lambda: MemoryConfig(tp=2, param_pieces=(1, 2, 3)), "param_pieces must be a tuple of"),
                        (lambda: PatternsConfig(inter_gbps=0.0), "inter_gbps must be > 0")]:
        with pytest.raises(ValueError, match=words):
            call()


def test_each_mesh_demo_refuses_every_size_but_its_own_in_its_spec(no_processes):
    """The refusal is structural: `refuses(n)` is the spec's own ValueError, named, for every n but dp*tp*pp*cp."""
    for demo in D.DEMOS:
        size = demo.spec(demo.world_sizes[0]).world_size
        assert demo.world_sizes == (size,) and demo.refuses(size) is None
        for n in (1, 2, 3, 4, 5, 8, 16):
            why = demo.refuses(n)
            assert (why is None) == (n == size)
            assert why is None or why.startswith(f"{demo.name}: world_size {n} does not fit the mesh")


def test_momentum_is_torchs_sgd_bitwise():
    from wmdist.mesh.step import Momentum
    g = torch.Generator().manual_seed(0)
    ours, theirs = (torch.nn.Linear(5, 3) for _ in range(2))
    theirs.load_state_dict(ours.state_dict())
    mine = Momentum(list(ours.parameters()), 0.05)
    torch_sgd = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ours.parameters()]
        for model, opt in ((ours, mine), (theirs, torch_sgd)):
            for p, gr in zip(model.parameters(), grads):
                p.grad = gr.clone()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


def test_exercise_reference_is_the_mesh_layout():
    for rank, axis, dp, tp, pp, cp in axis_group_cases():
        mesh = Mesh(dp=dp, tp=tp, pp=pp, cp=cp)
        assert axis_group_solution(rank, axis, dp, tp, pp, cp) == mesh.axis_ranks(rank, axis)


def test_panel_slider_redraws_and_a_bad_combination_clears_the_figure():
    from wmdist.mesh.panel import PatternsPanel
    panel = PatternsPanel()
    panel.controls["width"].value = 4096                           # its speed: `wmdist bench panels`, not a test
    assert panel.result.config.width == 4096 and "Best order" in panel.summary.value
    panel.controls["tp"].value = 8                                 # more tp ranks than the 4 heads
    assert panel.shown is None and "tp 8 is more than the 4 heads" in panel.status.value
    panel.controls["heads"].value = 32
    assert panel.shown is not None and panel.run() is None         # 64 ranks: run it refuses before starting any
    assert "world size must be at most 8" in panel.status.value


# --- real ranks ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mesh3d():
    return D.mesh_3d_demo(8)


def test_3d_mesh_matches_one_device_the_formulas_and_the_calculator(mesh3d):
    assert mesh3d.passed, mesh3d.failures
    run = mesh3d.data
    assert {c.name.split(" ==")[0] for c in mesh3d.checks} == {"loss (sum of the last stage's shares)",
                                                                "every gradient", "every parameter after the step"}
    for phases in run.phases:                                      # every byte sits under one of the four axes
        assert all(p.split("/")[0] in TRAFFIC_AXES for p in phases)
    assert all(run.measured[r]["pp"].bytes_sent > 0 and run.measured[r]["cp"].bytes_sent == 0 for r in range(8))
    assert "8/8" in side_by_side(run) and side_by_side(run).count("8/8") == 4
    assert mesh_memory_table(run).count("8/8") == 3
    cfg = D.memory_config(MeshSpec())
    assert run.held_predicted[0]["parameters"] == per_rank_bytes(cfg, rank=0)["parameters"] == 4 * rank_params(
        MeshSpec().shape, 0, 0)


def _along(ctx):
    from wmdist.comm import isend, recv, ring_all_reduce
    mesh = Mesh(dp=2, tp=4)
    tp = ctx.along(mesh, "tp")
    total = ring_all_reduce(tp, torch.tensor([float(ctx.rank)]), phase="x")             # recorded as "tp/x/..."
    dp = ctx.along(mesh, "dp")
    if dp.rank == 0:
        isend(dp, torch.zeros(3), 1, phase="dp/already named").wait()                   # the prefix is not doubled
    else:
        recv(dp, torch.zeros(3), 0, phase="dp/already named")
    return tp.rank, tp.world_size, dp.rank, float(total), list(ctx.ledger.by_phase(kind=None))


def test_an_axis_view_is_the_rank_seen_from_one_axis(mesh3d):
    out = run(_along, 8)
    mesh = Mesh(dp=2, tp=4)
    for r, (tp_rank, tp_size, dp_rank, total, phases) in enumerate(out):
        assert (tp_rank, tp_size, dp_rank) == (mesh.coords(r)["tp"], 4, mesh.coords(r)["dp"])
        assert total == sum(mesh.axis_ranks(r, "tp"))                           # summed over its tp group only
        assert phases == ["tp/x/reduce-scatter", "tp/x/all-gather", "dp/already named"]


def test_groups_are_cached_on_the_warm_ranks(mesh3d):
    first, again = D.mesh_3d_demo(8), D.mesh_3d_demo(8)
    assert first.passed and again.passed and first.data.groups == again.data.groups   # no new group the 2nd time
    assert mesh3d.data.groups[0] >= 4                                               # dp, tp, pp, cp were made


def test_a_wrong_gradient_fails_the_check(mesh3d):
    spec = MeshSpec()
    steps = run(mesh_step, 8, spec)                               # warm pool: a fraction of a second
    name = next(iter(steps[3].grads))
    steps[3].grads[name] += 1e-3 * steps[3].grads[name].abs().max()
    checks = agreement(spec, reference_step(spec), steps)
    assert [c.passed for c in checks] == [True, False, True] and "on rank 3" in checks[1].detail


def test_1f1b_order_gives_the_same_step_and_bytes(mesh3d):
    report = D.run_mesh(dataclasses.replace(MESH_3D, schedule="1f1b", microbatches=4), 8, name="mesh-3d 1f1b")
    assert report.passed, report.failures
    assert [m["pp"].messages for m in report.data.measured] == [4] * 8       # M = 4 each way, in another order


def test_context_parallel_mesh_passes():
    report = D.mesh_cp_demo(8)
    assert report.passed, report.failures
    run = report.data
    assert all(m["cp"].bytes_sent > 0 and m["pp"].bytes_sent == 0 for m in run.measured)
    assert any(p.startswith("cp/ring kv") for p in run.phases[0]) and any(p.startswith("tp/") for p in run.phases[0])


def test_run_it_overlays_the_ledger(mesh3d):
    from wmdist.mesh.panel import PatternsPanel
    panel = PatternsPanel()
    measured = panel.run()
    assert measured is not None and "PASS" in panel.status.value and "equal the formulas" in panel.summary.value
    assert any(line.get_label() == "measured (ledger)" for line in panel.shown.axes[0].lines)


# --- the expert-parallel row (chapter 10's all-to-alls as a fifth pattern) -----------------------

def _ep_bytes(c: PatternsConfig) -> float:
    """The EP row from costs.experts directly: per block on the shown stage and per microbatch, four uniform
    all-to-alls of the microbatch's b c tokens over the dp ranks and one counts exchange."""
    from wmdist.costs import experts as ecosts
    shape = c.shape
    coords = {"dp": 0, "tp": 0, "pp": 1 if shape.pp > 2 else 0, "cp": 0}
    rows = microbatch_rows(shape, 0)
    return stage_layers(shape, coords["pp"]) * sum(
        4 * ecosts.uniform_dispatch_bytes(b * shape.tokens, c.top_k, shape.dp, shape.width, 4)
        + ecosts.counts_exchange_bytes(c.experts, shape.dp) for b in rows)


def test_no_experts_leaves_the_four_patterns_as_they_were():
    for c in (PatternsConfig(), TINY, WIDE, LONG_CONTEXT):
        r = patterns(c)
        assert c.experts == 0 and c.axes == TRAFFIC_AXES and set(r.traffic) == set(TRAFFIC_AXES)
        assert all(set(p.exposed) == set(TRAFFIC_AXES) for p in r.placements)


@pytest.mark.parametrize("change", [dict(experts=8), dict(experts=16, top_k=1, dp=4, batch=16),
                                    dict(experts=4, top_k=4, seq_len=64, microbatches=4, pp=4, layers=8, batch=16),
                                    dict(experts=256, top_k=8, dp=8, tp=1, batch=64, cp=2)])
def test_the_expert_row_is_the_chapter_10_formula(change):
    c = dataclasses.replace(PatternsConfig(), **change)
    r = patterns(c)
    ep = r.traffic["ep"]
    assert c.axes == (*TRAFFIC_AXES, "ep") and ep.bytes_sent == pytest.approx(_ep_bytes(c), rel=1e-12)
    rows = microbatch_rows(c.shape, 0)
    assert ep.messages == stage_layers(c.shape, r.coords["pp"]) * len(rows) * 5 * (c.dp - 1)
    without = patterns(dataclasses.replace(c, experts=0))
    assert all(r.traffic[a] == without.traffic[a] for a in TRAFFIC_AXES)          # the four rows do not move
    for p in r.placements:                          # on the dp groups' link, hidden under nothing
        assert p.inside["ep"] == p.inside["dp"]
        link = c.fast if p.inside["ep"] else c.slow
        assert p.exposed["ep"] == pytest.approx(sum(link.terms(ep)), rel=1e-12)
        assert p.total == pytest.approx(sum(p.exposed[a] for a in c.axes), rel=1e-12)


def test_the_expert_row_refuses_a_dp_that_does_not_divide_the_experts():
    with pytest.raises(ValueError, match="experts=4 is not divisible by ranks=8"):
        PatternsConfig(experts=4, dp=8, batch=32)
    with pytest.raises(ValueError, match="k must be an integer from 1 to 2"):
        PatternsConfig(experts=2, top_k=3)


def test_panel_shows_the_expert_row_only_with_experts():
    from wmdist.mesh.panel import PatternsPanel
    panel = PatternsPanel()
    png, text = panel.png, panel.summary.value
    assert panel.controls["top_k"].disabled and "EP" not in text
    panel.controls["experts"].value = 8
    assert not panel.controls["top_k"].disabled and panel.png != png
    ep = panel.result.traffic["ep"]
    assert "<b>EP</b>: each block's MLP as 8 experts" in panel.summary.value
    labels = [t.get_text() for t in panel.shown.axes[0].texts]
    assert len(panel.shown.axes[0].patches) == 5 and any(t.startswith("EP: token all-to-alls") for t in labels)
    assert ep.bytes_sent == pytest.approx(_ep_bytes(panel.result.config), rel=1e-12)
    panel.controls["experts"].value = 0
    assert panel.png == png and panel.summary.value == text and panel.controls["top_k"].disabled
    panel.prefetch.idle()
