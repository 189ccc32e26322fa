"""Writing "this rank is blocked" on its board only for a wait that lasts, from a thread of its own.

The pool's deadlock verdict (stuck.py) needs each blocked rank's board to say what it waits for and its
counts at that moment. Writing that before every wait cost more than the wait itself in a ring all-reduce:
gloo's `is_completed()` is False for every send and receive until it is waited for, so every wait looked as
if it would block, and the board was written twice (blocked, then unblocked) around each of them. Measured
on 4 ranks of a 2-core machine, 16 MiB: the hand ring reached 0.82-0.86x gloo's all_reduce with those
writes, 0.91-0.93x without them.

So a wait only says that it starts (`waiting`: one attribute and an uncontended lock) and that it ended
(`done`). A daemon thread looks every TICK_S while a call runs; a wait it finds twice in a row (so one that
has lasted at least TICK_S) it writes on the board. The parent reads boards every 0.2 s and gives a
deadlock verdict only on boards unchanged between two reads, so a real deadlock is still found within
about half a second; a wait that ends first is never written.

The lock makes the two sides exclusive: the thread writes only while the same wait is still on, and the
waiting thread, once woken, takes the lock before it clears the wait and the board. So the board never says
"blocked" about a wait that has ended, and the counts it writes are the ones the rank blocked with (a rank
posts nothing while it waits).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

TICK_S = 0.05        # how often the thread looks at a call's current wait


class Notary:
    """One rank's "blocked" writer: `waiting(write)` before a wait, `done()` after it, `call_begins/ends`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_call = threading.Event()
        self._wait: tuple[int, Callable[[], None]] | None = None   # (number of the wait, its board write)
        self._number = 0
        self._unwrite: Callable[[], None] | None = None           # how to take back the current wait's write
        self._written: Callable[[], None] | None = None            # set once the thread wrote: that take-back
        self._thread: threading.Thread | None = None

    def call_begins(self) -> None:
        """A call starts: look at its waits (the thread, started once per process, sleeps between calls)."""
        if self._thread is None or not self._thread.is_alive():    # (not alive: this is a forked child)
            self._thread = threading.Thread(target=self._watch, name="wmdist-blocked-notary", daemon=True)
            self._thread.start()
        self._in_call.set()

    def call_ends(self) -> None:
        self._in_call.clear()

    def waiting(self, write: Callable[[], None], unwrite: Callable[[], None]) -> None:
        """A wait starts; `write()` puts it on the board if it lasts, `unwrite()` takes it back."""
        with self._lock:
            self._number += 1
            self._wait = (self._number, write)
            self._unwrite = unwrite

    def done(self) -> None:
        """The wait ended (returned or raised): nothing on the board says it goes on."""
        with self._lock:
            self._wait = None
            if self._written is not None:
                self._written()
                self._written = None

    def _watch(self) -> None:
        seen = None
        while True:
            self._in_call.wait()
            time.sleep(TICK_S)
            current = self._wait
            if current is None or current[0] != seen:
                seen = None if current is None else current[0]
                continue
            with self._lock:
                if self._wait is current and self._written is None:
                    current[1]()
                    self._written = self._unwrite
