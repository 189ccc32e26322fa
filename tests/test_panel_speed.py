"""What keeps a control move fast, checked without timing anything (issue 35 §4).

- The text-caching canvas paints every panel view pixel for pixel as matplotlib's own canvas does.
- The prefetcher's worker gives up a half-drawn picture at its first checkpoint after a change, including
  the canvas's checkpoints while it paints, and keeps nothing of it.
- A built panel has taken the process's objects out of the collector's full passes.
- The benchmark reports CPU time per move beside wall time.
"""
from __future__ import annotations

import gc
import io
import math
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
from matplotlib.artist import Artist
from matplotlib.path import Path
from matplotlib.transforms import IdentityTransform
from PIL import Image

from wmdist.bench.panels import panel_factories, time_panel
from wmdist.base.knobs import knob
from wmdist.ui.panel import Panel, View
from wmdist.ui.fasttext import fast_figure
from wmdist.ui.prefetch import Prefetcher, steps
from wmdist.ui.render import axes_grid, canvas_figure, to_png

WAIT_S = 10.0         # generous bound on an Event wait: only a broken worker takes it


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)))


def test_the_text_caching_canvas_paints_every_panel_view_as_matplotlib_does():
    """Every view of every panel, at the opening setting and one step along its first two controls, drawn into a
    stock Agg figure and into the caching one (twice, so the second draw comes from the caches): equal pixels."""
    compared = 0
    for name, make in panel_factories().items():
        panel = make()
        panel.prefetch.cancel()
        panel.prefetch.idle()
        moves = [c for c in panel.controls.values() if not c.disabled and steps(c)][:2]
        for step in [None, *moves]:
            if step is not None:
                step.value = steps(step)[0]
                panel.prefetch.cancel()
                panel.prefetch.idle()
            if panel.result is None:
                continue
            for view in panel._views.values():
                stock, fast = canvas_figure(view.width, view.height), fast_figure(view.width, view.height)
                view.draw(stock, panel.config, panel.result)
                expected = _pixels(to_png(stock))
                for _ in range(2):
                    view.draw(fast, panel.config, panel.result)
                    assert np.array_equal(_pixels(to_png(fast)), expected), (name, view.name)
                    compared += 1
                cache = fast.canvas.text_cache
                assert not cache.broken and cache.hits > 0, (name, view.name)
        panel.prefetch.cancel()
        panel.prefetch.idle()
    assert compared >= 2 * 7 * 3


@pytest.mark.parametrize("angle", [0, 90, 33])
def test_cached_glyphs_land_where_matplotlib_puts_them_at_any_subpixel_offset(angle):
    """Texts at positions that differ in their 1/64 px fractions, rotated, not antialiased, and mathtext."""
    def draw(fig):
        ax = axes_grid(fig)[0]
        for k in range(24):
            ax.text(0.05 + k * 0.0371, 0.1 + k * 0.0329, f"F{k} rank {k % 7}", rotation=angle, fontsize=8 + k % 3)
        ax.text(0.5, 0.9, "no antialias 0123", antialiased=False)
        ax.set_title(r"$\alpha = 3$ ms")
        return _pixels(to_png(fig))
    fast = fast_figure(300, 200)
    expected = draw(canvas_figure(300, 200))
    assert np.array_equal(draw(fast), expected) and np.array_equal(draw(fast), expected)
    assert fast.canvas.text_cache.hits > 0 and not fast.canvas.text_cache.broken


def test_the_worker_gives_up_a_picture_at_its_first_checkpoint_after_a_change():
    p = Prefetcher()
    started, go, reached = threading.Event(), threading.Event(), []

    def job() -> bytes:
        started.set()
        assert go.wait(WAIT_S)
        p.checkpoint()                      # a change came meanwhile: this raises
        reached.append("past the checkpoint")
        return b"old"
    p.schedule([("a", job), ("b", lambda: b"B")])
    assert started.wait(WAIT_S)
    p.cancel()                              # what a move does first
    go.set()
    assert p.idle(timeout=WAIT_S)
    assert not reached and p.interrupted == 1 and p.get("a") is None and p.get("b") is None
    p.checkpoint()                          # off the worker it never raises
    p.schedule([("c", lambda: (p.checkpoint(), b"C")[1])])
    assert p.idle(timeout=WAIT_S) and p.get("c") == b"C" and p.interrupted == 1    # no change: drawn in full


class _Gate(Artist):
    """Painted first. On the prefetcher's worker (once): says so, then paints on only after a change came.

    It cannot wait for the test itself: matplotlib paints one figure at a time in a process (Figure._render_lock
    is shared by all figures), so the move's own painting waits for the worker to leave its picture."""

    def __init__(self, entered: threading.Event, prefetch: Prefetcher) -> None:
        super().__init__()
        self.entered, self.prefetch = entered, prefetch
        self.set_zorder(0.1)

    def draw(self, renderer) -> None:
        if threading.current_thread().name == "wmdist-prefetch" and not self.entered.is_set():
            drawing = self.prefetch._drawing
            self.entered.set()
            deadline = time.monotonic() + WAIT_S
            while self.prefetch.generation == drawing and time.monotonic() < deadline:
                time.sleep(0.001)


class _Witness(Artist):
    """Painted after the gate: records which thread got a path painted, for which generation of the prefetcher."""

    def __init__(self, painted: list[tuple[str, int]], prefetch: Prefetcher) -> None:
        super().__init__()
        self.painted, self.prefetch = painted, prefetch
        self.set_zorder(0.2)

    def draw(self, renderer) -> None:
        renderer.draw_path(renderer.new_gc(), Path([(1, 1), (20, 20)]), IdentityTransform())
        self.painted.append((threading.current_thread().name, self.prefetch._drawing))


class _Gated(Panel):
    """One field n, one view: a line to n, then the gate and the witness."""

    def __init__(self, entered: threading.Event, painted: list) -> None:
        self.gate = (entered, painted)

        @dataclass(frozen=True)
        class Cfg:
            n: int = knob(3, "n", low=0, high=10)
        super().__init__(Cfg())

    def views(self):
        def draw(fig, config, result):
            ax = axes_grid(fig)[0]
            for artist in list(ax.artists):
                artist.remove()
            ax.plot([0, result], [0, result])
            ax.add_artist(_Gate(self.gate[0], self.prefetch))
            ax.add_artist(_Witness(self.gate[1], self.prefetch))
        return [View("line", draw, width=200, height=120)]

    def compute(self, config):
        return config.n

    def describe(self, config, result):
        return f"n is {result}"


def test_a_move_stops_the_worker_inside_the_canvas_and_keeps_none_of_its_picture():
    """The worker is inside painting a neighbour when the learner moves: it paints nothing more of that picture
    (the canvas's checkpoint raises before the next path), caches nothing of it, and the move is answered;
    the new state's neighbours are drawn after."""
    entered, painted = threading.Event(), []
    panel = _Gated(entered, painted)         # drawn by the main thread; the worker draws n = 4 and 2 ahead
    assert entered.wait(WAIT_S)              # the worker is inside its first neighbour's picture
    old = panel.prefetch._drawing
    held = panel._key("line", panel.read_config(change={"n": 4}))     # that picture
    painted.clear()
    panel.controls["n"].value = 1            # the move
    assert panel.result == 1 and painted[-1][0] == "MainThread"
    assert panel.prefetch.idle(timeout=WAIT_S)
    assert ("wmdist-prefetch", old) not in painted, painted      # not one more path of the old picture
    assert panel.prefetch.interrupted == 1 and panel.prefetch.get(held) is None
    assert all(panel.prefetch.get(panel._key("line", panel.read_config(change={"n": n}))) for n in (2, 0))


def test_a_built_panel_leaves_the_collector_only_what_came_after():
    before = gc.get_freeze_count()
    panel = panel_factories()["05 bubble"]()
    frozen = gc.get_freeze_count()
    assert frozen > before
    for value in (16, 8, 16):
        panel.controls["microbatches"].value = value
    panel.prefetch.cancel()
    panel.prefetch.idle()
    assert len(gc.get_objects()) < frozen / 4    # a full pass walks what the moves made, not the process


def test_the_benchmark_reports_cpu_time_per_move_beside_wall_time():
    from wmdist.ring_attention.panel import TrafficPanel
    result = time_panel(TrafficPanel(), moves=2)
    for path in ("drawn", "served", "contended"):
        stats = result[path]
        for key in ("median_ms", "max_ms", "cpu_ms", "cpu_max_ms", "process_cpu_ms"):
            assert math.isfinite(stats[key]) and stats[key] > 0, (path, key, stats)
        assert stats["cpu_ms"] <= stats["cpu_max_ms"]
        assert stats["process_cpu_ms"] >= stats["cpu_ms"] - 0.1      # the process includes this thread; 0.1: rounding
    assert result["contended"]["given_up"] >= 0 and result["contended"]["moves"] == 2
    assert all("cpu_ms" in s for s in result["per_control"].values())


@pytest.mark.parametrize("setting", [dict(), dict(stages=8, microbatches=3, unequal=True),
                                     dict(schedule="interleaved", chunks=2, microbatches=4)])
def test_the_slot_diagram_draws_as_one_broken_barh_per_rank_and_kind(setting):
    """05's bars are one collection per kind; the picture is the one broken_barh per rank and kind gave."""
    from wmdist.pipeline.bubble import BubbleConfig, bubble_view
    from wmdist.pipeline.figures import COLORS, draw_slots
    from wmdist.pipeline.schedules import FORWARD
    view = bubble_view(BubbleConfig(**setting))
    merged, reference = canvas_figure(600, 320), canvas_figure(600, 320)
    draw_slots(merged, view)
    draw_slots(reference, view)
    ax = reference.axes[0]
    assert len(ax.collections) == 2
    for collection in list(ax.collections):
        collection.remove()
    for rank, timings in enumerate(view.sim.timings):     # zorder puts these under the tokens, as before
        for kind, color in ((FORWARD, COLORS["forward"]), ("B", COLORS["backward"])):
            bars = [(float(t.start), float(t.end - t.start)) for t in timings if t.action.kind == kind]
            ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=color, edgecolor="k", linewidth=0.3)
    ax.set_xlim(0, float(view.sim.makespan))
    ax.set_ylim(view.schedule.stages - 0.5, -0.5)
    assert np.array_equal(_pixels(to_png(merged)), _pixels(to_png(reference)))
