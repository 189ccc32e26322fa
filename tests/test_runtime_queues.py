"""Sends and receives on several (group, tag) queues never make a false deadlock verdict.

gloo matches a send with a receive within one queue (group, peer, tag). A board counts a rank's
receives from a peer over every queue, so with two tags "receive #2 from rank 3" can be the first on
its tag, matched by rank 3's send #1: ring_rounds posts its all-gather receive (tag 1) ahead of its
reduce-scatter one (tag 0), and on a 2-rank ring both ranks then wait for "receive #2" while each has
posted one send. The pool used to call that a deadlock (test_comm's subgroup ring, 1 run in 2-10 on a
loaded machine: whenever a poll fell while both messages were in flight). The rule now claims nothing
about a send or receive of a rank that used more than one queue; with one queue it still does.
"""
from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from wmdist.runtime import RankFailure, run
from wmdist.runtime.stuck import ANY, RECEIVE, PostBoard, stuck

SPAWN = multiprocessing.get_context("spawn")
LAST = ["", "wait for receive from rank 3", "", "wait for receive from rank 1"]


def blocked(call: int, n: int, peer: int, sent: list[int], received: list[int], queues: int):
    """A real board of a rank blocked on its receive #n from `peer`, written as a rank writes it."""
    b = PostBoard.new(SPAWN)
    b.begin(call)
    b.post(RECEIVE, n, peer, 0)
    b.blocked(RECEIVE, n, peer, 0, {}, sent, received, 0, queues=queues)
    return b.read()


def test_the_subgroup_rings_boards_are_no_deadlock_but_the_same_on_one_tag_are():
    # The boards of the false verdict: ranks 1 and 3 each posted two receives from the other (tags 1 and 0)
    # and one send (tag 0), and wait for receive #2 (tag 0's first, which the other's send #1 matches).
    def boards(queues: int) -> dict:
        return {1: blocked(3, 2, 3, [0, 0, 0, 1], [0, 0, 0, 2], queues),
                3: blocked(3, 2, 1, [0, 1, 0, 0], [0, 2, 0, 0], queues)}
    assert boards(2)[1].queues == 2                                      # the board holds the count
    assert stuck(3, boards(2), {}, LAST) is None
    err = stuck(3, boards(1), {}, LAST)                # one tag: receive #2 needs send #2, never posted
    assert err is not None and err.reason == "unmatched" and err.ranks == (1, 3) and "a deadlock" in str(err)


def test_a_receive_from_any_rank_on_one_of_two_queues_is_not_judged_by_counts_over_both():
    any_wait = PostBoard.new(SPAWN)
    any_wait.begin(3)
    any_wait.blocked(RECEIVE, 1, ANY, 0, {}, [0, 0], [1, 0], 0, queues=2)   # its receive from rank 0 was on another tag
    finished = {0: ([0, 1], [0, 0], 0, 0, {}, ([], []))}            # rank 0 sent once, on the any-source tag
    assert stuck(3, {1: any_wait.read()}, finished, LAST[:2]) is None
    one_queue = PostBoard.new(SPAWN)
    one_queue.begin(3)
    one_queue.blocked(RECEIVE, 1, ANY, 0, {}, [0, 0], [1, 0], 0, queues=1)  # one tag: that one send is spoken for
    assert stuck(3, {1: one_queue.read()}, finished, LAST[:2]).rank == 1


ELEMS = 1 << 22                 # 16 MiB a message: long enough in flight that polls find both ranks waiting
ROUNDS = 100


def posted_ahead(ctx):
    """ring_rounds' 2-rank pattern: receive tag 1, receive tag 0, send tag 0, wait on tag 0, send tag 1."""
    torch.set_num_threads(1)
    peer = 1 - ctx.rank
    gather, scatter, total = torch.empty(ELEMS), torch.empty(ELEMS), 0.0
    for i in range(ROUNDS):
        ahead = dist.irecv(gather, peer, tag=1)
        mine = dist.irecv(scatter, peer, tag=0)
        sends = [dist.isend(torch.full((ELEMS,), float(10 * ctx.rank + i)), peer, tag=0)]
        mine.wait()                             # its receive #2 from the peer: the peer's send #1 matches it
        sends.append(dist.isend(scatter + 1, peer, tag=1))
        ahead.wait()
        for work in sends:
            work.wait()
        total += float(gather[0]) + float(gather[-1])
    return total


def test_posted_ahead_receives_on_two_tags_finish_on_real_ranks():
    expected = [2 * sum(10 * r + i + 1 for i in range(ROUNDS)) for r in (0, 1)]   # the partner's own values, + 1
    assert run(posted_ahead, 2, timeout=120) == [float(expected[0]), float(expected[1])]


def both_receive_first(ctx):
    """A true deadlock on one queue: each rank's blocking receive waits for a send the other posts after it."""
    peer = 1 - ctx.rank
    got = torch.empty(2)
    dist.recv(got, peer)
    dist.send(torch.ones(2), peer)
    return got.tolist()


def test_two_ranks_each_receiving_first_on_one_tag_are_still_a_deadlock():
    with pytest.raises(RankFailure) as info:
        run(both_receive_first, 2, timeout=90)     # found by the rule, not the timeout: the reason says which
    assert info.value.reason == "unmatched" and "a deadlock" in str(info.value)
    assert "receive #1 from rank 1" in str(info.value) and info.value.ranks == (0, 1)
