"""Hostile trials (issue 35 §7): legitimate programs that plain torch runs pass, true mismatches fail as they happen.

Two legitimate programs used to be refused by the end-of-call check: DDP with Join and
find_unused_parameters=True over uneven batches (the joined rank's shadow all-reduces are posted from
Python, its partner's from DDP's C++ reducer), and two groups with the same members posting different
ops in different orders (two communicators, counted as one). Each runs here under wmdist and under
plain torch (torch.multiprocessing, gloo, no wmdist), with the same results. Four true mismatches used
to wait for the call's whole timeout; each now fails with reason "unmatched", which a call that waited
for its timeout never gives (reason "timeout"): a causal check, no clock.
"""
from __future__ import annotations

import multiprocessing
import tempfile
import time
import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from wmdist.runtime import RankFailure, run

TIMEOUT = 120          # the calls below that must fail fast are given this long: only a timeout would use it


class TwoHeads(nn.Module):
    """A body and two heads, one used on even steps and one on odd: unused parameters every step."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return (self.left if step % 2 == 0 else self.right)(torch.tanh(self.body(x)))


def ddp_join_uneven(ctx):
    """Rank r trains on 3 + 2r batches: rank 0 joins early and shadows rank 1's last two steps."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(TwoHeads(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(ctx.rank)
    with Join([model]):
        for step in range(3 + 2 * ctx.rank):
            opt.zero_grad()
            model(torch.randn(8, 4, generator=data), step).pow(2).mean().backward()
            opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def same_members_two_groups(ctx):
    """The default group and a new group of the same two ranks, used in opposite orders (async, then waited)."""
    sub = dist.new_group([0, 1])
    x, y = torch.full((3,), float(ctx.rank + 1)), torch.arange(4.0) * (ctx.rank + 1)
    out = [torch.empty(4) for _ in range(2)]
    if ctx.rank == 0:
        works = [dist.all_reduce(x, async_op=True), dist.all_gather(out, y, group=sub, async_op=True)]
    else:
        works = [dist.all_gather(out, y, group=sub, async_op=True), dist.all_reduce(x, async_op=True)]
    for work in works:
        work.wait()
    return x.tolist(), torch.cat(out).tolist()


LEGITIMATE = {"ddp_join_uneven": ddp_join_uneven, "same_members_two_groups": same_members_two_groups}


def _plain_rank(rank: int, store: str, conn) -> None:
    """One rank of plain torch: the legitimate programs with no wmdist in the process."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT))
    ctx = types.SimpleNamespace(rank=rank, world_size=2)
    conn.send({name: fn(ctx) for name, fn in LEGITIMATE.items()})
    dist.destroy_process_group()


def plain_torch() -> list[dict]:
    """Both legitimate programs' results under torch.multiprocessing (spawn), by rank; every process ends."""
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        pipes = [spawn.Pipe(duplex=False) for _ in range(2)]
        procs = [spawn.Process(target=_plain_rank, args=(r, f"{tmp}/store", pipes[r][1]), daemon=True)
                 for r in range(2)]
        try:
            for proc in procs:
                proc.start()
            out = []
            for r, (reader, _) in enumerate(pipes):
                assert reader.poll(TIMEOUT * 2), f"plain torch rank {r} did not answer"
                out.append(reader.recv())
            return out
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()


def test_legitimate_programs_pass_with_the_results_plain_torch_gives():
    ours = [{name: result for name, result in zip(LEGITIMATE, rank)}
            for rank in zip(*[run(fn, 2, timeout=TIMEOUT) for fn in LEGITIMATE.values()])]
    theirs = plain_torch()
    # The same ops on the same data in the same order, on one thread per rank: equal to the bit.
    assert ours == theirs
    params = ours[0]["ddp_join_uneven"]
    assert params == ours[1]["ddp_join_uneven"], "DDP keeps the replicas equal"
    assert all(torch.isfinite(torch.tensor(p)).all() for p in params)
    assert ours[0]["same_members_two_groups"] == ([3.0] * 3, [0.0, 1.0, 2.0, 3.0, 0.0, 2.0, 4.0, 6.0])


def test_a_legitimate_program_leaves_the_pool_warm_for_the_next_call():
    run(same_members_two_groups, 2, timeout=TIMEOUT)
    assert run(same_members_two_groups, 2, timeout=TIMEOUT)[1] == ([3.0] * 3, [0.0, 1.0, 2.0, 3.0, 0.0, 2.0, 4.0, 6.0])


def monitored_barrier_on_one_rank(ctx):
    if ctx.rank == 0:
        dist.monitored_barrier()           # its own timeout is 30 minutes
    return ctx.rank


def receive_from_anyone_nobody_sends(ctx):
    if ctx.rank == 0:
        dist.recv(torch.empty(2))          # src=None: from any rank
    return ctx.rank


def same_members_mixed_up(ctx):
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=None if ctx.rank == 0 else sub)
    return ctx.rank


def broadcast_disagreeing_on_src(ctx):
    dist.broadcast(torch.full((2,), float(ctx.rank)), src=ctx.rank)
    return ctx.rank


@pytest.mark.parametrize("fn, rank, ranks, says", [
    (monitored_barrier_on_one_rank, 0, (0, 1),
     "rank 0 posted its collective #1 on group [0, 1], which rank 1 can no longer match: rank 1 finished the call "
     "having posted 0 there"),
    (receive_from_anyone_nobody_sends, 0, (0, 1),
     "rank 0 can never finish: rank 0 waits for its receive #1 from any rank: rank 1 finished the call having "
     "sent it 0 message(s)"),
    (same_members_mixed_up, 0, (0, 1),
     "rank 0 waits for its collective #1 on group [0, 1]: rank 1 waits for its collective #1 on group [0, 1] "
     "(another group with the same members) having posted 0 there"),
    (broadcast_disagreeing_on_src, 0, (0, 1),
     "rank 0 and rank 1 posted different collectives as their collective #1 on group [0, 1]: rank 0 posted "
     "broadcast from rank 0, rank 1 broadcast from rank 1"),
])
def test_a_true_mismatch_fails_as_it_happens_naming_the_ranks(fn, rank, ranks, says):
    with pytest.raises(RankFailure) as info:
        run(fn, 2, timeout=TIMEOUT)
    err = info.value
    assert (err.reason, err.rank, err.ranks) == ("unmatched", rank, ranks), str(err)
    assert says in str(err) and "found when it happened, not at the call's timeout" in str(err)
    assert run(lambda ctx: ctx.rank, 2) == [0, 1]


def all_reduce_while_the_other_computes(ctx):
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(2))
    else:
        time.sleep(60)                      # its own code: it could still post the all-reduce
    return ctx.rank


def test_a_mismatch_that_cannot_be_known_says_why_at_the_timeout():
    with pytest.raises(RankFailure) as info:
        run(all_reduce_while_the_other_computes, 2, timeout=3)
    err = info.value
    assert err.reason == "timeout" and err.rank == 1
    assert "no mismatch could be known before the timeout: rank 1 was running its own code" in str(err)
