"""A collective or message that can no longer be matched: found when it happens, not at the timeout.

The classic mistake is `if ctx.rank == 0: dist.all_reduce(x)`: rank 0 posts a collective that rank 1
never posts. Rank 1 finishes the call; rank 0 waits in gloo until the call's timeout (5 minutes by
default), and only then does the call fail. But once a rank has finished, its counts of what it posted
are final (they come with its reply, messages.MessageAudit.counts), so the pool can tell at once that
another rank's post needs something the finished rank never posted.

Each rank publishes in a shared board (PostBoard, WORDS int64) what it last posted in this call, and,
while it is blocked waiting for an op (a wait, or a call such as monitored_barrier that blocks inside
torch), that op and its counts at that moment: how many collectives it posted on each of its groups
(slots, counted from torch's per-group sequence numbers: messages.py), and its sends and receives per
rank. A post is written before it is handed to torch. An op is named by its kind (a collective, a
receive, a send), how many of that kind the rank has posted there in this call (n), where (a group's
global ranks as a bit mask and the hash of its torch name, which tells same-member groups apart; or the
peer), and for a collective its op code (routes.op_code: wire class, reduce op, root). The parent checks
the boards while a call runs (matching.py has the rules):

- a pending rank's post that a finished rank can no longer match (a collective #n on a group a finished
  member posted fewer than n on; a receive #n from, or a send #n to, a finished rank short of it);
- two ranks' n-th collectives on one group that disagree (a broadcast whose ranks disagree on `src`,
  an all-reduce against a broadcast): gloo pairs them and neither can finish;
- ranks each blocked waiting for another that is blocked too, or finished, and lacks the post it needs
  (rank 0 waits in a collective on one group, rank 1 in one on another group with the same members;
  a receive from any rank while every other rank has finished or waits). This verdict needs boards that
  did not change between two reads, so it describes one instant at which every one of those ranks was
  blocked; it assumes a blocked rank posts nothing until its wait ends (one posting thread per rank).
  A send or receive #n counts over every (group, tag) queue, but gloo matches within one queue, so it is
  judged only for a rank whose sends and receives used one queue (QUEUES; ring_rounds' two tags made a
  false verdict).

Such a post can never be matched, so the call fails with RankFailure(reason="unmatched") naming the
ranks. A board is written under a sequence lock (a version word, odd while writing), so a read sees a
whole statement about this call or retries. Pools of more than MAX_RANKS ranks publish nothing.
"""
from __future__ import annotations

import ctypes
import threading
import zlib
from typing import Any, NamedTuple

from wmdist.runtime.failures import RankFailure

COLLECTIVE, RECEIVE, SEND = 1, 2, 3
ANY = (1 << 32) - 1                 # `who` of a receive from any rank
MAX_RANKS = 32                      # the group mask is the word's low 32 bits
MAX_GROUPS = 8                      # groups a blocked rank lists its slots on (more: unknown, never a verdict)
_N_BITS = 30                        # n sits in bits 32..61, the kind in 62..63
VERSION, CALL, POST, POST_AT, WAIT, WAIT_AT, GROUPS, TABLE = range(8)
SENT = TABLE + 2 * MAX_GROUPS
RECEIVED = SENT + MAX_RANKS
ANY_COUNT = RECEIVED + MAX_RANKS
QUEUES = ANY_COUNT + 1
WORDS = QUEUES + 1
_READ_TRIES = 100


def pack(kind: int, n: int, who: int) -> int:
    """One word: kind (1-3), n (1 .. 2^30 - 1) and who (a group's bit mask, a peer's rank or ANY, < 2^32)."""
    if kind not in (COLLECTIVE, RECEIVE, SEND) or not 0 < n < 1 << _N_BITS or not 0 <= who < 1 << 32:
        raise ValueError(f"cannot pack kind {kind}, n {n}, who {who}")
    return (kind << 62) | (n << 32) | who


def unpack(word: int) -> tuple[int, int, int]:
    """(kind, n, who) of a packed word; kind 0 for an empty one."""
    word &= (1 << 64) - 1                                    # read back from a signed int64
    return word >> 62, (word >> 32) & ((1 << _N_BITS) - 1), word & ((1 << 32) - 1)


def group_mask(ranks: tuple[int, ...]) -> int | None:
    """A group's global ranks as a bit mask (None when a rank is past MAX_RANKS)."""
    if not ranks or max(ranks) >= MAX_RANKS:
        return None
    return sum(1 << r for r in set(ranks))


def group_id(name: str) -> int:
    """A group's torch name as 32 bits: what tells groups with the same members apart on a board."""
    return zlib.crc32(name.encode())


class Snapshot(NamedTuple):
    """One whole read of a board. post/wait: packed words (0: none); *_at: (gid << 32 | op code) of a
    collective; groups: {gid: (mask, slots)} (None: more groups than the board holds); sent/received: per
    rank, with any_count receives from any rank (counts at the moment the rank blocked); queues: how many
    message queues (group, tag) its sends and receives used in this call so far (see matching._lacking)."""
    call: int
    version: int
    post: int
    post_at: int
    wait: int
    wait_at: int
    groups: dict[int, tuple[int, int]] | None
    sent: tuple[int, ...]
    received: tuple[int, ...]
    any_count: int
    queues: int = 1
    board: Any = None                     # the PostBoard read (None in tests): read again to see it unchanged


class PostBoard:
    """One rank's shared board: written by the rank (under a sequence lock), read by the pool."""

    def __init__(self, array: Any):
        self.array = array                                   # multiprocessing RawArray(c_int64, WORDS)
        # The same words read as unsigned: a packed word is written as it is, with no sign fix-up per word
        # (that Python loop over the board cost more than the send it described).
        self._unsigned = (ctypes.c_uint64 * len(array)).from_buffer(array)
        self._lock = threading.Lock()
        self._previous = [0, 0]

    @classmethod
    def new(cls, ctx: Any) -> PostBoard:
        return cls(ctx.RawArray(ctypes.c_int64, WORDS))

    def _write(self, at: int, words: list[int]) -> None:
        with self._lock:
            version = self.array[VERSION]
            self.array[VERSION] = version + 1                # odd: being written
            self._unsigned[at:at + len(words)] = words       # ctypes wraps a negative count (-1) to its word
            self.array[VERSION] = version + 2

    def begin(self, call: int) -> None:
        """A new call: nothing posted yet."""
        self._write(CALL, [call] + [0] * (WORDS - POST))

    def post(self, kind: int, n: int, who: int, at: int) -> None:
        """This rank's latest post (`at`: gid << 32 | op code, for a collective)."""
        if 0 < n < 1 << _N_BITS and 0 <= who < 1 << 32:
            self._previous = [self.array[POST], self.array[POST_AT]]
            self._write(POST, [pack(kind, n, who), at])

    def undo(self) -> None:
        """Take back the latest post: torch refused it (it raised), so it was never posted."""
        self._write(POST, [w & ((1 << 64) - 1) for w in self._previous])

    def blocked(self, kind: int, n: int, who: int, at: int, groups: dict[int, tuple[int, int]] | None,
                sent: list[int], received: list[int], any_count: int, *, queues: int = 1) -> None:
        """This rank now waits for that op, with these counts (see Snapshot)."""
        if not (0 < n < 1 << _N_BITS and 0 <= who < 1 << 32) or len(sent) > MAX_RANKS:
            return
        table = [0] * (2 * MAX_GROUPS)
        count = -1 if groups is None or len(groups) > MAX_GROUPS else len(groups)
        for i, (gid, (mask, slots)) in enumerate(list((groups or {}).items())[:MAX_GROUPS]):
            table[2 * i:2 * i + 2] = [gid << 32 | mask, slots]
        pad = [0] * (MAX_RANKS - len(sent))
        self._write(WAIT, [pack(kind, n, who), at, count, *table, *sent, *pad, *received, *pad, any_count, queues])

    def unblocked(self) -> None:
        self._write(WAIT, [0, 0])

    def read(self) -> Snapshot | None:
        """A whole read of the board, or None when it was being written every time it was read."""
        for _ in range(_READ_TRIES):
            before = self.array[VERSION]
            words = self.array[:]
            if before % 2 == 0 and self.array[VERSION] == before:
                return snapshot(words, board=self)
        return None


def snapshot(words: list[int], *, board: PostBoard | None = None) -> Snapshot:
    """The Snapshot of a board's words."""
    u = [w & ((1 << 64) - 1) for w in words]
    count = words[GROUPS]
    groups = None if count < 0 else {u[TABLE + 2 * i] >> 32: (u[TABLE + 2 * i] & ANY, u[TABLE + 2 * i + 1])
                                     for i in range(count)}
    return Snapshot(words[CALL], words[VERSION], u[POST], u[POST_AT], u[WAIT], u[WAIT_AT], groups,
                    tuple(words[SENT:RECEIVED]), tuple(words[RECEIVED:ANY_COUNT]), words[ANY_COUNT], words[QUEUES],
                    board)


def stuck(call: int, boards: dict[int, Snapshot | None], finished: dict[int, tuple], last_comms: list[str]
          ) -> RankFailure | None:
    """The first post that can no longer be matched, as a RankFailure, or None.

    boards: pending rank -> its board read (PostBoard.read); finished: rank -> its final counts (the reply's
    MessageAudit.counts(): sends to each rank, receives from each rank, ..., collectives per group).
    """
    from wmdist.runtime.matching import behind_finished, deadlocked, disagreeing   # (matching imports this module)

    current = {r: s for r, s in boards.items() if s is not None and s.call == call}
    found = behind_finished(current, finished) or disagreeing(current, finished)
    if found is None:
        found = deadlocked(current, finished, len(last_comms))
        if found is not None and not all(_unchanged(current[r]) for r in found[1] if r in current):
            return None                        # one of them moved on: look again at the next poll
    if found is None:
        return None
    rank, ranks, detail = found
    return RankFailure(rank, "unmatched", f"{detail}; found when it happened, not at the call's timeout",
                       last_comms[rank], tuple(ranks))


def _unchanged(seen: Snapshot) -> bool:
    if seen.board is None:
        return True
    again = seen.board.read()
    return again is not None and again.version == seen.version
