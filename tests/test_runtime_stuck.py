"""A post that a finished rank can no longer match fails the call when it happens, not at the timeout.

`if ctx.rank == 0: dist.all_reduce(x)` used to spin for the call's whole timeout (5 minutes by default).
The pure check (runtime/stuck.py) is tested on boards and counts written here; the pool's use of it on
real ranks: the classic mistakes fail within seconds, and ops a finished rank did post (an isend or an
async all-reduce it never waited for) still match a slower rank's, however late.
"""
from __future__ import annotations

import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

from wmdist.runtime import RankFailure, run
from wmdist.runtime.stuck import COLLECTIVE, MAX_RANKS, RECEIVE, SEND, PostBoard, group_mask, pack, stuck, unpack


def counts(world_size: int, *, sent=None, received=None, posted=None) -> tuple:
    """A finished rank's final counts as MessageAudit.counts() returns them."""
    return (sent or [0] * world_size, received or [0] * world_size, 0, 0, posted or {}, ([], []))


def test_a_word_packs_and_unpacks_through_a_shared_int64():
    board = PostBoard.new(multiprocessing.get_context("spawn"))
    assert unpack(board.read()[1]) == (0, 0, 0)
    for kind, n, who in [(COLLECTIVE, 1, 0b11), (RECEIVE, 7, 3), (SEND, (1 << 30) - 1, (1 << MAX_RANKS) - 1)]:
        board.begin(5)
        board.post(kind, n, who)
        assert board.read()[0] == 5 and unpack(board.read()[1]) == (kind, n, who)
    board.begin(6)
    assert board.read() == (6, 0)
    with pytest.raises(ValueError):
        pack(4, 1, 0)
    assert group_mask((2, 0)) == 0b101 and group_mask((0, MAX_RANKS)) is None


LAST = ["all_reduce [phase 'x']", "wait for receive from rank 0", "", ""]


def test_a_collective_a_finished_member_posted_fewer_of_is_stuck():
    board = {0: (3, pack(COLLECTIVE, 2, group_mask((0, 1))))}          # rank 0's 2nd collective on [0, 1]
    behind = {1: counts(2, posted={(0, 1): (1, 0, [])})}               # rank 1 finished with 1 there
    err = stuck(3, board, behind, LAST)
    assert isinstance(err, RankFailure) and (err.rank, err.reason, err.ranks) == (0, "unmatched", (0, 1))
    assert "collective #2 on group [0, 1], which rank 1 can no longer match" in str(err)
    assert "having posted 1 there" in str(err) and err.last_comm == LAST[0]
    assert stuck(3, board, {1: counts(2, posted={(1, 0): (2, 0, [])})}, LAST) is None   # posted it: just slow
    assert stuck(4, board, behind, LAST) is None                       # a board of another call says nothing
    assert stuck(3, {0: (3, pack(COLLECTIVE, 2, group_mask((0, 2))))}, behind, LAST) is None  # 1 not a member
    assert stuck(3, {0: (3, 0)}, behind, LAST) is None                 # nothing posted yet


def test_a_receive_or_send_a_finished_peer_never_matched_is_stuck():
    recv = {1: (1, pack(RECEIVE, 1, 0))}                               # rank 1's first receive from rank 0
    err = stuck(1, recv, {0: counts(2)}, LAST)
    assert (err.rank, err.ranks) == (1, (1, 0)) and "receive #1 from rank 0" in str(err)
    assert "having posted 0 send(s) to rank 1" in str(err)
    assert stuck(1, recv, {0: counts(2, sent=[0, 1])}, LAST) is None
    send = {0: (1, pack(SEND, 2, 1))}                                  # rank 0's second send to rank 1
    assert "send #2 to rank 1" in str(stuck(1, send, {1: counts(2, received=[1, 0])}, LAST))
    assert stuck(1, send, {1: counts(2, received=[2, 0])}, LAST) is None
    any_source = counts(2, received=[1, 0])[:2] + (1,) + counts(2)[3:]     # and one receive from any rank
    assert stuck(1, send, {1: any_source}, LAST) is None
    assert stuck(1, send, {2: counts(3)}, LAST + [""]) is None         # another rank finished: says nothing


def rank0_only_all_reduce(ctx):
    if ctx.rank == 0:
        time.sleep(0.5)                       # rank 1 has finished by then
        dist.all_reduce(torch.ones(3))
    return ctx.rank


def receive_nobody_sends(ctx):
    if ctx.rank == 1:
        dist.recv(torch.empty(2), src=0)
    return ctx.rank


@pytest.mark.parametrize("fn, culprit, says", [
    (rank0_only_all_reduce, 0, "posted its collective #1 on group [0, 1], which rank 1 can no longer match"),
    (receive_nobody_sends, 1, "posted its receive #1 from rank 0, which rank 0 can no longer match"),
])
def test_the_classic_mistakes_fail_in_seconds_under_the_default_timeout(fn, culprit, says):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run(fn, 2)                            # the default timeout is 300 s
    assert time.monotonic() - start < 30
    assert info.value.reason == "unmatched" and info.value.rank == culprit and says in str(info.value)
    assert run(lambda ctx: ctx.rank, 2) == [0, 1]


def posted_then_finished(ctx):
    """Rank 1 posts an isend and an async all-reduce and returns at once; rank 0 matches both 1 s later."""
    if ctx.rank == 1:
        dist.isend(torch.full((3,), 7.0), 0)
        dist.all_reduce(torch.ones(2), async_op=True)
        return "posted"
    time.sleep(1.0)
    got = torch.empty(3)
    dist.recv(got, 1)
    total = torch.ones(2)
    dist.all_reduce(total)
    return got.tolist() + total.tolist()


def test_ops_a_finished_rank_did_post_still_match_a_slower_rank():
    assert run(posted_then_finished, 2, timeout=60) == [[7.0, 7.0, 7.0, 2.0, 2.0], "posted"]
