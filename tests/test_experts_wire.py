"""Chapter 10's gradient bytes as an expert reads them: payload against ring wire bytes, and the panel's imbalance.

The EP x DP demo's gradient all-reduces are torch's own, so its ledger holds their *payload*. What a ring
sends for that payload, 2(n-1)/n of it over n ranks, is measured here by running the course's counted ring
(`wmdist.comm.ring.ring_all_reduce`) over the very gradient shapes, on the same groups, and compared with
`ep_dp.gradient_wire`, which the notebook prints. Integers throughout, compared exactly.
"""
from __future__ import annotations

import re

import pytest
import torch

from wmdist import runtime
from wmdist.comm.ring import ring_all_reduce
from wmdist.costs import experts as ecosts
from wmdist.experts import ep_dp
from wmdist.experts.dispatch import is_expert
from wmdist.experts.moe import make_moe_model
from wmdist.experts.panel import summary
from wmdist.experts.tradeoff import ExpertsConfig, experts_view


def _ring_each_group(ctx, spec: ep_dp.MeshTrainSpec) -> dict[str, int]:
    """Ring-all-reduce every gradient-shaped tensor where the demo reduces it; the ledger's bytes per phase."""
    torch.set_num_threads(1)
    model = make_moe_model(spec.model, seed=spec.seed)
    per = spec.model.experts // spec.ep
    replicas = spec.layout.replica_ranks(ctx.rank)
    group = ctx.group_of(replicas)
    for name, p in model.named_parameters():
        grad = torch.ones_like(p)
        if not is_expert(name):
            ring_all_reduce(ctx, grad, phase="dense")
            continue
        ring_all_reduce(ctx, grad, phase="plain dp experts")                  # every rank holds every expert
        if int(name.split(".experts.")[1].split(".")[0]) < per:               # the shapes of this rank's experts
            ring_all_reduce(ctx, grad, phase="experts", group=group)
    return {phase: ctx.ledger.totals(phase=phase, prefix=True)["bytes_sent"]
            for phase in ("dense", "experts", "plain dp experts")}


@pytest.fixture(scope="module")
def spec4() -> ep_dp.MeshTrainSpec:
    return ep_dp.mesh_train_spec(4)


def test_ring_wire_bytes_are_measured_on_the_demos_groups(spec4):
    measured = runtime.run(_ring_each_group, 4, spec4)
    for rank, got in enumerate(measured):
        wire = ep_dp.gradient_wire(spec4, rank=rank)
        assert (got["dense"], got["experts"], got["plain dp experts"]) == (
            wire.dense_ring, wire.expert_ring, wire.plain_dp_expert_ring), rank


def test_the_numbers_chapter_10_quotes(spec4):
    """8,448 B of dense payload is 12,672 B on a 4-rank ring; 8,576 B of expert payload is 8,576 B on a ring of 2;
    plain DP's expert payload is twice EP's, its ring bytes three times (2 x 1.5 / 1)."""
    w = ep_dp.gradient_wire(spec4, rank=0)
    assert (w.dense_payload, w.dense_ring) == (8448, 12672) and w.dense_ring == 2 * 3 * w.dense_payload // 4
    assert (w.expert_payload, w.expert_ring) == (8576, 8576)
    assert w.plain_dp_expert_payload == 2 * w.expert_payload and w.plain_dp_expert_ring == 3 * w.expert_ring
    assert {ep_dp.gradient_wire(spec4, rank=r) for r in range(4)} == {w}          # every rank alike (sizes divide)


def test_gradient_wire_payload_is_what_the_demo_ledger_records(spec4):
    """The payloads `gradient_wire` reports are the ledger's, measured on the 4 ranks of the demo."""
    mesh = ep_dp.EP_DP_DEMO.run(4)
    assert mesh.passed, mesh.listing()
    for r in range(4):
        w = ep_dp.gradient_wire(spec4, rank=r)
        assert mesh.measured(quantity="payload", phase="dense grads", step=0)[r] == w.dense_payload
        assert mesh.measured(quantity="payload", phase="expert grads", step=0)[r] == w.expert_payload


def test_no_ring_on_one_rank():
    w = ep_dp.gradient_wire(ep_dp.mesh_train_spec(1), rank=0)
    assert (w.dense_ring, w.expert_ring, w.plain_dp_expert_ring, w.expert_payload) == (0, 0, 0, 0)


def _text(config: ExpertsConfig) -> str:
    return re.sub(r"<[^>]+>", "", summary(experts_view(config)))


def test_panel_prints_both_imbalances_and_says_which_is_which():
    """Per expert: E x the largest share; per rank: the busiest rank's experts over the mean rank. The defaults
    give 1.83 and 1.56; both are printed, each named."""
    c = ExpertsConfig()
    shares = ecosts.skewed_shares(c.experts, c.skew)
    per_rank = ecosts.rank_loads([c.ranks * c.tokens * c.k * s for s in shares], c.ranks)
    by_rank = max(per_rank) / (sum(per_rank) / c.ranks)
    text = _text(c)
    assert f"per expert max/mean {c.experts * max(shares):.2f}" in text
    assert f"per rank max/mean {by_rank:.2f}" in text
    assert f"{c.experts * max(shares):.2f}" != f"{by_rank:.2f}"                  # two different numbers here
    uniform = _text(ExpertsConfig(skew=0.0))
    assert "per expert max/mean 1.00" in uniform and "per rank max/mean 1.00" in uniform


@pytest.mark.parametrize("element_size", [2, 4])
def test_panel_uniform_formula_names_the_element_size(element_size):
    c = ExpertsConfig(element_size=element_size)
    text = _text(c)
    assert f"= T k (N-1)/N d x {element_size} B per element" in text
    assert experts_view(c).uniform_bytes == c.tokens * c.k * (c.ranks - 1) / c.ranks * c.width * element_size


def test_the_balancing_weights_chapter_10_names():
    """The prose sets Switch's 1e-2 beside the demos' weights: 1 in moe-balance (against 0), 0.1 in moe-ep-dp."""
    from wmdist.experts.balance import BALANCE_DEMO
    assert BALANCE_DEMO.spec(4).aux_weights == (0.0, 1.0)
    assert ep_dp.EP_DP_DEMO.spec(4).aux_weight == 0.1


def test_the_global_token_count_the_chapter_prints(spec4):
    """Every rank divides its loss by B T of the whole batch (32 here), not its own B T / N = 8; that the sums are
    then the batch's gradient is the demo's own parameter check against one process (a local count would make
    every gradient N times too large and fail it)."""
    assert spec4.tokens == spec4.batch * spec4.seq_len == 32
