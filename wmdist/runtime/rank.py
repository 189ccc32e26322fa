"""The rank side of the pool: join the gloo group, then serve calls until told to close.

Every call runs with a fresh Context and Ledger; afterwards the rank puts back
the process-wide settings the call changed (isolation.py) and reports with its
result how many point-to-point messages it posted to and from each rank, and
the collectives it posted on each group (messages.py), so the parent can check
they all matched; a plain dist.new_group is answered from the rank's cached
groups (groups.py). A rank may start processes of its own (a DataLoader's
workers): they end with the call, and a process the call forked never
answers for the rank (children.py). The next call starts as the first one
did. A rank's printed lines reach the parent's terminal or notebook whole,
prefixed with its rank.
"""
from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import sys
import threading
import traceback
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from wmdist.comm import Context, Ledger
from wmdist.runtime.children import allow_children, die_with_parent, end_children, main_names
from wmdist.runtime.cleanup import heap_trimmer
from wmdist.runtime.failures import AT_END_OF_CALL
from wmdist.runtime.groups import groups_lost, route_new_group
from wmdist.runtime.isolation import RankState
from wmdist.runtime.messages import MessageAudit
from wmdist.runtime.resources import RankResources
from wmdist.runtime.stuck import PostBoard

STATUS_BYTES = 512             # shared buffer per rank: the last communication entered


class RankStream(io.TextIOBase):
    """sys.stdout/sys.stderr of a rank: whole lines, each prefixed "[rank r] " and written at once.

    Ranks share the parent's terminal or notebook; a single os.write of a whole
    line (below the pipe's atomic size) keeps lines from different ranks from
    mixing mid-line. A partial line waits for its newline or the end of the call.
    """

    def __init__(self, rank: int, fd: int):
        super().__init__()
        self._prefix, self._fd, self._partial = f"[rank {rank}] ", fd, ""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    @property
    def encoding(self) -> str:
        return "utf-8"

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            self._emit("".join(f"{self._prefix}{line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        """Keep a partial line until its newline (progress bars overwrite with \\r); see end_call."""

    def end_call(self) -> None:
        """Write out a partial line left at the end of a call."""
        if self._partial:
            self._partial, text = "", self._partial
            self._emit(f"{self._prefix}{text}\n")

    def _emit(self, text: str) -> None:
        with contextlib.suppress(OSError):      # a closed terminal must not fail the call
            data = text.encode("utf-8", "replace")
            while data:
                data = data[os.write(self._fd, data):]


def _die_with(owner: int) -> None:
    """End this rank as soon as its parent (the forkserver) or the pool's owner process has ended.

    A rank's parent is multiprocessing's forkserver, which stays alive while any
    rank holds its "alive" pipe, so PR_SET_PDEATHSIG alone never fires when the
    owner dies while a rank is not reading its pipe (in a collective, or still
    starting). A daemon thread waits on a pidfd of the owner for that case.
    """
    die_with_parent()
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        return                     # no pidfd here (not Linux >= 5.3): the pipe's EOF still ends idle ranks

    def watch() -> None:
        select.select([pidfd], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="wmdist-owner-watch", daemon=True).start()


def _reply(conn: Any, *message: Any) -> None:
    conn.send_bytes(cloudpickle.dumps(message))


def worker_main(rank: int, world_size: int, store_path: str, conn: Any, status: Any, posts: Any,
                group_timeout_s: float, owner: int) -> None:
    """Rank process: join the group, then serve calls until told to close.

    Replies: ("ready", pid); ("ok", what could not be put back, message
    counts, result); ("error", traceback, last communication); ("drained",
    problem or None) after b"drain <seconds>". Ends with os._exit: with torch 2.13 on
    CPU, interpreter teardown after destroy_process_group() can SIGABRT now
    and then, which would look like a failure although the work finished.
    """
    _die_with(owner)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent handles Ctrl-C by killing us
    torch.set_num_threads(1)
    me = os.getpid()       # a process forked by the rank function returns into this loop too: it never answers

    def publish(text: str) -> None:
        status.value = text.encode()[: STATUS_BYTES - 1]

    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=group_timeout_s))
        streams = [RankStream(rank, 1), RankStream(rank, 2)]
        sys.stdout, sys.stderr = streams
        audit = MessageAudit(rank, world_size).install()
        allow_children()
        baseline = RankState.capture()
        _reply(conn, "ready", os.getpid())
    except BaseException:
        _reply(conn, "error", traceback.format_exc(), "")
        os._exit(1)
    # Process groups and buffers: kept across calls, never demo state; its groups time out with the world's.
    resources = RankResources(timeout=timedelta(seconds=group_timeout_s))
    route_new_group(resources, world_size, lambda: audit.ledger)
    board, calls = PostBoard(posts), 0          # what this rank last posted, for the parent (stuck.py)
    give_back = heap_trimmer()      # after each call: a kept pool holds what its ranks keep (Binder's 2 GiB)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        if message == b"close":
            os._exit(0)
        if message.startswith(b"drain "):   # the parent found every message matched: let the unwaited ones finish
            publish(AT_END_OF_CALL)
            _reply(conn, "drained", audit.drain(within=float(message[6:])))
            continue
        ledger = Ledger(rank=rank, on_enter=publish)
        publish("")
        calls += 1
        board.begin(calls)
        audit.begin(ledger=ledger, board=board)
        try:
            fn, args, kwargs = cloudpickle.loads(message)
            with main_names(fn):
                result = fn(Context(rank=rank, world_size=world_size, ledger=ledger, resources=resources), *args, **kwargs)
            _only_the_rank(me)
            _end_lines(streams)
            end_children()
            reply = cloudpickle.dumps(("ok", baseline.restore() + groups_lost(resources), audit.counts(), result))
        except BaseException:
            _only_the_rank(me)
            _end_lines(streams)
            end_children()
            reply = cloudpickle.dumps(("error", traceback.format_exc(), ledger.last_status()))
        audit.notary.call_ends()         # its thread sleeps until the next call
        conn.send_bytes(reply)           # after an error the parent tears the pool down
        message = reply = fn = args = kwargs = result = None     # the call's objects go before the trim
        give_back()


def _only_the_rank(me: int) -> None:
    """End a process the rank function forked (os.fork) as it returns: only the rank answers its pipe."""
    if os.getpid() != me:
        os._exit(0)


def _end_lines(streams: list[RankStream]) -> None:
    for stream in streams:
        stream.end_call()
