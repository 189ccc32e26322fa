"""Every point-to-point message a call posts must be matched before the call ends.

gloo matches a send with a receive by (group, peer, tag), in order, and keeps an
unmatched one for as long as the process lives. In a warm pool that is a trap:
a call whose rank 0 posts `dist.isend(x, 1)` that nobody receives ends
normally, and the *next* call's first receive on rank 1 from rank 0 pairs with
that stale message and hangs. Fresh tags or groups per call cannot isolate
it, because a learner's raw `dist.isend` uses the default group and tag 0.

So each rank counts the sends and receives it posts during a call, through a
wrapper on torch's `ProcessGroup.send/recv/recv_anysource`, which every route
reaches (dist.send/isend/recv/irecv, batch_isend_irecv, send_object_list, the
counted wrappers in wmdist.comm), and sends the counts to the parent with
its result (no extra collective: the parent hears from every rank anyway).
If rank i posted more sends to rank j than j posted receives from i (or
fewer), the parent fails that call naming both ranks and replaces the pool,
so nothing stale reaches the next call. Matched transfers nobody waited for
are then waited for, with a bound in case their tags disagree.

Collectives are the same trap: gloo pairs the n-th collective posted on a
group on one rank with the n-th on every other member, so an async
all-reduce that only rank 0 posted (ranks that disagree on their bucket
count) makes the *next* call's first all-reduce pair with it. The same
wrapper counts every collective each rank posts on each group (by the
group's global ranks, with a checksum of the ops' wire classes in order:
wire.py, where the functional collectives DTensor uses are counted too); the
parent checks that every member of every group posted the same sequence,
and otherwise fails the call naming the ranks and the op.
"""
from __future__ import annotations

import time
import zlib
from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from wmdist.runtime.stuck import COLLECTIVE, RECEIVE, SEND, group_mask
from wmdist.runtime.wire import COLLECTIVES, count_functional, wait_functional, work_registry_size

if TYPE_CHECKING:
    from wmdist.comm import Ledger

DRAIN_TIMEOUT_S = 30.0    # matched transfers finish in milliseconds; only disagreeing tags take this long
DRAIN_AT_LEAST_S = 0.5    # ... and are given this long even when the call's own timeout is (nearly) spent
TAIL = 16                 # the last collectives kept per group, to name the one another rank lacks
# Per group (its global ranks): (collectives posted, checksum of their names in order, the last TAIL as (index, name)).
Posted = dict[tuple[int, ...], tuple[int, int, list[tuple[int, str]]]]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def mismatched_sizes(sizes: list[tuple[list[list[int]], list[list[int]]]], any_source: list[int]) -> \
        tuple[int, str] | None:
    """The first receiver whose buffers differ in size from the messages sent to it: (its rank, what), or None.

    gloo delivers a smaller message into a larger buffer without a word, and the
    tail keeps stale values, so a buffer must be exactly the size of its message.
    Checked once every count matched; not for a rank that received from any rank.
    """
    n = len(sizes)
    for j in range(n):
        for i in range(n):
            sent, buffers = sizes[i][0][j], sizes[j][1][i]
            if not any_source[j] and sent != buffers:
                return j, (f"received {sent[0]} B in messages from rank {i} into receive buffers of {buffers[0]} B "
                           f"(each buffer must be the size of the message it receives: a larger one keeps stale "
                           f"values past what arrived, and the ledger would count bytes that never came)")
    return None


def unmatched_collectives(posted: list[Posted]) -> tuple[int, tuple[int, ...], str] | None:
    """The first group whose members posted different collectives: (rank to blame, ranks involved, what), or None.

    posted[r] is rank r's Posted; a member that never used the group posted nothing on it.
    """
    n = len(posted)
    for key in sorted({k for p in posted for k in p}):
        members = [r for r in key if r < n]
        seen = {r: posted[r].get(key, (0, 0, [])) for r in members}
        if len({(count, crc) for count, crc, _ in seen.values()}) <= 1:
            continue
        counts = {r: seen[r][0] for r in members}
        fewest, most = min(counts.values()), max(counts.values())
        if most > fewest:
            culprit = next(r for r in members if counts[r] == most)
            behind = [r for r in members if counts[r] == fewest]
            op = dict(seen[culprit][2]).get(fewest, "a collective")
            return culprit, tuple(members), (
                f"posted {op} on group {list(key)} (its collective #{fewest + 1} there) that rank(s) "
                f"{', '.join(map(str, behind))} never posted; collectives posted on that group in this call, by rank: "
                f"{counts}")
        names = {r: [name for _, name in seen[r][2]] for r in members}
        return members[0], tuple(members), (f"and the other members of group {list(key)} posted different "
                                            f"collectives in this call (last ones, by rank: {names})")
    return None


def unmatched(sent: list[list[int]], received: list[list[int]], any_source: list[int]) -> tuple[int, str] | None:
    """The first unmatched message as (rank to blame, what it did), or None.

    sent[i][j]: sends rank i posted to rank j; received[j][i]: receives rank j
    posted from rank i; any_source[j]: receives rank j posted from any rank.
    """
    n = len(sent)
    for j in range(n):
        extra = {i: sent[i][j] - received[j][i] for i in range(n) if sent[i][j] > received[j][i]}
        missing = {i: received[j][i] - sent[i][j] for i in range(n) if received[j][i] > sent[i][j]}
        if missing:
            i, k = next(iter(missing.items()))
            return j, (f"posted {k} receive(s) from rank {i} that rank {i} never sent "
                       f"(an irecv/recv without a matching send)")
        spare = any_source[j] - sum(extra.values())
        if spare < 0:
            i = next(iter(extra))
            return i, (f"sent {extra[i]} message(s) to rank {j} that rank {j} never received "
                       f"(an isend/send without a matching recv/irecv)")
        if spare > 0:
            return j, f"posted {spare} receive(s) from any rank that no message matched"
    return None


class MessageAudit:
    """Counts this rank's posted point-to-point ops and collectives during one call and checks them at its end."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.begin()

    def begin(self, *, ledger: Ledger | None = None, on_post: Callable[[int, int, int], None] | None = None) -> None:
        """Start a call with nothing counted; a raw dist op is noted in `ledger` as the rank's last op, and each
        post is told to `on_post(kind, n, who)` (stuck.PostBoard.post)."""
        self.sent = [0] * self.world_size
        self.received = [0] * self.world_size
        self.any_source = 0
        # Per peer: [bytes, sum of crc32(size)]: an order-free fingerprint of the message sizes (sizes_in: buffers).
        self.sizes_out = [[0, 0] for _ in range(self.world_size)]
        self.sizes_in = [[0, 0] for _ in range(self.world_size)]
        self.pending: list[tuple[Any, str]] = []     # (Work, description) not yet completed
        self.collectives: dict[tuple[int, ...], list] = {}   # group's global ranks: [count, crc, tail]
        self._ranks: dict[int, tuple[int, ...] | None] = {}  # id(group) -> its global ranks, this call
        self.functional: list[tuple[Any, str]] = []          # (result, description) of each functional collective
        self.ledger, self.on_post = ledger, on_post

    def _group_ranks(self, group: Any) -> tuple[int, ...] | None:
        key = self._ranks.get(id(group), ())
        if key == ():
            try:
                key = tuple(dist.get_process_group_ranks(group))
            except (ValueError, RuntimeError):
                key = None         # a group torch does not know the ranks of: cannot be attributed
            self._ranks[id(group)] = key
        return key

    def collective(self, name: str, wire: str, group: Any, work: Any) -> tuple[int, ...] | None:
        """Count one posted collective on `group`, named `name`, of wire class `wire` (wire.py); its group's ranks."""
        key = self._group_ranks(group)
        if key is None:
            return None
        entry = self.collectives.setdefault(key, [0, 0, deque(maxlen=TAIL)])
        entry[2].append((entry[0], name))
        entry[0] += 1
        entry[1] = zlib.crc32(wire.encode(), entry[1])
        mask = group_mask(key)
        if self.on_post is not None and mask is not None:
            self.on_post(COLLECTIVE, entry[0], mask)
        self._keep(work, f"its {name} on group {list(key)}")
        return key

    def _functional(self, name: str, wire: str, group: Any, call: Callable[[], Any]) -> Any:
        """Post one functional collective (`group` is a group or its name) and count it; keep its result."""
        if isinstance(group, str):
            try:
                group = c10d._resolve_process_group(group)
            except (ValueError, RuntimeError, LookupError):
                return call()              # a group torch cannot find: torch's own error, or not ours to count
        if self.functional and work_registry_size() == 0:
            self.functional.clear()        # all waited for: keep no result alive (a loop of them would hold all)
        text = f"{name} on group {list(self._group_ranks(group) or ())}"
        result = self._raw(text, call)
        key = self.collective(name, wire, group, None)
        if key is not None:
            self.functional.append((result, f"its {name} on group {list(key)}"))
        return result

    def _keep(self, work: Any, what: str) -> None:
        if work is not None and not work.is_completed():
            if len(self.pending) >= 64:
                self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
            self.pending.append((work, what))

    def _raw(self, text: str, call: Callable[[], Any]) -> Any:
        """Run a dist op, noted as the rank's last op unless a counted op already is (so a hang names it)."""
        ledger = self.ledger
        if ledger is None or ledger.in_progress:
            return call()
        ledger.enter(f"{text} (a raw torch.distributed call, not counted)")
        work = call()
        ledger.leave()
        return work

    def posted(self, kind: str, group: Any, peer: int | None, tag: int, work: Any, *, size: int = 0) -> None:
        """Count one posted op of `size` bytes (`peer` is a group rank; None: a receive from any rank)."""
        if peer is None:
            self.any_source += 1
            where = "any rank"
        else:
            try:
                peer = dist.get_global_rank(group, peer)
            except (ValueError, RuntimeError):
                return    # a group torch does not know the ranks of: cannot be attributed
            counts = self.sent if kind == "send" else self.received
            counts[peer] += 1
            if self.on_post is not None:
                self.on_post(SEND if kind == "send" else RECEIVE, counts[peer], peer)
            sizes = (self.sizes_out if kind == "send" else self.sizes_in)[peer]
            sizes[0] += size
            sizes[1] = (sizes[1] + zlib.crc32(size.to_bytes(8, "little"))) % (1 << 64)
            where = f"rank {peer}"
        self._keep(work, f"its {kind} {'to' if kind == 'send' else 'from'} {where} (tag {tag})")

    def install(self) -> MessageAudit:
        """Count every send/recv and collective posted in this process from now on (once per rank process)."""
        cls = dist.ProcessGroup
        send, recv, recv_any = cls.send, cls.recv, cls.recv_anysource
        audit = self

        def counted_send(group: Any, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
            work = audit._raw(f"dist.send to group rank {dst} (tag {tag})", lambda: send(group, tensors, dst, tag))
            audit.posted("send", group, dst, tag, work, size=_bytes(tensors))
            return work

        def counted_recv(group: Any, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
            work = audit._raw(f"dist.recv from group rank {src} (tag {tag})", lambda: recv(group, tensors, src, tag))
            audit.posted("receive", group, src, tag, work, size=_bytes(tensors))
            return work

        def counted_recv_any(group: Any, tensors: list[torch.Tensor], tag: int = 0) -> Any:
            work = audit._raw(f"dist.recv from any rank (tag {tag})", lambda: recv_any(group, tensors, tag))
            audit.posted("receive", group, None, tag, work)
            return work

        cls.send, cls.recv, cls.recv_anysource = counted_send, counted_recv, counted_recv_any
        wait = dist.Work.wait

        def noted_wait(work: Any, *args: Any, **kwargs: Any) -> Any:     # dist.barrier() etc. wait inside torch
            what = next((text[4:] for w, text in audit.pending if w is work), "a torch.distributed op")
            return audit._raw(f"wait for {what}", lambda: wait(work, *args, **kwargs))

        dist.Work.wait = noted_wait
        for method in COLLECTIVES:
            if hasattr(cls, method):
                setattr(cls, method, self._counting(method, getattr(cls, method)))
        count_functional(self._functional)
        return self

    def _counting(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        audit = self

        name, wire = COLLECTIVES[method]

        def counted_collective(group: Any, *args: Any, **kwargs: Any) -> Any:
            text = f"dist.{name} on group {list(audit._group_ranks(group) or ())}"
            work = audit._raw(text, lambda: original(group, *args, **kwargs))
            audit.collective(name, wire, group, work)
            return work

        return counted_collective

    def counts(self) -> tuple[list[int], list[int], int, int, Posted, tuple[list[list[int]], list[list[int]]]]:
        """(sends posted to each rank, receives posted from each rank, receives from any rank, ops never waited
        for, collectives posted on each group, (sizes sent to, buffers posted from each rank))."""
        unwaited = sum(1 for work, _ in self.pending if not work.is_completed())
        unwaited += work_registry_size() if self.functional else 0
        posted = {key: (count, crc, list(tail)) for key, (count, crc, tail) in self.collectives.items()}
        return self.sent, self.received, self.any_source, unwaited, posted, (self.sizes_out, self.sizes_in)

    def drain(self, *, within: float = DRAIN_TIMEOUT_S) -> str | None:
        """Wait up to `within` seconds for the ops the call never waited for (all matched); describe one that
        does not finish, or None."""
        self.ledger = None              # the call is over: its ledger no longer names what this rank does
        deadline = time.monotonic() + within
        for work, what in self.pending:
            if work.is_completed():      # waited for by the call (a gloo work must be waited for only once)
                continue
            try:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except Exception as err:     # gloo raises on timeout
                return (f"left {what} unfinished {within:.1f} s after the call ended (do the tags of "
                        f"the send and the receive agree?): {str(err).splitlines()[0]}")
        self.pending = []
        kept, self.functional = self.functional, []
        return wait_functional(kept, within=max(deadline - time.monotonic(), 0.001)) if kept else None
