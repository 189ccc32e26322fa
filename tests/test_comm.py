"""Ring collectives: equal to gloo and to one process for every N in 1..8 and awkward lengths;
the ledger's bytes equal the formula exactly."""
from __future__ import annotations

import pytest
import torch

from wmdist import costs
from wmdist.comm import Ledger, Record, all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from wmdist.course.compare import bound_ratio
from wmdist.data_parallel.ring import rank_vector, reference_sum, ring_allreduce_demo, sum_bound
from wmdist.runtime import run

LENGTHS = [1, 2, 7, 64, 1000, 4097]   # shorter than N, not divisible by N, divisible


def collectives(ctx, lengths):
    """For each length: ring all-reduce, gloo all-reduce, reduce-scatter and all-gather on this rank."""
    out = []
    for numel in lengths:
        x = rank_vector(ctx.rank, numel, seed=numel)
        before = ctx.ledger.totals()
        ours = ring_all_reduce(ctx, x, phase=f"ar{numel}")
        sent = ctx.ledger.totals()["bytes_sent"] - before["bytes_sent"]
        theirs = x.clone()
        all_reduce(ctx, theirs)
        mine = ring_reduce_scatter(ctx, x, phase=f"rs{numel}")
        sizes = costs.ring_chunk_sizes(numel, ctx.world_size)
        gathered = ring_all_gather(ctx, x[sum(sizes[:ctx.rank]):sum(sizes[:ctx.rank + 1])].clone(), sizes,
                                   phase=f"ag{numel}")
        out.append({"ours": ours, "theirs": theirs, "mine": mine, "gathered": gathered, "sent": sent,
                    "rs": ctx.ledger.totals(phase=f"rs{numel}"), "ag": ctx.ledger.totals(phase=f"ag{numel}")})
    return out


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_collectives_match_gloo_and_single_process(n):
    results = run(collectives, n, LENGTHS)
    for i, numel in enumerate(LENGTHS):
        expected, bound = reference_sum(n, numel, seed=numel), sum_bound(n, numel, seed=numel)
        sizes = costs.ring_chunk_sizes(numel, n)
        bounds = [sum(sizes[:r]) for r in range(n + 1)]
        # Rank r contributes chunk r of its own vector.
        gathered = torch.cat([rank_vector(r, numel, seed=numel)[bounds[r]:bounds[r + 1]] for r in range(n)])
        for rank, res in enumerate(results):
            got = res[i]
            # Different summation orders of float32: the elementwise bound derived in ring.sum_bound.
            assert bound_ratio(got["ours"], expected, bound) <= 1
            assert bound_ratio(got["ours"], got["theirs"], bound) <= 1
            assert torch.equal(got["ours"], results[0][i]["ours"])          # every rank identical
            chunk = expected[bounds[rank]:bounds[rank + 1]]
            assert bound_ratio(got["mine"], chunk, bound[bounds[rank]:bounds[rank + 1]]) <= 1
            # The shard owns its memory: a ZeRO rank must not keep the full buffer alive through a view.
            assert got["mine"].untyped_storage().nbytes() == got["mine"].numel() * 4
            # All-gather only copies: exact.
            assert torch.equal(got["gathered"], gathered)
            # Ledger: exact bytes and rounds.
            assert got["sent"] == costs.ring_allreduce_bytes(numel, n, rank)
            assert got["rs"]["bytes_sent"] == costs.ring_reduce_scatter_bytes(numel, n, rank)
            assert got["ag"]["bytes_sent"] == costs.ring_all_gather_bytes(numel, n, rank)
            assert got["rs"]["rounds"] == got["ag"]["rounds"] == n - 1
            assert got["rs"]["messages"] == n - 1


@pytest.mark.parametrize("n", [2, 4, 8])
def test_divisible_length_hits_the_ideal_bound(n):
    numel = 1024 * n
    res = run(collectives, n, [numel])
    ideal = costs.ring_allreduce_ideal_bytes(numel * 4, n)
    assert [r[0]["sent"] for r in res] == [ideal] * n


def test_ring_demo_report_passes_and_counts_exactly():
    report = ring_allreduce_demo(5, numel=1003)
    assert report.passed, report.failures
    assert report.measured(quantity="bytes sent") == [costs.ring_allreduce_bytes(1003, 5, r) for r in range(5)]
    assert report.predicted(quantity="rounds") == [costs.ring_allreduce_rounds(5)] * 5


def test_bound_is_not_vacuous():
    # A float32 sum in rank order differs from the float64 reference by more than 0 (so the tests above
    # compare something real) and by no more than the elementwise bound anywhere.
    n, numel = 8, 100_003
    f32 = sum(rank_vector(r, numel) for r in range(n))
    ratio = bound_ratio(f32, reference_sum(n, numel), sum_bound(n, numel))
    assert 0 < ratio <= 1


def test_all_gather_rejects_a_wrong_chunk():
    def bad(ctx):
        return ring_all_gather(ctx, torch.ones(3), [2, 2])
    from wmdist.runtime import RankFailure
    with pytest.raises(RankFailure, match="does not match sizes"):
        run(bad, 2, timeout=30)


def test_ledger_totals_by_phase_and_pickling_drops_callback():
    import pickle
    seen = []
    led = Ledger(rank=0, on_enter=seen.append)
    led.enter("x")
    led.add(Record(op="send", phase="a", kind="p2p", bytes_sent=10, bytes_recv=0, messages=1, peer=1))
    led.leave()
    led.add(Record(op="recv", phase="b", kind="p2p", bytes_sent=0, bytes_recv=6, messages=0, peer=1))
    led.add(Record(op="all_reduce", phase="a", kind="collective", bytes_sent=4, bytes_recv=4, messages=1))
    assert led.totals() == {"bytes_sent": 10, "bytes_recv": 6, "messages": 1, "rounds": 2}
    assert led.by_phase() == {"a": {"bytes_sent": 10, "bytes_recv": 0, "messages": 1, "rounds": 1},
                              "b": {"bytes_sent": 0, "bytes_recv": 6, "messages": 0, "rounds": 1}}
    assert led.totals(kind="collective")["bytes_sent"] == 4
    assert led.by_phase(since=1) == {"b": {"bytes_sent": 0, "bytes_recv": 6, "messages": 0, "rounds": 1}}
    assert led.totals(since=1, kind=None)["bytes_sent"] == 4 and led.select(since=3) == []
    assert pickle.loads(pickle.dumps(led)).on_enter is None
    assert seen[0] == "x" and seen[1].endswith("(completed)")
    led.reset()
    assert led.records == [] and led.totals()["rounds"] == 0


def test_subgroup_ring():
    def sub(ctx):
        g = ctx.group_of([0, 2] if ctx.rank % 2 == 0 else [1, 3])
        x = torch.tensor([float(ctx.rank)] * 5)
        return ring_all_reduce(ctx, x, group=g), ctx.ledger.totals()["bytes_sent"]
    res = run(sub, 4)
    assert [float(r[0][0]) for r in res] == [2.0, 4.0, 2.0, 4.0]
    # Ranks 0 and 1 are rank 0 of their pair, ranks 2 and 3 rank 1.
    assert [r[1] for r in res] == [costs.ring_allreduce_bytes(5, 2, group_rank) for group_rank in (0, 0, 1, 1)]
