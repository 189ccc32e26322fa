"""How a failed call is reported: one RankFailure naming the rank, what happened and where it was.

Also the warning a call gets when it changed rank state that cannot be put
back in place (its pool is then replaced).
"""
from __future__ import annotations

import contextlib
import signal
import time
from typing import Any

import psutil

from wmdist.comm import COMPLETED

EXIT_STATUS_WAIT_S = 5.0   # a dead rank's status comes through the forkserver, which a busy machine makes slow
AT_END_OF_CALL = "finished its function; waiting for its unfinished sends and receives"


class RankFailure(RuntimeError):
    """A rank raised, died, hung or left a message unmatched, or its result could not be read.

    `reason` is raised|exited|signal|timeout|start|unmatched|unpickle|closed.
    `last_comm` is the last communication the rank entered ('' if none).
    """

    def __init__(self, rank: int, reason: str, detail: str, last_comm: str | None = "", ranks: tuple[int, ...] = ()):
        self.rank, self.reason, self.detail, self.last_comm = rank, reason, detail, last_comm or ""
        self.ranks = ranks or (rank,)
        if last_comm is None:       # not about a communication in progress
            where = ""
        elif last_comm:
            where = f"\nlast communication entered by rank {rank}: {last_comm}"
        else:
            where = f"\nrank {rank} had not entered any communication"
        super().__init__(f"rank {rank} {detail}{where}")


class PoolRestartWarning(RuntimeWarning):
    """A call changed rank state that cannot be put back in place, so its pool was replaced."""


def signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(code).name
    return f"signal {code}"


# What gloo says when the rank at the other end of a connection is gone (killed, exited).
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused")


def lost_a_peer(failure: RankFailure) -> bool:
    """Whether a rank's error is gloo reporting that a peer went away: then that peer is the likelier cause."""
    return any(words in failure.detail for words in PEER_LOST)


def ended(pid: int, *, within: float = 1.0) -> bool:
    """Whether process `pid` has ended, or does within `within` seconds (its pipes close a moment before)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def exit_failure(rank: int, proc: Any, last_comm: str, *, server: int | None = None) -> RankFailure:
    """The failure of a rank whose process ended without replying (`server`: the forkserver that started it).

    A rank's exit status reaches us through the forkserver, so once the forkserver has ended
    (a call killed its parent process, say), multiprocessing reports 255 for any rank; and every
    rank dies with it, since a rank asks the kernel to end it when its parent ends.
    """
    proc.join(timeout=EXIT_STATUS_WAIT_S)
    code = proc.exitcode
    if code is not None and code < 0:
        return RankFailure(rank, "signal", f"was killed by {signal_name(-code)}", last_comm)
    if code == 255 and server is not None and ended(server):
        return RankFailure(rank, "exited", f"ended before replying, with the forkserver that started the ranks "
                                           f"(pid {server}), which has ended: every rank ends with it, and its exit "
                                           f"status is lost with it (did the call end its parent process, "
                                           f"os.getppid()?). The next call starts a new forkserver and pool",
                           last_comm)
    if code is None:        # the kernel saw it end; the forkserver had not passed its status on
        return RankFailure(rank, "exited", f"ended before replying (its exit status did not arrive within "
                                           f"{EXIT_STATUS_WAIT_S:g} s)", last_comm)
    return RankFailure(rank, "exited", f"exited with code {code} before replying", last_comm)


def start_failure(world_size: int, timeout: float) -> RankFailure:
    """The pool did not start within the call's timeout, before any rank was started."""
    return RankFailure(0, "start", f"did not start: {_slow_start(world_size, timeout)} (multiprocessing's "
                                   f"forkserver was still importing torch, before any rank could start)",
                       None, tuple(range(world_size)))


def _slow_start(world_size: int, timeout: float) -> str:
    return (f"the pool start took longer than the call's timeout of {timeout:g} s. A pool's first start imports "
            f"torch and joins {world_size} rank(s), which takes seconds, more on a busy machine; give the "
            f"first call a larger timeout (timeout=120, say): later calls reuse the warm pool")


def timeout_failure(pending: list[int], last_comms: list[str], *, start_timeout: float | None = None) -> RankFailure:
    """Name the likeliest culprit of a timeout: a pending rank that is not waiting inside a communication.

    `start_timeout` (seconds) when the ranks were still starting: the message then says so, and what to do.

    Ranks blocked in a collective (or finished and waiting for their transfers)
    are usually waiting for the one that is still computing (or stuck in user
    code), so that one is named first.
    """
    def waiting(r: int) -> bool:
        last = last_comms[r]
        return bool(last) and not last.endswith(COMPLETED)

    def line(r: int) -> str:
        last = last_comms[r]
        if last == AT_END_OF_CALL:
            return f"  rank {r}: {last}"
        if waiting(r):
            return f"  rank {r}: waiting in {last}"
        return f"  rank {r}: not in a communication (last: {last or 'none'})"

    culprit = next((r for r in pending if not waiting(r)), pending[0])
    lines = "; pending ranks:\n" + "\n".join(map(line, pending))
    if start_timeout is not None:
        return RankFailure(culprit, "start", f"did not finish starting: {_slow_start(len(last_comms), start_timeout)}"
                           + lines, last_comms[culprit], tuple(pending))
    return RankFailure(culprit, "timeout", "did not finish within the timeout" + lines + "\n" + _unknowable(
        culprit, waiting(culprit), last_comms[culprit]), last_comms[culprit], tuple(pending))


def _unknowable(culprit: int, waiting: bool, last: str) -> str:
    """Why the pool could not fail this call sooner (stuck.py finds what can be known while a call runs)."""
    if not waiting and last != AT_END_OF_CALL:
        return (f"(no mismatch could be known before the timeout: rank {culprit} was running its own code, "
                f"and could still have posted what the others wait for)")
    return ("(no mismatch could be known before the timeout: every pending rank waits in a communication, but not "
            "one the pool can rule unmatchable: a wait inside torch's C++ (DDP's reducer, a functional "
            "collective's wait_tensor), the making of a group, a group of ranks past 32 or a rank in more than "
            "8 groups, ops that the other side did post but a busy machine is slow to finish, or sizes or tags "
            "that do not match)")
