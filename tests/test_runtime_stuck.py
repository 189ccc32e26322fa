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
from wmdist.runtime.matching import GroupPosts
from wmdist.runtime.stuck import (ANY, COLLECTIVE, MAX_GROUPS, MAX_RANKS, RECEIVE, SEND, PostBoard, group_id,
                                  group_mask, pack, stuck, unpack)
from wmdist.runtime.routes import op_code


SPAWN = multiprocessing.get_context("spawn")
WORLD = group_id("0")                  # torch's name of the default group
SUB = group_id("wmdist-group-0-1")     # a cached group with the same members


def counts(world_size: int, *, sent=None, received=None, posted=None, any_source=0) -> tuple:
    """A finished rank's final counts as MessageAudit.counts() returns them."""
    return (sent or [0] * world_size, received or [0] * world_size, any_source, 0, posted or {}, ([], []))


def on_world(slots: int, records=()) -> dict:
    return {("0", (0, 1)): GroupPosts(slots, 0, 0, (), tuple(records))}


BROADCAST_FROM_0 = op_code("broadcast", (0,), {})
ALL_REDUCE = op_code("all_reduce", (), {})


def board(call: int = 3, *, post=None, wait=None, groups=None, sent=(0, 0), received=(0, 0), any_count=0):
    """A real board, written as a rank writes it: `post` and `wait` are (kind, n, who, at)."""
    b = PostBoard.new(SPAWN)
    b.begin(call)
    if post:
        b.post(*post)
    if wait:
        b.blocked(*wait, groups, list(sent), list(received), any_count)
    return b.read()


def test_a_board_reads_back_whole_what_was_written():
    b = PostBoard.new(SPAWN)
    assert b.read().post == 0 and b.read().call == 0
    for kind, n, who in [(COLLECTIVE, 1, 0b11), (RECEIVE, 7, 3), (SEND, (1 << 30) - 1, (1 << MAX_RANKS) - 1),
                         (RECEIVE, 2, ANY)]:
        b.begin(5)
        b.post(kind, n, who, WORLD << 32 | ALL_REDUCE)
        seen = b.read()
        assert seen.call == 5 and unpack(seen.post) == (kind, n, who) and seen.post_at == WORLD << 32 | ALL_REDUCE
    b.blocked(COLLECTIVE, 4, 0b11, SUB << 32 | ALL_REDUCE, {WORLD: (0b11, 2), SUB: (0b11, 3)}, [0, 5], [1, 0], 2)
    seen = b.read()
    assert unpack(seen.wait) == (COLLECTIVE, 4, 0b11) and seen.groups == {WORLD: (0b11, 2), SUB: (0b11, 3)}
    assert seen.sent[:2] == (0, 5) and seen.received[:2] == (1, 0) and seen.any_count == 2
    b.blocked(COLLECTIVE, 4, 0b11, 0, {g: (1, 1) for g in range(MAX_GROUPS + 1)}, [0], [0], 0)
    assert b.read().groups is None                                    # more groups than a board holds: unknown
    version = b.read().version
    b.unblocked()
    assert b.read().wait == 0 and b.read().version == version + 2
    b.begin(6)
    assert (b.read().call, b.read().post, b.read().wait) == (6, 0, 0)
    with pytest.raises(ValueError):
        pack(4, 1, 0)
    assert group_mask((2, 0)) == 0b101 and group_mask((0, MAX_RANKS)) is None


LAST = ["all_reduce [phase 'x']", "wait for receive from rank 0", "", ""]


def test_a_collective_a_finished_member_posted_fewer_of_is_stuck():
    boards = {0: board(post=(COLLECTIVE, 2, 0b11, WORLD << 32 | ALL_REDUCE))}   # rank 0's 2nd collective on [0, 1]
    behind = {1: counts(2, posted=on_world(1))}                                # rank 1 finished with 1 there
    err = stuck(3, boards, behind, LAST)
    assert isinstance(err, RankFailure) and (err.rank, err.reason, err.ranks) == (0, "unmatched", (0, 1))
    assert "collective #2 on group [0, 1], which rank 1 can no longer match" in str(err)
    assert "having posted 1 there" in str(err) and err.last_comm == LAST[0]
    assert stuck(3, boards, {1: counts(2, posted=on_world(2))}, LAST) is None          # posted it: just slow
    assert stuck(4, boards, behind, LAST) is None                      # a board of another call says nothing
    other = {0: board(post=(COLLECTIVE, 2, 0b11, SUB << 32 | ALL_REDUCE))}           # the same members, another group
    assert "having posted 0 there" in str(stuck(3, other, behind, LAST))
    assert stuck(3, {0: board(post=(COLLECTIVE, 2, 0b101, WORLD << 32))}, behind, LAST) is None   # 1 not a member
    assert stuck(3, {0: board()}, behind, LAST) is None                # nothing posted yet


def test_a_receive_or_send_a_finished_peer_never_matched_is_stuck():
    recv = {1: board(1, post=(RECEIVE, 1, 0, 0))}                      # rank 1's first receive from rank 0
    err = stuck(1, recv, {0: counts(2)}, LAST)
    assert (err.rank, err.ranks) == (1, (1, 0)) and "receive #1 from rank 0" in str(err)
    assert "having posted 0 send(s) to rank 1" in str(err)
    assert stuck(1, recv, {0: counts(2, sent=[0, 1])}, LAST) is None
    send = {0: board(1, post=(SEND, 2, 1, 0))}                         # rank 0's second send to rank 1
    assert "send #2 to rank 1" in str(stuck(1, send, {1: counts(2, received=[1, 0])}, LAST))
    assert stuck(1, send, {1: counts(2, received=[2, 0])}, LAST) is None
    assert stuck(1, send, {1: counts(2, received=[1, 0], any_source=1)}, LAST) is None   # from any rank may take it
    assert stuck(1, send, {2: counts(3)}, LAST + [""]) is None         # another rank finished: says nothing


def test_two_ranks_whose_nth_collectives_on_a_group_disagree_are_stuck_before_either_finishes():
    zero = board(post=(COLLECTIVE, 1, 0b11, WORLD << 32 | BROADCAST_FROM_0))
    one = board(post=(COLLECTIVE, 1, 0b11, WORLD << 32 | op_code("broadcast", (1,), {})))
    err = stuck(3, {0: zero, 1: one}, {}, LAST)
    assert (err.rank, err.ranks) == (0, (0, 1))
    assert "rank 1 broadcast from rank 1" in str(err) and "rank 0 posted broadcast from rank 0" in str(err)
    assert stuck(3, {0: zero, 1: zero}, {}, LAST) is None                         # the same op: they pair
    unknown_root = board(post=(COLLECTIVE, 1, 0b11, WORLD << 32 | op_code("broadcast", (), {})))
    assert stuck(3, {0: zero, 1: unknown_root}, {}, LAST) is None                 # a root nobody said: no verdict
    on_sub = board(post=(COLLECTIVE, 1, 0b11, SUB << 32 | op_code("broadcast", (1,), {})))
    assert stuck(3, {0: zero, 1: on_sub}, {}, LAST) is None                       # another group's #1
    # against a finished member's record of its own #1 there
    finished = {1: counts(2, posted=on_world(1, [(1, ALL_REDUCE)]))}
    err = stuck(3, {0: zero}, finished, LAST)
    assert (err.rank, err.ranks) == (0, (0, 1)) and "rank 0 posted broadcast from rank 0, rank 1 all_reduce" in str(err)
    err = stuck(3, {1: zero}, {0: counts(2, posted=on_world(1, [(1, ALL_REDUCE)]))}, LAST)   # rank 0 finished
    assert (err.rank, err.ranks) == (0, (0, 1)) and "rank 0 posted all_reduce, rank 1 broadcast from rank 0" in str(err)


def test_ranks_blocked_on_one_another_are_stuck_only_while_nothing_moves():
    on_world_1 = (COLLECTIVE, 1, 0b11, WORLD << 32 | ALL_REDUCE)
    on_sub_1 = (COLLECTIVE, 1, 0b11, SUB << 32 | ALL_REDUCE)
    zero = board(post=on_world_1, wait=on_world_1, groups={WORLD: (0b11, 1), SUB: (0b11, 0)})
    one = board(post=on_sub_1, wait=on_sub_1, groups={WORLD: (0b11, 0), SUB: (0b11, 1)})
    err = stuck(3, {0: zero, 1: one}, {}, LAST)
    assert (err.rank, err.ranks, err.reason) == (0, (0, 1), "unmatched") and "a deadlock" in str(err)
    assert "(another group with the same members)" in str(err) and "two communicators" in str(err)
    posted_both = board(post=on_sub_1, wait=on_sub_1, groups={WORLD: (0b11, 1), SUB: (0b11, 1)})
    assert stuck(3, {0: zero, 1: posted_both}, {}, LAST) is None      # rank 1 posted rank 0's too: just slow
    running = board(post=on_sub_1)                                     # posted, not waiting: it may post more
    assert stuck(3, {0: zero, 1: running}, {}, LAST) is None
    assert stuck(3, {0: zero, 1: board(wait=on_sub_1, groups=None)}, {}, LAST) is None   # counts unknown

    class Moving:                                                      # a board written between two reads
        def read(self):
            return one._replace(version=one.version + 2)
    assert stuck(3, {0: zero, 1: one._replace(board=Moving())}, {}, LAST) is None


def test_a_receive_from_any_rank_is_stuck_once_no_rank_can_send_it():
    waits = board(wait=(RECEIVE, 1, ANY, 0), groups={}, received=(0, 0))
    err = stuck(3, {0: waits}, {1: counts(2)}, LAST[:2])
    assert (err.rank, err.ranks) == (0, (0, 1)) and "rank 1 finished the call having sent it 0 message(s)" in str(err)
    assert stuck(3, {0: waits}, {1: counts(2, sent=[1, 0])}, LAST[:2]) is None    # a message it can take
    assert stuck(3, {0: waits}, {1: counts(3)}, LAST[:3]) is None                 # rank 2 runs: it may send one
    after_one = board(wait=(RECEIVE, 1, ANY, 0), groups={}, received=(1, 0))      # rank 1 received from 0 once
    assert stuck(3, {1: after_one}, {0: counts(2, sent=[0, 1])}, LAST[:2]).rank == 1   # ... its only message
    assert stuck(3, {1: after_one}, {0: counts(2, sent=[0, 2])}, LAST[:2]) is None     # a second one is there


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
