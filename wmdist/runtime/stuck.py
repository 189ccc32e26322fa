"""A collective or message that a finished rank can no longer match: found when it happens, not at the timeout.

The classic mistake is `if ctx.rank == 0: dist.all_reduce(x)`: rank 0 posts a collective that rank 1
never posts. Rank 1 finishes the call; rank 0 waits in gloo until the call's timeout (5 minutes by
default), and only then does the call fail. But once a rank has finished, its counts of what it posted
are final (they come with its reply, messages.MessageAudit.counts), so the pool can tell at once that
another rank's post needs something the finished rank never posted.

Each rank publishes what it last posted in this call in a shared board of two int64 (PostBoard): the
call's number, then one packed word: the kind (a collective, a receive, a send), how many of that kind it
has posted there in this call (n), and where (the group's global ranks as a bit mask, or the peer). The
parent checks each pending rank's board against every finished rank's final counts (`stuck`): a
collective #n on a group a finished member posted fewer than n collectives on, a receive #n from a
finished rank that sent it fewer than n, a send #n to a finished rank that posted fewer than n receives
from it (and no receive from any rank, which could have taken it). Such a post can never be matched
(the end-of-call count check would fail the call anyway), so the call fails with
RankFailure(reason="unmatched") naming both ranks.

One word is written at a time, and a call's number only at its start with the word cleared first, so a
read sees either nothing or a true statement about this call. Pools of more than MAX_RANKS ranks
publish nothing (the timeout still applies).
"""
from __future__ import annotations

import ctypes
from typing import Any

from wmdist.runtime.failures import RankFailure

COLLECTIVE, RECEIVE, SEND = 1, 2, 3
MAX_RANKS = 32                      # the group mask is the word's low 32 bits
_N_BITS = 30                        # n sits in bits 32..61, the kind in 62..63


def pack(kind: int, n: int, who: int) -> int:
    """One word: kind (1-3), n (1 .. 2^30 - 1) and who (a group's bit mask or a peer's rank, < 2^32)."""
    if kind not in (COLLECTIVE, RECEIVE, SEND) or not 0 < n < 1 << _N_BITS or not 0 <= who < 1 << MAX_RANKS:
        raise ValueError(f"cannot pack kind {kind}, n {n}, who {who}")
    return (kind << 62) | (n << 32) | who


def unpack(word: int) -> tuple[int, int, int]:
    """(kind, n, who) of a packed word; kind 0 for an empty one."""
    word &= (1 << 64) - 1                                    # read back from a signed int64
    return word >> 62, (word >> 32) & ((1 << _N_BITS) - 1), word & ((1 << MAX_RANKS) - 1)


def group_mask(ranks: tuple[int, ...]) -> int | None:
    """A group's global ranks as a bit mask (None when a rank is past MAX_RANKS)."""
    if not ranks or max(ranks) >= MAX_RANKS:
        return None
    return sum(1 << r for r in set(ranks))


class PostBoard:
    """One rank's shared [call number, packed last post]: written by the rank, read by the pool."""

    def __init__(self, array: Any):
        self.array = array                                   # multiprocessing RawArray(c_int64, 2)

    @classmethod
    def new(cls, ctx: Any) -> PostBoard:
        return cls(ctx.RawArray(ctypes.c_int64, 2))

    def begin(self, call: int) -> None:
        """A new call: nothing posted yet (the word is cleared before the number changes)."""
        self.array[1] = 0
        self.array[0] = call

    def post(self, kind: int, n: int, who: int) -> None:
        if 0 < n < 1 << _N_BITS and 0 <= who < 1 << MAX_RANKS:
            word = pack(kind, n, who)
            self.array[1] = word - (1 << 64) if word >= 1 << 63 else word     # as a signed int64

    def read(self) -> tuple[int, int]:
        return self.array[0], self.array[1]


def stuck(call: int, boards: dict[int, tuple[int, int]], finished: dict[int, tuple], last_comms: list[str]
          ) -> RankFailure | None:
    """The first pending rank whose last post a finished rank can no longer match, as a RankFailure, or None.

    boards: pending rank -> its board (call number, word); finished: rank -> its final counts (the reply's
    MessageAudit.counts(): sends to each rank, receives from each rank, ..., collectives per group).
    """
    for r, (at, word) in sorted(boards.items()):
        kind, n, who = unpack(word)
        if at != call or not kind:
            continue
        for f, counts in sorted(finished.items()):
            sent, received, posted = counts[0], counts[1], counts[4]
            if kind == COLLECTIVE and who >> f & 1:
                members = {i for i in range(MAX_RANKS) if who >> i & 1}
                have = next((v[0] for key, v in posted.items() if set(key) == members), 0)
                mine, theirs, ranks = f"collective #{n} on group {sorted(members)}", f"{have} there", sorted(members)
            elif kind == RECEIVE and who == f:
                have, mine, theirs = sent[r], f"receive #{n} from rank {f}", f"{sent[r]} send(s) to rank {r}"
                ranks = [r, f]
            elif kind == SEND and who == f and not counts[2]:        # (a receive from any rank may match it)
                have, mine, theirs = received[r], f"send #{n} to rank {f}", f"{received[r]} receive(s) from rank {r}"
                ranks = [r, f]
            else:
                continue
            if have < n:
                return RankFailure(r, "unmatched", f"posted its {mine}, which rank {f} can no longer match: rank {f} "
                                                   f"finished the call having posted {theirs}. Every rank must post "
                                                   f"the same collectives and matching sends and receives (does an "
                                                   f"`if ctx.rank == ...` leave one out?); found when it happened, "
                                                   f"not at the call's timeout", last_comms[r], tuple(ranks))
    return None
