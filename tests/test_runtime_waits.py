"""Waits in a rank: the notary writes "blocked" only for a wait that lasts and never leaves it written after
the wait ends; a waited-for message is no longer held by the audit."""
from __future__ import annotations

import os
import time

import psutil
import torch
import torch.distributed as dist

from wmdist import run
from wmdist.runtime.notary import TICK_S, Notary


class Board:
    """Counts what the notary wrote and took back; `blocked` is what a reader of the board would see."""

    def __init__(self) -> None:
        self.writes = self.unwrites = 0

    def write(self) -> None:
        self.writes += 1

    def unwrite(self) -> None:
        self.unwrites += 1

    @property
    def blocked(self) -> bool:
        return self.writes > self.unwrites


def wait_until(condition, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.005)
    return condition()


def test_a_wait_that_lasts_is_written_once_and_taken_back_when_it_ends():
    notary, board = Notary(), Board()
    notary.call_begins()
    notary.waiting(board.write, board.unwrite)
    assert wait_until(lambda: board.blocked), "a wait of seconds was never written on the board"
    time.sleep(4 * TICK_S)
    assert board.writes == 1                       # written once, not at every look
    notary.done()
    assert (board.writes, board.unwrites) == (1, 1) and not board.blocked
    notary.call_ends()


def test_waits_shorter_than_a_tick_are_never_written():
    """Two looks are at least a tick apart, so no wait of 0.3 ticks is seen twice (a notary that wrote on its
    first look would write about every other one of these)."""
    notary, board = Notary(), Board()
    notary.call_begins()
    for _ in range(30):
        notary.waiting(board.write, board.unwrite)
        time.sleep(0.3 * TICK_S)
        notary.done()
        time.sleep(0.3 * TICK_S)
    assert board.writes == 0, board.writes
    notary.call_ends()


def test_waits_of_about_a_tick_never_leave_the_board_saying_blocked():
    """The thread may write just as a wait ends; done() takes the lock, so it takes that write back."""
    notary, board = Notary(), Board()
    notary.call_begins()
    for i in range(400):                           # at least 40 waits, and on until some were written
        if i >= 40 and board.writes > 0:
            break
        notary.waiting(board.write, board.unwrite)
        time.sleep(TICK_S * (0.5 + (i % 5) * 0.6))
        notary.done()
        assert not board.blocked, f"wait {i}: the board still says blocked after the wait ended"
    assert board.writes > 0, "no wait of up to 2.9 ticks was ever written: the race was not exercised"
    notary.call_ends()


def test_between_calls_the_notary_writes_nothing():
    notary, board = Notary(), Board()
    notary.call_begins()
    notary.call_ends()
    time.sleep(2 * TICK_S)                         # the thread is past its last look of the call
    notary.waiting(board.write, board.unwrite)     # (no wait is noted between calls; this one must not show)
    time.sleep(4 * TICK_S)
    assert board.writes == 0
    notary.done()


MIB_FLOATS = 2 ** 18


def exchange_fresh_buffers(ctx, rounds: int) -> float:
    """`rounds` isend/irecv pairs of a fresh 1 MiB buffer each, every one waited for; the growth of this rank's
    resident memory in MiB. Nothing the rank keeps needs more than two such buffers at once."""
    peer = 1 - ctx.rank
    torch.empty(4 * MIB_FLOATS).fill_(1.0)          # the allocator's first growth, before the baseline
    start = psutil.Process(os.getpid()).memory_info().rss
    for i in range(rounds):
        out, into = torch.full((MIB_FLOATS,), float(i)), torch.empty(MIB_FLOATS)
        sent, got = dist.isend(out, peer), dist.irecv(into, peer)
        sent.wait()
        got.wait()
        assert into[0].item() == i
    return (psutil.Process(os.getpid()).memory_info().rss - start) / 2 ** 20


def test_a_waited_message_does_not_keep_its_buffer_alive():
    """The audit once kept every message's Work (and so its tensor) until 64 had piled up: 60 rounds of
    1 MiB buffers held about 60 MiB per rank. Waited for, a Work is let go, so the buffers are reused."""
    growth = run(exchange_fresh_buffers, 2, 60)
    assert max(growth) < 20, f"resident memory grew by {growth} MiB over 60 waited 1 MiB exchanges"
