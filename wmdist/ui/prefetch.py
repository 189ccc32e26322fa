"""Draw the states one control step away before the learner asks for them.

matplotlib needs 40-70 ms to draw and encode even one small axes, and the
browser round trip adds 30-50 ms: a slider answering in under 100 ms needs
its next picture ready. While the kernel is idle after a change, a worker
thread draws the views one step away on each control (the last moved control
first, in the direction it moved) into figures of its own, and keeps their
PNGs. A move that lands on one of them costs only the pure model and the
message; any other move draws as before. Nothing is approximated: a cached
picture is the same function of the same config, drawn the same way.

The worker never touches a widget. Any new change, a run or a view switch
bumps the panel's generation; the worker drops a picture it finished for an
older generation. It must also get out of the way of the move being
answered: with one interpreter lock, a worker still drawing the old
neighbours takes turns with the main thread and doubled a move's time. So a
render calls `checkpoint()` between its steps and the canvas calls it before
each thing it paints (wmdist.ui.fasttext); after a cancel the next call
raises `Superseded`, within about a millisecond of the worker's next turn,
and the worker ends. It starts drawing START_DELAY_S after the change, so the
kernel sends the answer of the move (on its IOPub thread) without it. It
lives only while it has pictures to draw (at most MAX_AHEAD), and it is not
a daemon: a daemon thread stopped inside matplotlib's C++ code at
interpreter exit aborts the process ("terminate called without an active
exception"), while this one is simply waited for.
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import ipywidgets as W

MAX_CACHED = 64          # PNGs kept per panel (a few MB at most)
MAX_AHEAD = 12           # pictures drawn ahead after one change
START_DELAY_S = 0.015    # the worker's wait before its first picture: the kernel sends the move's answer first


class Superseded(Exception):
    """Raised in the worker by `Prefetcher.checkpoint()` once the picture it draws is for an old state."""


def steps(control: W.ValueWidget) -> list[Any]:
    """The values one step away from `control`'s value, [next, previous], as the control would yield them."""
    v = control.value
    if isinstance(control, W.Checkbox):
        return [not v]
    if isinstance(control, (W.SelectionSlider, W.Dropdown)):
        values = [o[1] if isinstance(o, tuple) else o for o in control.options]
        if v not in values:
            return []
        i = values.index(v)
        return [values[j] for j in (i + 1, i - 1) if 0 <= j < len(values)]
    if isinstance(control, W.FloatLogSlider):       # as the browser computes it: base^(exponent +- step)
        exponent = math.log(v) / math.log(control.base)
        return [control.base ** e for e in (exponent + control.step, exponent - control.step)
                if control.min <= e <= control.max]
    if isinstance(control, (W.IntSlider, W.FloatSlider)):
        return [x for x in (v + control.step, v - control.step) if control.min <= x <= control.max]
    return []                                   # typed numbers: no next value to guess


def candidates(controls: dict[str, W.ValueWidget], last: str | None, *, forward: bool) -> list[tuple[str, Any]]:
    """(control name, value) one step away, most likely first: the last moved control in its direction."""
    order = [n for n in ([last] if last in controls else []) + [n for n in controls if n != last]
             if not controls[n].disabled]
    out = []
    for name in order:
        values = steps(controls[name])
        if name == last and not forward:
            values.reverse()
        out += [(name, v) for v in values]
    return out[:MAX_AHEAD]


class Prefetcher:
    """A cache of PNGs by key, filled by one worker thread (not a daemon, see above); `render(key)` runs on it."""

    def __init__(self) -> None:
        self.generation = 0
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._jobs: list[tuple[str, Callable[[], bytes]]] = []
        self._thread: threading.Thread | None = None
        self._drawing = -1                 # the generation of the picture the worker draws now
        self.interrupted = 0               # pictures abandoned half drawn (for tests and the benchmark)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            png = self._cache.get(key)
            if png is not None:
                self._cache.move_to_end(key)
            return png

    def cancel(self, *, clear: bool = False) -> None:
        """A new state: stop drawing ahead for the old one (and forget every picture, when they are stale)."""
        with self._lock:
            self.generation += 1
            self._jobs = []
            if clear:
                self._cache.clear()

    def schedule(self, jobs: list[tuple[str, Callable[[], bytes]]]) -> None:
        """Draw these (key, render) pictures ahead, in order, unless already cached."""
        with self._lock:
            self._jobs = [(k, f) for k, f in jobs if k not in self._cache]
            if self._jobs and self._thread is None:
                self._thread = threading.Thread(target=self._work, name="wmdist-prefetch", daemon=False)
                self._thread.start()

    def checkpoint(self) -> None:
        """In the worker, between steps of a picture: raise Superseded if a change came since it began."""
        if self._drawing != self.generation and threading.current_thread() is self._thread:
            raise Superseded

    def idle(self, *, timeout: float = 10.0) -> bool:
        """Wait until nothing is being drawn ahead (tests and benchmarks); False if still busy after `timeout`."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._thread is None

    def _work(self) -> None:
        time.sleep(START_DELAY_S)
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                key, render = self._jobs.pop(0)
                generation = self._drawing = self.generation
            try:
                png = render()
            except Superseded:
                self.interrupted += 1
                continue
            except Exception:            # a neighbour the model refuses: the learner gets the error when there
                continue
            with self._lock:
                if generation == self.generation:
                    self._cache[key] = png
                    while len(self._cache) > MAX_CACHED:
                        self._cache.popitem(last=False)


def stable(value: Any) -> Any:
    """A float rounded to 12 significant digits (anything else as it is), for cache keys."""
    return float(f"{value:.12g}") if isinstance(value, float) else value
