"""The rounds of the hand-written ring, pipelined: receives wait before their messages are sent,
the two phases overlap, and a segment can travel as pieces.

A ring phase has N-1 rounds; in round s a rank sends one segment (G/N) right and receives one from
the left. Receives are posted before the left neighbour can send (gloo's TCP transport sends a
message only once its receive is posted; a late receive costs a round trip and two wake-ups), two
rounds ahead in both phases: in the all-gather straight into the output, in the reduce-scatter into
two halves of the rank's reusable receive buffer (ctx.scratch), so the next round's segment arrives
while this one is added. On a quiet 2-core machine (16 MiB on 4 ranks, paired ratios to gloo,
medians of 41 pairs, seven runs each) two rounds ahead gave 0.92-1.00x (median 0.955x) where
posting every all-gather receive at once gave 0.87-0.97x (median 0.90x); the earlier choice of all
at once had been measured at load 15-23, where it came out ahead.

What separates this ring from gloo's own all_reduce on such a machine is not its rounds but what each
message costs in Python: with the pool's message audit (runtime/messages.py: every send, receive and
wait counted and put on the board, so that a mismatch fails at once) it reached 0.90-0.95x gloo, and
the same rounds with the audit switched off 0.98-1.00x, as did a bare isend/irecv ring (16 MiB, 4
ranks sharing 2 cores, each variant as often first as last; about 25 us of CPU per message, paid by
four ranks on two cores).

With `chunk_elems` a segment is also cut into C pieces (`costs.ring_pieces`, torch.tensor_split's
layout, the same on the sender and the receiver): piece c is added while piece c+1 is still
arriving, and sent on to the right (the next round's piece c) before piece c+1 is added. Each
message costs CPU, though, and the default does not cut (costs.DEFAULT_RING_CHUNK_BYTES says why).

Bytes do not change: every piece of a segment is sent once, so the ledger still holds exactly
`costs.ring_allreduce_bytes`. Each round is still one ledger record (its segment's bytes), with
`messages` = the pieces it sent (`costs.ring_allreduce_messages`). A record's sends may have been
posted during the round before it: that is the overlap. Elementwise, every entry is still summed in
the same order (ring order, from the rank after its owner), so pieces change no bit of the result.

Messages between two ranks on one tag are matched in the order they were posted (gloo keeps a
queue per peer and tag), which is what lets several receives from the left wait at once. The two
phases use two tags, so an all-reduce can post its all-gather's first receives before its
reduce-scatter begins, and send each piece of its finished chunk on the moment it is summed: the
phases overlap too. (No message of the all-gather can land early: a chunk arrives only once its
sum is complete, and that sum needed this rank's last send of it.)
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist

from wmdist import costs
from wmdist.comm.context import Context
from wmdist.comm.ledger import counted
from wmdist.comm.p2p import global_rank, nbytes


def pieces(segment: torch.Tensor, chunk_elems: int | None) -> list[torch.Tensor]:
    """The views a 1-D segment is sent as: costs.ring_pieces(numel, chunk_elems) of them."""
    return list(torch.tensor_split(segment, costs.collectives.ring_pieces(segment.numel(), chunk_elems)))


REDUCE_SCATTER_TAG, ALL_GATHER_TAG = 0, 1     # one matching queue per phase (see the module docstring)


class _Ring:
    """One rank's place in a ring for one phase: its neighbours, its tag, and the sends still in flight."""

    def __init__(self, ctx: Context, rank: int, n: int, phase: str, group: dist.ProcessGroup | None, tag: int):
        self.ctx, self.phase, self.group, self.tag = ctx, phase, group, tag
        self.right, self.left = (rank + 1) % n, (rank - 1) % n
        self.sends: list = []

    def recv(self, piece: torch.Tensor) -> tuple[object, torch.Tensor]:
        """Post a receive of the left neighbour's next piece into `piece`: (its work, the piece)."""
        return dist.irecv(piece, global_rank(self.group, self.left), group=self.group, tag=self.tag), piece

    def send(self, piece: torch.Tensor) -> None:
        """Post a send of `piece` to the right neighbour, without waiting for it."""
        self.sends.append(dist.isend(piece, global_rank(self.group, self.right), group=self.group, tag=self.tag))

    @contextlib.contextmanager
    def round(self, out: torch.Tensor, incoming: torch.Tensor, messages: int) -> Iterator[None]:
        """One counted round: segment `out` went right (as `messages` pieces), `incoming` came from the left."""
        with counted(self.ctx, "ring round", self.phase, sent=nbytes(out), recv=nbytes(incoming), kind="p2p",
                     peer=self.right, src=self.left, messages=messages):
            yield

    def finish(self) -> None:
        """Wait until every piece this rank sent has left."""
        self.ctx.ledger.enter(f"wait for {len(self.sends)} ring send(s) [phase {self.phase!r}]")
        for work in self.sends:
            work.wait()
        self.ctx.ledger.leave()


class AllGather:
    """A ring all-gather of `segments` in place: posted receives first (`__init__`), then `run`.

    Made before a reduce-scatter, it has its first two rounds' receives waiting while the sums
    are built, and `send_own` lets the reduce-scatter send each piece of this rank's finished
    segment as soon as it is summed (round 0's sends).
    """
    AHEAD_ROUNDS = 2    # rounds whose receives wait posted (the module docstring's measurement)

    def __init__(self, ctx: Context, segments: list[torch.Tensor], rank: int, n: int, phase: str,
                 group: dist.ProcessGroup | None, chunk_elems: int | None):
        self.segments, self.rank, self.n = segments, rank, n
        self.ring = _Ring(ctx, rank, n, phase, group, ALL_GATHER_TAG)
        self.parts = [pieces(seg, chunk_elems) for seg in segments]
        self.ahead = self.AHEAD_ROUNDS
        self.pending = {s: self._post(s) for s in range(min(self.ahead, n - 1))}

    def _got(self, s: int) -> int:
        """The segment received in round s (and sent on in round s+1)."""
        return (self.rank - s - 1) % self.n

    def _post(self, s: int) -> list[tuple[object, torch.Tensor]]:
        return [self.ring.recv(p) for p in self.parts[self._got(s)]]

    def send_own(self, piece: torch.Tensor) -> None:
        """Round 0: send one piece of this rank's own segment right."""
        self.ring.send(piece)

    def run(self, *, own_sent: bool = False) -> None:
        """The N-1 rounds; round 0's pieces are sent here unless `send_own` already sent them all."""
        n, ring = self.n, self.ring
        if n == 1:
            return
        if not own_sent:
            for piece in self.parts[self.rank]:
                ring.send(piece)
        for s in range(n - 1):
            with ring.round(self.segments[(self.rank - s) % n], self.segments[self._got(s)],
                            len(self.parts[(self.rank - s) % n])):
                for work, landed in self.pending.pop(s):
                    work.wait()
                    if s + 1 < n - 1:
                        ring.send(landed)
            if s + self.ahead < n - 1:
                self.pending[s + self.ahead] = self._post(s + self.ahead)     # straight into place
        ring.finish()


def reduce_scatter_rounds(ctx: Context, segments: list[torch.Tensor], rank: int, n: int, phase: str,
                          group: dist.ProcessGroup | None, chunk_elems: int | None, *,
                          then: AllGather | None = None) -> None:
    """Sum the N segments around the ring in place; afterwards segments[rank] holds the full sum.

    Round s sends partial segment (r-s-1) right and receives segment (r-s-2) from the left, adding
    each piece as it lands and sending it straight on (it is round s+1's outgoing piece). In the
    last round the landed pieces complete segment r: with `then`, each goes on as `then`'s round 0.
    """
    if n == 1:
        return
    ring = _Ring(ctx, rank, n, phase, group, REDUCE_SCATTER_TAG)
    sent = lambda s: (rank - s - 1) % n                    # noqa: E731 - the segment sent in round s
    parts = [pieces(seg, chunk_elems) for seg in segments]
    width = max(seg.numel() for seg in segments)
    scratch = ctx.scratch(2 * width, dtype=segments[0].dtype)

    def post(s: int) -> list[tuple[object, torch.Tensor]]:
        """Receive round s's pieces into half s % 2 of the scratch, cut as the sender cuts them."""
        slot = scratch[(s % 2) * width:][: segments[sent(s + 1)].numel()]
        return [ring.recv(p) for p in pieces(slot, chunk_elems)]

    pending = {s: post(s) for s in range(min(2, n - 1))}
    for piece in parts[sent(0)]:                           # round 0 sends this rank's own input
        ring.send(piece)
    for s in range(n - 1):
        onward = ring.send if s + 1 < n - 1 else then.send_own if then is not None else None
        with ring.round(segments[sent(s)], segments[sent(s + 1)], len(parts[sent(s)])):
            for (work, landed), mine in zip(pending.pop(s), parts[sent(s + 1)]):
                work.wait()
                mine += landed
                if onward is not None:
                    onward(mine)
        if s + 2 < n - 1:
            pending[s + 2] = post(s + 2)                   # round s's half of the scratch is free again
    ring.finish()
