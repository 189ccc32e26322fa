"""The counting seam, non-blocking point to point, counted collectives, cached groups and the Mesh."""
from __future__ import annotations

import psutil
import pytest
import torch

from wmdist import runtime
from wmdist.comm import (Context, Ledger, Mesh, all_gather, all_reduce, all_to_all, broadcast, counted, irecv, isend,
                         recv, reduce_scatter, ring_all_reduce, send)
from wmdist.runtime import RankFailure, run


# --- the seam, without processes --------------------------------------------------------

def test_counted_records_after_the_body_and_names_an_op_that_raises():
    ctx = Context(rank=0, world_size=1, ledger=Ledger(rank=0))
    with counted(ctx, "send", "warm-up", sent=12, kind="p2p", peer=1):
        assert ctx.ledger.in_progress and "send 12 B to rank 1 [phase 'warm-up']" in ctx.ledger.last_entered
    (rec,) = ctx.ledger.records
    assert (rec.op, rec.phase, rec.kind, rec.bytes_sent, rec.bytes_recv, rec.messages, rec.peer) == \
        ("send", "warm-up", "p2p", 12, 0, 1, 1)
    assert ctx.ledger.last_status().endswith("(completed)")
    with pytest.raises(RuntimeError):
        with counted(ctx, "all_reduce", "grads", sent=8, recv=8):
            raise RuntimeError("stuck")
    assert len(ctx.ledger.records) == 1                         # not recorded: it never finished
    assert ctx.ledger.last_status() == "all_reduce, send 8 B, recv 8 B [phase 'grads']"
    with pytest.raises(ValueError, match="kind"):
        with counted(ctx, "x", "y", kind="wire"):
            pass


def test_ledger_select_by_phase_prefix():
    ctx = Context(rank=0, world_size=1, ledger=Ledger(rank=0))
    for phase, n in (("step 0/grads", 4), ("step 1/grads", 8), ("other", 1)):
        with counted(ctx, "exchange", phase, sent=n, kind="p2p"):
            pass
    assert ctx.ledger.totals(phase="step ", prefix=True)["bytes_sent"] == 12
    assert ctx.ledger.totals(phase="step 0/grads")["bytes_sent"] == 4
    assert ctx.ledger.totals(kind="collective")["rounds"] == 0


# --- on ranks ---------------------------------------------------------------------------

def ring_with_handles(ctx):
    """One step around the ring with isend/irecv handles, overlapped with a little compute."""
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    mine = torch.full((5,), float(ctx.rank))
    got = torch.empty(5)
    receiving = irecv(ctx, got, left, phase="kv")
    sending = isend(ctx, mine, right, phase="kv")
    busy = torch.ones(64, 64) @ torch.ones(64, 64)               # compute while the transfer is in flight
    sending.wait()
    out = receiving.wait()
    return out.tolist(), ctx.ledger.totals(phase="kv"), float(busy[0, 0])


def test_isend_irecv_handles_are_counted_and_deliver():
    res = run(ring_with_handles, 3)
    for rank, (got, totals, busy) in enumerate(res):
        assert got == [float((rank - 1) % 3)] * 5 and busy == 64.0
        assert totals == {"bytes_sent": 20, "bytes_recv": 20, "messages": 1, "rounds": 2}


def into_a_larger_buffer(ctx, counted_recv):
    """Rank 0 sends 10 floats (40 B); rank 1 receives them into a buffer of 20 (80 B)."""
    if ctx.rank == 0:
        send(ctx, torch.ones(10), 1)
    elif counted_recv:
        recv(ctx, torch.zeros(20), 0)
    else:
        torch.distributed.recv(torch.zeros(20), 0)
    return ctx.rank


@pytest.mark.parametrize("counted_recv", [True, False], ids=["counted", "raw"])
def test_a_receive_into_a_larger_buffer_fails_its_call_naming_both_sizes(counted_recv):
    with pytest.raises(RankFailure) as info:
        run(into_a_larger_buffer, 2, counted_recv, timeout=60)
    assert info.value.reason == "unmatched" and info.value.rank == 1
    assert "received 40 B in messages from rank 0 into receive buffers of 80 B" in str(info.value)
    assert run(lambda ctx: ctx.rank, 2) == [0, 1]


def test_a_rank_stuck_waiting_on_a_handle_is_named_with_the_transfer():
    def waits_forever(ctx):
        if ctx.rank == 0:
            irecv(ctx, torch.empty(3), 1, phase="never sent").wait()
        return ctx.rank
    with pytest.raises(RankFailure) as err:
        run(waits_forever, 2, timeout=3)
    text = str(err.value)
    # Named with the transfer either way: the running check may find the receive unmatchable (rank 1 has
    # finished) before rank 0 reaches its wait, or rank 0 is seen stuck in the wait.
    assert "12 B from rank 1 [phase 'never sent']" in text, text
    assert "wait for irecv 12 B" in text or "rank 1 can no longer match" in text, text


def collectives(ctx):
    n, r = ctx.world_size, ctx.rank
    x = torch.full((2,), float(r))
    s = all_reduce(ctx, x.clone(), phase="ar")
    g = all_gather(ctx, x, phase="ag")                            # (2N,)
    rs = reduce_scatter(ctx, torch.arange(2.0 * n) + r, phase="rs")   # my 2 elements of the sum
    b = broadcast(ctx, torch.full((3,), float(r)), src=n - 1, phase="bc")
    a = all_to_all(ctx, torch.arange(float(n)) + 10 * r, phase="a2a")   # piece j goes to rank j
    pending = all_reduce(ctx, torch.ones(4), phase="async", async_op=True)
    asy = pending.wait()
    return [t.tolist() for t in (s, g, rs, b, a, asy)], ctx.ledger.by_phase(kind="collective")


def test_counted_collectives_compute_and_record_their_payload():
    n = 3
    res = run(collectives, n)
    for r, (vals, phases) in enumerate(res):
        s, g, rs, b, a, asy = vals
        assert s == [3.0, 3.0] and g == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
        assert (rs == [2 * r * n + sum(range(n)) + k * n for k in (0, 1)][:2]
                or rs == [n * (2 * r) + 3, n * (2 * r + 1) + 3])
        assert b == [2.0] * 3 and a == [float(r + 10 * j) for j in range(n)] and asy == [3.0] * 4
        assert phases["ar"] == {"bytes_sent": 8, "bytes_recv": 8, "messages": 1, "rounds": 1}
        assert phases["ag"]["bytes_sent"] == 8 and phases["ag"]["bytes_recv"] == 16
        assert phases["rs"]["bytes_sent"] == 24 and phases["rs"]["bytes_recv"] == 8
        assert (phases["bc"]["bytes_sent"], phases["bc"]["bytes_recv"]) == ((12, 0) if r == n - 1 else (0, 12))
        assert phases["a2a"]["bytes_sent"] == phases["a2a"]["bytes_recv"] == 8
        assert phases["async"]["bytes_sent"] == 16


def groups_call(ctx, mesh):
    """Ask for the same subgroups as every other call, and use them."""
    tp, dp = ctx.axis_group(mesh, "tp"), ctx.axis_group(mesh, "dp")
    x = torch.ones(6) * ctx.rank
    along_tp = ring_all_reduce(ctx, x, group=tp)
    along_dp = ring_all_reduce(ctx, x, group=dp)
    return float(along_tp[0]), float(along_dp[0]), len(ctx.resources.groups)


def _threads(pids):
    return sum(psutil.Process(p).num_threads() for p in pids)


def test_groups_are_cached_on_warm_ranks():
    mesh = Mesh(dp=2, tp=2)                                        # tp fastest: tp pairs (0,1), (2,3)
    runtime.shutdown()
    first = run(groups_call, 4, mesh)
    assert [f[:2] for f in first] == [(1.0, 2.0), (1.0, 4.0), (5.0, 2.0), (5.0, 4.0)]
    pids = runtime.warm_pids()[4]
    threads = _threads(pids)
    for _ in range(200):
        again = run(groups_call, 4, mesh)
    assert again == first and [g[2] for g in again] == [2, 2, 2, 2]   # two groups per rank, made once
    assert runtime.warm_pids()[4] == pids and _threads(pids) == threads


def test_group_of_refuses_bad_ranks_with_a_clear_message():
    def not_a_member(ctx):
        ctx.group_of([1])           # rank 1 gets its group; rank 0 is refused
        return None                 # (a group cannot travel back: only rank 0's refusal may end the call)
    with pytest.raises(RankFailure, match="rank 0 asked for group \\[1\\] it is not a member of"):
        run(not_a_member, 2, timeout=30)
    with pytest.raises(RankFailure, match="ranks must be distinct integers in \\[0, 2\\)"):
        run(lambda ctx: ctx.group_of([0, 5]), 2, timeout=30)


# --- the Mesh (pure) --------------------------------------------------------------------

def test_mesh_layout_round_trips_and_partitions_each_axis():
    mesh = Mesh(dp=2, tp=2, pp=2, cp=1)
    assert mesh.world_size == 8
    for r in range(8):
        assert mesh.rank(**mesh.coords(r)) == r
    assert [mesh.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]      # tp varies fastest
    assert mesh.axis_ranks(5, "tp") == (4, 5) and mesh.axis_ranks(5, "dp") == (5, 7)
    assert mesh.axis_ranks(5, "pp") == (1, 5)
    for axis in ("dp", "tp", "pp", "cp"):
        groups = mesh.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(8))   # every rank in exactly one group
        assert all(len(g) == mesh.size(axis) for g in groups)
    dp_first = Mesh(dp=2, tp=2, order=("dp", "cp", "tp", "pp"))
    assert dp_first.axis_ranks(0, "dp") == (0, 1)


@pytest.mark.parametrize("kwargs,word", [(dict(dp=0), "dp"), (dict(tp=1.5), "tp"),
                                         (dict(order=("dp", "tp", "pp")), "order")])
def test_mesh_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Mesh(**kwargs)
    with pytest.raises(ValueError, match="rank"):
        Mesh(dp=2).coords(2)
    with pytest.raises(ValueError, match="unknown axes"):
        Mesh(dp=2).rank(ep=1)


def one_message_each_way(ctx):
    from wmdist.comm import exchange, recv, send
    x = torch.ones(3)
    if ctx.rank == 0:
        send(ctx, x, 1, phase="there")
        recv(ctx, x, 1, phase="back")
    else:
        recv(ctx, x, 0, phase="there")
        send(ctx, x, 0, phase="back")
    exchange(ctx, x, 1 - ctx.rank, torch.empty(3), 1 - ctx.rank, phase="swap")
    return {p: ctx.ledger.totals(phase=p)["messages"] for p in ("there", "back", "swap")}


def test_messages_are_counted_by_their_sender_only():
    """A send records one message and its receive none, so summed over ranks each message counts once."""
    rank0, rank1 = run(one_message_each_way, 2)
    assert rank0 == {"there": 1, "back": 0, "swap": 1} and rank1 == {"there": 0, "back": 1, "swap": 1}
