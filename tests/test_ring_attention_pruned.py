"""Chapter 06, the pruned causal ring: its closed forms against the mask (pure), and on ranks it equals SDPA
and the uniform ring, sends exactly what the formulas say, and breaks visibly when it prunes one hop too many."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from wmdist.course.compare import bound_ratio
from wmdist.costs import ring_attention as costs
from wmdist.ring_attention import layout, pruned_demo
from wmdist.ring_attention.pruned import pruned_forward
from wmdist.ring_attention.ring import positions
from wmdist.ring_attention.spec import RingSpec, default_seq_len
from wmdist.ring_attention.tolerance import exact_attention, attention_tolerance
from wmdist.runtime import run

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks


def _sends_from_reach(reach: list[int]) -> list[int]:
    """Forward sends of each rank when block s makes reach[s] hops: rank r sends at step t iff t < reach[(r-t) % N]."""
    n = len(reach)
    return [sum(t < reach[(r - t) % n] for t in range(n)) for r in range(n)]


def test_dead_sends_are_half_the_contiguous_ring_and_none_of_zigzag():
    assert [costs.dead_kv_sends(n, layout="contiguous") for n in (1, 2, 4, 8)] == [0, 1, 6, 28]
    assert [costs.dead_kv_sends(n, layout="zigzag") for n in (1, 2, 4, 8)] == [0, 0, 0, 0]
    assert costs.dead_kv_sends(4, layout="contiguous", causal=False) == 0
    assert sum(costs.pruned_kv_sends(4, r) for r in range(4)) == 12 - 6
    assert sum(costs.pruned_kv_sends(8, r) for r in range(8)) == 56 - 28
    assert [costs.pruned_kv_sends(4, r) for r in range(4)] == [1, 2, 3, 0]
    assert [costs.pruned_grad_sends(4, r) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="layout"):
        costs.dead_kv_sends(4, layout="striped")
    with pytest.raises(ValueError, match="rank"):
        costs.pruned_kv_sends(4, 4)


@pytest.mark.parametrize("world_size", range(1, 9))
def test_closed_forms_equal_what_the_mask_implies(world_size):
    # The reach is derived from explicit per-step work counts; the closed forms must agree with it exactly.
    s = 2 * world_size * 3
    n = world_size
    contiguous = layout.block_reach(s, n, layout="contiguous", causal=True)
    assert contiguous == [n - 1 - b for b in range(n)]
    assert _sends_from_reach(contiguous) == [costs.pruned_kv_sends(n, r) for r in range(n)]
    uniform = n * costs.ring_kv_sends(n)
    assert uniform - sum(_sends_from_reach(contiguous)) == costs.dead_kv_sends(n, layout="contiguous")
    for kind, causal in (("zigzag", True), ("contiguous", False), ("zigzag", False)):
        reach = layout.block_reach(s, n, layout=kind, causal=causal)
        assert reach == [n - 1] * n and sum(_sends_from_reach(reach)) == uniform
        assert costs.dead_kv_sends(n, layout=kind, causal=causal) == 0
    # every rank that does work on a block lies within its reach (the pruning drops no needed key)
    work = layout.step_work(s, n, layout="contiguous", causal=True)
    for r in range(n):
        for t in range(n):
            if work[r][t]:
                assert t <= contiguous[layout.ring_source(r, t, n)]


def test_pruned_bytes_by_hand():
    # S = 8 on N = 4, d_KV = 6, batch 2, bf16: a block is 2 * 6 * 2 * 2 = 48 bytes
    assert costs.pruned_ring_bytes_per_rank(8, 4, 6, batch=2, elem_size=2) == [(48, 48, 0), (96, 96, 48), (144, 144, 96),
                                                                  (0, 0, 144)]
    assert costs.pruned_ring_bytes_per_rank(8, 1, 6, batch=2, elem_size=2) == [(0, 0, 0)]


def test_pruned_ring_equals_sdpa_and_the_uniform_ring_and_sends_half():
    report = pruned_demo.pruned_ring_demo(4)
    assert report.passed, report.failures
    assert len(report.checks) == 4 * 4 + 2
    block = costs.kv_block_bytes(report.params["seq_len"], 4, report.params["kv_width"], batch=2, elem_size=4)
    data = report.data
    assert data.forward_bytes["pruned contiguous"] == [block, 2 * block, 3 * block, 0]
    assert data.forward_bytes["uniform contiguous"] == [3 * block] * 4
    assert data.forward_bytes["pruned zigzag"] == data.forward_bytes["uniform zigzag"] == [3 * block] * 4
    assert 2 * data.total_bytes["pruned contiguous"] == data.total_bytes["uniform contiguous"]
    assert report.measured(quantity="sends", phase="backward dkv", case="pruned contiguous") == [0, 1, 2, 3]
    # the trade: pruning keeps contiguous's imbalance, zigzag evens it
    pairs = data.pairs["pruned contiguous"]
    assert pairs == data.pairs["uniform contiguous"] and pairs == sorted(pairs) and pairs[0] < pairs[-1]
    assert len(set(data.pairs["uniform zigzag"])) == 1


def _cut_short(ctx, spec: RingSpec):
    """Rank function: the pruned forward with block 0 stopped one hop before the last rank that reads it."""
    q, k, v, _ = spec.inputs(dtype="float32")
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout="contiguous")
    reach = layout.block_reach(spec.seq_len, ctx.world_size, layout="contiguous", causal=True)
    reach[0] -= 1
    out, _, _ = pruned_forward(ctx, *(x[:, :, rows].contiguous() for x in (q, k, v)), seq_len=spec.seq_len,
                               layout="contiguous", causal=True, block_size=spec.block_size, reach=reach)
    return rows.tolist(), out


def test_pruning_one_hop_too_many_fails_the_sdpa_check():
    spec = RingSpec(seq_len=default_seq_len(4))
    parts = run(_cut_short, 4, spec)
    q, k, v, dout = spec.inputs(dtype="float32")
    got = torch.empty(q.shape)
    for rows, out in parts:
        got[:, :, rows] = out
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bound = attention_tolerance(exact_attention(q, k, v, dout, causal=True), torch.float32, spec.tile(4),
                                spec.key_blocks(4), grads=False).out
    c = spec.seq_len // 4
    assert bound_ratio(got[:, :, :3 * c], want[:, :, :3 * c], bound[:, :, :3 * c]) <= 1   # ranks 0-2 had block 0
    assert bound_ratio(got, want, bound) > 1                                             # rank 3 did not


def test_bad_sizes_and_a_bad_reach_are_refused_before_any_send(no_processes):
    with pytest.raises(ValueError, match="divisible by 6") as err:
        pruned_demo.pruned_ring_demo(3, seq_len=15)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="block_size"):
        pruned_demo.pruned_ring_demo(2, block_size=0)
    ctx = SimpleNamespace(world_size=2, rank=0)        # refused before it would touch the ledger or a group
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="reach must be 2 hop counts"):
        pruned_forward(ctx, q, q, q, seq_len=8, layout="contiguous", causal=True, block_size=2, reach=[1, 2])
    with pytest.raises(ValueError, match="floating-point dtype"):
        pruned_forward(ctx, q.long(), q.long(), q.long(), seq_len=8, layout="contiguous", causal=True, block_size=2)


def test_chapter_09_prose_numbers_for_dp_bytes_growing_with_context():
    # notebooks/09 c18 explains why dp's bytes grow with T (learned positions on stage 0) with these numbers
    from dataclasses import replace

    from wmdist.costs import mesh
    from wmdist.mesh.patterns import PatternsConfig, patterns, shown_coords

    tiny = PatternsConfig()
    assert [patterns(replace(tiny, seq_len=t)).traffic["dp"].bytes_sent for t in (8, 512)] == [55_296, 119_808]
    long = replace(tiny, width=1024, heads=16, seq_len=131072, batch=16, layers=24, microbatches=4, dp=4, tp=4,
                   cp=8, ranks_per_node=8)                     # the long-context row of 09 c21
    coords = shown_coords(long.shape)
    assert coords["pp"] == 0
    share = long.seq_len * long.width / mesh.rank_params(long.shape, coords["tp"], coords["pp"])
    assert round(100 * share) == 78
