"""Figures for chapter 05: pure functions of a BubbleView and of measured runs; no widgets, no display.

The ideal slot diagram draws all ranks' bars as one collection per kind
(the rows never overlap, so the picture is that of a broken_barh per rank
and kind, with 2 collections instead of 2P); measured timelines go through
wmdist.ui.timeline_figure, the course's one Gantt chart for real spans.
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from wmdist.costs import pipeline as pcosts
from wmdist.pipeline.bubble import BubbleView
from wmdist.pipeline.results import ImbalanceCurve, MeasuredBubble
from wmdist.pipeline.schedules import FORWARD, format_token
from wmdist.base.spans import Span
from wmdist.ui.render import DPI, FONT, SMALL, axes_grid, integer_axis, log2_axis
from wmdist.ui.timeline import timeline_figure, timelines_figure

COLORS = {"forward": "tab:green", "backward": "tab:purple"}
MAX_LABELLED = 24          # actions per rank up to which bars carry their token
TOKEN = 8                              # points: 11 px on screen
CHAR_PX = 0.6 * TOKEN * DPI / 72       # width of one token character (DejaVu Sans F, B and digits), in pixels


def slot_axes(ax: plt.Axes, view: BubbleView, *, end: float | None = None) -> None:
    """The ideal slot diagram: one row per rank, forwards green, backwards purple, gaps are the bubble.

    A bar carries its token (F3, B0, F3.1) when the token fits inside it on screen.
    """
    sim, schedule = view.sim, view.schedule
    with_stage = schedule.chunks > 1
    end = float(sim.makespan) if end is None else end
    px_per_slot = ax.get_position().width * ax.figure.get_figwidth() * DPI / end
    for kind, color in ((FORWARD, COLORS["forward"]), ("B", COLORS["backward"])):    # rows never overlap: one
        spans = [(float(t.start), float(t.start) + float(t.end - t.start), rank)    # x0, x0 + dx as broken_barh
                 for rank, timings in enumerate(sim.timings) for t in timings if t.action.kind == kind]
        bars = [[(x0, r - 0.4), (x0, r - 0.4 + 0.8), (x1, r - 0.4 + 0.8), (x1, r - 0.4)] for x0, x1, r in spans]
        ax.add_collection(PolyCollection(np.array(bars, dtype=float).reshape(-1, 4, 2), facecolors=color,
                                         edgecolor="k", linewidth=0.3))       # collection per kind, as broken_barh
    for rank, timings in enumerate(sim.timings):
        if len(timings) <= MAX_LABELLED:
            for t in timings:
                token = format_token(t.action, with_stage=with_stage)
                if float(t.end - t.start) * px_per_slot >= CHAR_PX * len(token) + 1:
                    ax.text(float(t.start + t.end) / 2, rank, token, ha="center", va="center", fontsize=TOKEN,
                            color="white")
    ax.set_yticks(range(schedule.stages), [f"rank {r}" for r in range(schedule.stages)])
    ax.set_ylim(schedule.stages - 0.5, -0.5)
    ax.set_xlim(0, end)
    integer_axis(ax.xaxis)
    ax.set_xlabel("time in slots (per unit of work: forward 1, backward 2)")
    ax.set_title(f"{schedule.name}, P={schedule.stages}, M={schedule.microbatches}"
                 + (f", v={schedule.chunks}" if with_stage else "") + f": idle {view.idle:.3f}", fontsize=FONT, loc="left")
    ax.legend(handles=[Patch(color=COLORS["forward"], label="forward"), Patch(color=COLORS["backward"],
                                                                              label="backward")],
              fontsize=SMALL, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)


def curve_axes(ax: plt.Axes, view: BubbleView) -> None:
    """Idle fraction against M at this P: both conventions, the balanced formula, and the large-M limit."""
    c, cfg = view.curve, view.config
    v = f"v{cfg.chunks}" if cfg.chunks > 1 else ""
    ax.plot(c.microbatches, c.idle, "o-", color="tab:red", ms=4, label="f = idle / whole schedule")
    ax.plot(c.microbatches, c.over_ideal, "s-", color="tab:blue", ms=4, label="r = idle / ideal time")
    ax.plot(c.microbatches, c.formula, "--", color="0.3", lw=1, label=f"(P-1)/({v}M+P-1), balanced")
    if c.limit > 0:
        ax.axhline(c.limit, color="tab:red", ls=":", lw=1, label=f"limit 1 - mean/max = {c.limit:.3f}")
    ax.axvline(cfg.microbatches, color="0.6", lw=0.8)
    ax.set(xscale="log", xlabel="microbatches M", ylabel="bubble",
           ylim=(0, min(1.5, max(c.over_ideal) * 1.1 + 0.05)))
    ax.set_title(f"bubble vs M at P={cfg.stages} (grey line: M={cfg.microbatches}); f = r/(1+r)",
                 fontsize=FONT, loc="left")
    log2_axis(ax.xaxis, c.microbatches)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def held_axes(ax: plt.Axes, view: BubbleView) -> None:
    """Activation sets each rank holds at its peak (bars), and the closed form (x)."""
    ranks = list(range(view.schedule.stages))
    ax.bar(ranks, view.peak, color="tab:orange", label="simulated peak")
    ax.plot(ranks, view.peak_formula, "kx", ms=8, mew=2, label="formula")
    ax.set(xlabel="rank", ylabel="microbatch activation sets", ylim=(0, max(view.peak) * 1.15 + 0.5))
    ax.set_title(f"activations in flight at the peak, {view.schedule.name}", fontsize=FONT, loc="left")
    ax.set_xticks(ranks)
    integer_axis(ax.yaxis)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)   # beside, never on a bar


def in_slots(spans: Sequence[Span], slot_seconds: float) -> list[Span]:
    """Measured spans rescaled to slot units (seconds / slot_seconds), to sit under the ideal diagram."""
    return [Span(row=s.row, start=s.start / slot_seconds, end=s.end / slot_seconds, kind=s.kind, label=s.label) for s in spans]


def draw_slots(fig: Figure, view: BubbleView) -> None:
    """The panel's main view: the ideal slot diagram."""
    slot_axes(axes_grid(fig, margins=(0.1, 0.98, 0.14, 0.88))[0], view)


def draw_measured(fig: Figure, view: BubbleView, measured: MeasuredBubble | None) -> None:
    """The ideal slot diagram above the same schedule measured on real ranks, on one time axis."""
    if measured is None or measured.schedule != view.schedule:
        ax = axes_grid(fig)[0]
        ax.set_axis_off()
        ax.text(0.5, 0.5, "Press \"Run it on P local ranks\" to time this schedule\non real processes here.",
                ha="center", va="center", fontsize=FONT + 1, transform=ax.transAxes)
        return
    ideal, low = axes_grid(fig, rows=2, cols=1, margins=(0.1, 0.98, 0.13, 0.92), hspace=0.5)
    ideal.set_axis_on()
    spans = in_slots(measured.median_timeline, measured.work.slot_seconds)
    end = max(float(view.sim.makespan), max(s.end for s in spans))
    slot_axes(ideal, view, end=end)
    ideal.set_xlabel("")
    timeline_figure(spans, ax=low, unit="s")
    low.get_legend().remove()                            # the same two colours as the ideal diagram's legend
    low.set_xlim(0, end)
    integer_axis(low.xaxis)
    low.set_xlabel(f"time in slots of {1e3 * measured.work.slot_seconds:g} ms")
    if view.schedule.stages > 4:                       # two stacked diagrams of up to 8 rows in the panel's 320 px
        for ax in (ideal, low):
            ax.tick_params(axis="y", labelsize=SMALL)
    low.set_title(f"measured on {view.schedule.stages} ranks (median of {len(measured.idle)} steps): idle "
                  f"{measured.median_idle:.3f}", fontsize=FONT, loc="left")


def draw_curve(fig: Figure, view: BubbleView) -> None:
    """Bubble against microbatches, legend on the right."""
    curve_axes(axes_grid(fig, margins=(0.09, 0.62, 0.14, 0.9))[0], view)


def draw_held(fig: Figure, view: BubbleView) -> None:
    """Activation sets in flight per rank, legend on the right."""
    held_axes(axes_grid(fig, margins=(0.09, 0.75, 0.14, 0.9))[0], view)


def measured_vs_ideal(measured: MeasuredBubble) -> Figure:
    """The measured timeline (median step) above the ideal-time one for the same stage times, one time axis."""
    return timelines_figure({f"measured: idle {measured.median_idle:.3f} of the schedule": list(measured.median_timeline),
                             f"ideal time (messages free): idle {measured.predicted:.3f}": list(measured.ideal)})


def forward_idle(times: Sequence[float], microbatches: int) -> float:
    """Idle fraction of a forward pipeline with stage times t: 1 - M sum(t) / (P (sum(t) + (M-1) max(t)))."""
    return 1 - microbatches * sum(times) / (len(times) * pcosts.fill_drain_time(times, microbatches))


def imbalance_figure(curve: ImbalanceCurve) -> Figure:
    """Idle fraction against M with one slow stage: measured points on the ideal-time and balanced curves."""
    work = curve.runs[0].work.work(curve.runs[0].schedule.stages)
    dense = list(range(1, 2 * max(curve.microbatches) + 1))
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(6.5, 3.4), layout="constrained")
    ax.plot(dense, [forward_idle(work, m) for m in dense], "-", color="tab:orange",
            label=f"ideal time, stage work {tuple(work)}")
    ax.plot(dense, [forward_idle([1.0] * len(work), m) for m in dense], "--", color="0.4",
            label="(P-1)/(M+P-1), balanced")
    ax.plot(curve.microbatches, curve.measured, "o", color="tab:red", ms=7, label="measured (median of 3 steps)")
    ax.axhline(curve.limit, color="tab:red", ls=":", label=f"limit 1 - mean/max = {curve.limit:.3f}")
    ax.set(xscale="log", xlabel="microbatches M", ylabel="idle fraction of the schedule", ylim=(0, 0.85),
           title="one slow stage: more microbatches do not remove the idle time")
    ticks = sorted({1, 2, 4, 8, 16, 32, 64} & set(dense) | set(curve.microbatches))
    ax.set_xticks(ticks, [str(m) for m in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    return fig
