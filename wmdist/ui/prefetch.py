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
bumps the panel's generation; the worker stops at the next picture and
drops a picture it finished for an older generation. It lives only while it
has pictures to draw (at most MAX_AHEAD), and it is not a daemon: a daemon
thread stopped inside matplotlib's C++ code at interpreter exit aborts the
process ("terminate called without an active exception"), while this one is
simply waited for.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Callable

import ipywidgets as W

MAX_CACHED = 64          # PNGs kept per panel (a few MB at most)
MAX_AHEAD = 12           # pictures drawn ahead after one change


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

    def idle(self, *, timeout: float = 10.0) -> bool:
        """Wait until nothing is being drawn ahead (tests and benchmarks); False if still busy after `timeout`."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._thread is None

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                key, render = self._jobs.pop(0)
                generation = self.generation
            try:
                png = render()
            except Exception:            # a neighbour the model refuses: the learner gets the error when there
                continue
            with self._lock:
                if generation == self.generation:
                    self._cache[key] = png
                    while len(self._cache) > MAX_CACHED:
                        self._cache.popitem(last=False)
