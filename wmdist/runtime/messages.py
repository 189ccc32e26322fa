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
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

DRAIN_TIMEOUT_S = 30.0    # matched transfers finish in milliseconds; only disagreeing tags take this long


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
    """Counts this rank's posted point-to-point ops during one call and checks them at its end."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.begin()

    def begin(self) -> None:
        """Start a call with no messages counted."""
        self.sent = [0] * self.world_size
        self.received = [0] * self.world_size
        self.any_source = 0
        self.pending: list[tuple[Any, str]] = []     # (Work, description) not yet completed

    def posted(self, kind: str, group: Any, peer: int | None, tag: int, work: Any) -> None:
        """Count one posted op (`peer` is a group rank; None: a receive from any rank)."""
        if peer is None:
            self.any_source += 1
            where = "any rank"
        else:
            try:
                peer = dist.get_global_rank(group, peer)
            except (ValueError, RuntimeError):
                return    # a group torch does not know the ranks of: cannot be attributed
            (self.sent if kind == "send" else self.received)[peer] += 1
            where = f"rank {peer}"
        if work is not None and not work.is_completed():
            if len(self.pending) >= 64:
                self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
            self.pending.append((work, f"its {kind} {'to' if kind == 'send' else 'from'} {where} (tag {tag})"))

    def install(self) -> MessageAudit:
        """Count every send/recv posted in this process from now on (call once per rank process)."""
        cls = dist.ProcessGroup
        send, recv, recv_any = cls.send, cls.recv, cls.recv_anysource
        audit = self

        def counted_send(group: Any, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
            work = send(group, tensors, dst, tag)
            audit.posted("send", group, dst, tag, work)
            return work

        def counted_recv(group: Any, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
            work = recv(group, tensors, src, tag)
            audit.posted("receive", group, src, tag, work)
            return work

        def counted_recv_any(group: Any, tensors: list[torch.Tensor], tag: int = 0) -> Any:
            work = recv_any(group, tensors, tag)
            audit.posted("receive", group, None, tag, work)
            return work

        cls.send, cls.recv, cls.recv_anysource = counted_send, counted_recv, counted_recv_any
        return self

    def counts(self) -> tuple[list[int], list[int], int, int]:
        """(sends posted to each rank, receives posted from each rank, receives from any rank, ops never waited for)."""
        unwaited = sum(1 for work, _ in self.pending if not work.is_completed())
        return self.sent, self.received, self.any_source, unwaited

    def drain(self) -> str | None:
        """Wait for the ops the call never waited for (all matched); describe one that does not finish, or None."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for work, what in self.pending:
            if work.is_completed():      # waited for by the call (a gloo work must be waited for only once)
                continue
            try:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except Exception as err:     # gloo raises on timeout
                return (f"left {what} unfinished {DRAIN_TIMEOUT_S:.0f} s after the call ended (do the tags of "
                        f"the send and the receive agree?): {str(err).splitlines()[0]}")
        self.pending = []
        return None
