"""How a failed call is reported: one RankFailure naming the rank, what happened and where it was.

Also the warning a call gets when it changed rank state that cannot be put
back in place (its pool is then replaced).
"""
from __future__ import annotations

import contextlib
import signal
from typing import Any

from wmdist.comm import COMPLETED

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


def exit_failure(rank: int, proc: Any, last_comm: str) -> RankFailure:
    """The failure of a rank whose process ended without replying."""
    proc.join(timeout=1.0)
    code = proc.exitcode
    if code is not None and code < 0:
        return RankFailure(rank, "signal", f"was killed by {signal_name(-code)}", last_comm)
    return RankFailure(rank, "exited", f"exited with code {code} before replying", last_comm)


def timeout_failure(pending: list[int], last_comms: list[str], *, starting: bool) -> RankFailure:
    """Name the likeliest culprit of a timeout: a pending rank that is not waiting inside a communication.

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
    what = "did not finish starting" if starting else "did not finish"
    return RankFailure(culprit, "start" if starting else "timeout",
                       f"{what} within the timeout; pending ranks:\n" + "\n".join(map(line, pending)),
                       last_comms[culprit], tuple(pending))
