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
wrapper counts every collective each rank posts on each group (by torch's
group name and the group's global ranks, from torch's own sequence numbers so
that those posted from C++ count too: slots.py; with each op's wire class,
reduce op and root: routes.py, where the functional collectives DTensor uses are
counted too); the parent checks the members agree (matching.py), and
otherwise fails the call naming the ranks and the op. Every post is written to
the rank's board (stuck.py) before torch gets it, and every wait on one of them
marks the rank blocked, so the pool can find a mismatch while the call runs.
"""
from __future__ import annotations

import contextlib
import time
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from wmdist.runtime.matching import mismatched_sizes, unmatched, unmatched_collectives
from wmdist.runtime.notary import Notary
from wmdist.runtime.slots import GroupCounts, sequence_number
from wmdist.runtime.stuck import ANY, COLLECTIVE, RECEIVE, SEND, PostBoard
from wmdist.runtime.routes import COLLECTIVES, count_functional, op_code, wait_functional, work_registry_size

if TYPE_CHECKING:
    from wmdist.comm import Ledger

DRAIN_TIMEOUT_S = 30.0    # matched transfers finish in milliseconds; only disagreeing tags take this long
DRAIN_AT_LEAST_S = 0.5    # ... and are given this long even when the call's own timeout is (nearly) spent
BLOCKING = ("monitored_barrier",)   # collectives that wait inside torch's call, not in a Work.wait
__all__ = ["MessageAudit", "mismatched_sizes", "unmatched", "unmatched_collectives"]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class MessageAudit:
    """Counts this rank's posted point-to-point ops and collectives during one call and checks them at its end."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.notary = Notary()
        self.begin()

    def begin(self, *, ledger: Ledger | None = None, board: PostBoard | None = None) -> None:
        """Start a call with nothing counted; a raw dist op is noted in `ledger` as the rank's last op, and each
        post and wait is written to `board` (stuck.py)."""
        self.sent = [0] * self.world_size
        self.received = [0] * self.world_size
        self.any_source = 0
        self.queues: set[tuple[int, int]] = set()    # (group, tag) of each send/receive: gloo's matching queues
        # Per peer: [bytes, sum of crc32(size)]: an order-free fingerprint of the message sizes (sizes_in: buffers).
        self.sizes_out = [[0, 0] for _ in range(self.world_size)]
        self.sizes_in = [[0, 0] for _ in range(self.world_size)]
        # id(work) -> (Work, description, (kind, n, who, at) for the board), for works not yet completed: a wait
        # finds its own in one lookup (the entry keeps the Work alive, so its id is not reused meanwhile)
        self.pending: dict[int, tuple[Any, str, tuple[int, int, int, int]]] = {}
        self.groups = GroupCounts()
        self.functional: list[tuple[Any, str]] = []          # (result, description) of each functional collective
        self.ledger, self.board = ledger, board
        if board is not None:
            self.notary.call_begins()

    def _group_ranks(self, group: Any) -> tuple[int, ...] | None:
        count = self.groups.of(group)
        return None if count is None else count.key[1]

    def _blocked(self, post: tuple[int, int, int, int]) -> None:
        if self.board is not None:
            self.board.blocked(*post, self.groups.table(), self.sent, self.received, self.any_source,
                               queues=len(self.queues))

    @contextlib.contextmanager
    def _waiting(self, post: tuple[int, int, int, int]) -> Iterator[None]:
        """Around a wait that may block: the board says so once it has lasted (notary.py)."""
        board = self.board
        if board is None:
            yield
            return
        self.notary.waiting(lambda: self._blocked(post), board.unblocked)
        try:
            yield
        finally:
            self.notary.done()

    def collective(self, name: str, wire: str, group: Any, call: Callable[[], Any], code: int) -> Any:
        """Post one collective on `group` (`call()` posts it), named `name`, of wire class `wire` and op code
        `code` (routes.py): counted, on the board first; returns what `call()` returns."""
        count = self.groups.of(group)
        text = f"{name} on group {list(count.key[1]) if count else []}"
        if count is None:
            return self._raw(f"dist.{text}", call)
        before = sequence_number(group)
        slot = count.slots(now=before) + 1
        post = (COLLECTIVE, slot, count.mask, count.gid << 32 | code)
        on_board = self.board is not None and count.mask is not None
        blocking = on_board and wire in BLOCKING
        with self._noted(f"dist.{text}"):
            if on_board:
                self.board.post(*post)
            try:
                with self._waiting(post) if blocking else contextlib.nullcontext():
                    work = call()
            except BaseException:
                if on_board:
                    self.board.undo()           # refused by torch: never posted
                raise
        count.seen(before, sequence_number(group), collective=True)
        count.record(slot, name, wire, code)
        self._keep(work, f"its {text}", post)
        return work

    def _functional(self, name: str, wire: str, group: Any, call: Callable[[], Any]) -> Any:
        """Post one functional collective (`group` is a group or its name) and count it; keep its result."""
        if isinstance(group, str):
            try:
                group = c10d._resolve_process_group(group)
            except (ValueError, RuntimeError, LookupError):
                return call()              # a group torch cannot find: torch's own error, or not ours to count
        if self.functional and work_registry_size() == 0:
            self.functional.clear()        # all waited for: keep no result alive (a loop of them would hold all)
        result = self.collective(name, wire, group, call, op_code(wire, (), {}))
        ranks = self._group_ranks(group)
        if ranks is not None:
            self.functional.append((result, f"its {name} on group {list(ranks)}"))
        return result

    def _keep(self, work: Any, what: str, post: tuple[int, int, int, int]) -> None:
        if isinstance(work, dist.Work) and not work.is_completed():
            if len(self.pending) >= 64:
                self.pending = {k: p for k, p in self.pending.items() if not p[0].is_completed()}
            self.pending[id(work)] = (work, what, post)

    def _raw(self, text: str, call: Callable[[], Any]) -> Any:
        """Run a dist op, noted as the rank's last op unless a counted op already is (so a hang names it)."""
        with self._noted(text):
            return call()

    @contextlib.contextmanager
    def _noted(self, text: str) -> Iterator[None]:
        """Note a raw dist op as the rank's last op (unless a counted op already is) for as long as the block runs;
        one that raises stays noted, so the failure names it. Its post goes on the board inside the block: the
        parent may judge a post the moment it is written, and then the rank's last op must already name it."""
        ledger = self.ledger
        if ledger is None or ledger.in_progress:
            yield
            return
        ledger.enter(f"{text} (a raw torch.distributed call, not counted)")
        yield
        ledger.leave()

    def point_to_point(self, kind: str, group: Any, peer: int | None, tag: int, call: Callable[[], Any], *,
                       size: int = 0) -> Any:
        """Post one send or receive of `size` bytes (`peer` is a group rank; None: a receive from any rank)."""
        text = (f"dist.send to group rank {peer}" if kind == "send" else
                f"dist.recv from {'any rank' if peer is None else f'group rank {peer}'}") + f" (tag {tag})"
        if peer is None:
            who, where, n = ANY, "any rank", self.any_source + 1
        else:
            try:
                who = dist.get_global_rank(group, peer)
            except (ValueError, RuntimeError):
                return self._raw(text, call)    # a group torch does not know the ranks of: cannot be attributed
            counts = self.sent if kind == "send" else self.received
            where, n = f"rank {who}", counts[who] + 1
        post = (SEND if kind == "send" else RECEIVE, n, who, 0)
        count = self.groups.of(group)
        # gloo matches per (group, peer, tag): with more than one queue, n is not a place in one queue
        self.queues.add((count.gid if count is not None else id(group), tag))
        before = sequence_number(group) if count is not None else None
        with self._noted(text):
            if self.board is not None:
                self.board.post(*post)
            try:
                work = call()
            except BaseException:
                if self.board is not None:
                    self.board.undo()           # refused by torch: never posted
                raise
        if count is not None:
            count.seen(before, sequence_number(group), collective=False)
        if peer is None:
            self.any_source += 1
        else:
            counts[who] += 1
            sizes = (self.sizes_out if kind == "send" else self.sizes_in)[who]
            sizes[0] += size
            sizes[1] = (sizes[1] + zlib.crc32(size.to_bytes(8, "little"))) % (1 << 64)
        self._keep(work, f"its {kind} {'to' if kind == 'send' else 'from'} {where} (tag {tag})", post)
        return work

    def install(self) -> MessageAudit:
        """Count every send/recv and collective posted in this process from now on (once per rank process)."""
        cls = dist.ProcessGroup
        send, recv, recv_any = cls.send, cls.recv, cls.recv_anysource
        audit = self

        def counted_send(group: Any, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
            return audit.point_to_point("send", group, dst, tag, lambda: send(group, tensors, dst, tag),
                                        size=_bytes(tensors))

        def counted_recv(group: Any, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
            return audit.point_to_point("receive", group, src, tag, lambda: recv(group, tensors, src, tag),
                                        size=_bytes(tensors))

        def counted_recv_any(group: Any, tensors: list[torch.Tensor], tag: int = 0) -> Any:
            return audit.point_to_point("receive", group, None, tag, lambda: recv_any(group, tensors, tag))

        cls.send, cls.recv, cls.recv_anysource = counted_send, counted_recv, counted_recv_any
        wait = dist.Work.wait

        def noted_wait(work: Any, *args: Any, **kwargs: Any) -> Any:     # dist.barrier() etc. wait inside torch
            mine = audit.pending.get(id(work))
            what = mine[1][4:] if mine else "a torch.distributed op"
            if mine is not None and audit.board is not None and not work.is_completed():
                with audit._waiting(mine[2]):
                    done = audit._raw(f"wait for {what}", lambda: wait(work, *args, **kwargs))
            else:
                done = audit._raw(f"wait for {what}", lambda: wait(work, *args, **kwargs))
            # Waited for: no longer pending. Kept, the Work would keep its tensor alive (a ring's whole
            # buffer, through a view) until 64 had piled up, and then free them all inside some later op.
            audit.pending.pop(id(work), None)
            return done

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
            return audit.collective(name, wire, group, lambda: original(group, *args, **kwargs),
                                    op_code(wire, args, kwargs))

        return counted_collective

    def counts(self) -> tuple[list[int], list[int], int, int, dict, tuple[list[list[int]], list[list[int]]]]:
        """(sends posted to each rank, receives posted from each rank, receives from any rank, ops never waited
        for, collectives posted on each group (matching.Posted), (sizes sent to, buffers posted from each rank))."""
        unwaited = sum(1 for p in self.pending.values() if not p[0].is_completed())
        unwaited += work_registry_size() if self.functional else 0
        return self.sent, self.received, self.any_source, unwaited, self.groups.posted(), (self.sizes_out,
                                                                                            self.sizes_in)

    def drain(self, *, within: float = DRAIN_TIMEOUT_S) -> str | None:
        """Wait up to `within` seconds for the ops the call never waited for (all matched); describe one that
        does not finish, or None."""
        self.ledger, self.board = None, None    # the call is over: its ledger no longer names what this rank does
        self.notary.call_ends()
        deadline = time.monotonic() + within
        for work, what, _ in list(self.pending.values()):   # (a wait takes its work out of pending)
            if work.is_completed():      # waited for by the call (a gloo work must be waited for only once)
                continue
            try:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except Exception as err:     # gloo raises on timeout
                return (f"left {what} unfinished {within:.1f} s after the call ended (do the tags of "
                        f"the send and the receive agree?): {str(err).splitlines()[0]}")
        self.pending = {}
        kept, self.functional = self.functional, []
        return wait_functional(kept, within=max(deadline - time.monotonic(), 0.001)) if kept else None
