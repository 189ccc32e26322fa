"""Gantt-like timelines: one row per rank (or stage), one bar per Span, coloured by kind.

Generic on purpose: data-parallel buckets (compute / launch / comm) and
pipeline schedules (forward / backward / send) draw with the same function.
"""
from __future__ import annotations

from typing import Iterable, Literal, Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from wmdist.base.spans import Span
from wmdist.ui.layout import FIGURE_MAX_IN

DEFAULT_COLORS = {"compute": "tab:green", "comm": "tab:blue", "launch": "tab:orange",
                  "forward": "tab:green", "backward": "tab:purple", "send": "tab:blue", "idle": "0.85"}
# Within a row, kinds listed here draw as thin bars on the upper or lower half so that overlap stays visible.
LANES = {"comm": (0.05, 0.4), "send": (0.05, 0.4)}
TimeUnit = Literal["s", "ms"]        # the time axis: spans are in seconds, drawn in s or ms


def timeline_figure(spans: Iterable[Span], *, title: str = "", row_label: str = "rank",
                    colors: Mapping[str, str] | None = None, unit: TimeUnit = "ms",
                    ax: plt.Axes | None = None) -> Figure:
    """Draw `spans` as horizontal bars, row 0 at the top; comm-like kinds on their own lane.

    `unit` is "s" or "ms" (spans are in seconds). Pass `ax` to draw into an
    existing axes (e.g. two timelines side by side); the figure is returned.
    """
    spans = list(spans)
    if unit not in ("s", "ms"):
        raise ValueError(f"unit must be 's' or 'ms', got {unit!r}")
    scale = 1000.0 if unit == "ms" else 1.0
    palette = {**DEFAULT_COLORS, **(colors or {})}
    rows = sorted({s.row for s in spans})
    own = ax is None
    if own:
        with plt.ioff():
            fig, ax = plt.subplots(figsize=(8, 0.6 + 0.55 * max(1, len(rows))), layout="constrained")
    else:
        fig = ax.figure
    kinds: dict[str, None] = {}
    extent = (max((s.end for s in spans), default=1.0) - min((s.start for s in spans), default=0.0)) * scale
    for s in spans:
        kinds[s.kind] = None
        low, height = LANES.get(s.kind, (0.5, 0.45))
        color = palette.get(s.kind, "0.5")
        thin = s.duration * scale < 0.004 * extent       # a black edge would turn a short bar into a grey tick
        ax.broken_barh([(s.start * scale, max(s.duration * scale, 1e-9))], (s.row + low - 0.5, height),
                       facecolors=color, edgecolor=color if thin else "k", linewidth=0.3)
    ax.set_yticks(rows, [f"{row_label} {r}" for r in rows])
    ax.set_ylim(max(rows, default=0) + 0.6, min(rows, default=0) - 0.6)
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    # Above the axes, not over the bars: a legend inside would hide the top row's work.
    ax.legend(handles=[Patch(color=palette.get(k, "0.5"), label=k) for k in kinds], fontsize=9,
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(kinds), frameon=False)
    if own:
        plt.close(fig)      # handed back, not left with pyplot: a notebook shows it once, as the cell's value
    return fig


def timelines_figure(timelines: Mapping[str, Iterable[Span]], *, row_label: str = "rank",
                     unit: TimeUnit = "ms") -> Figure:
    """Several timelines stacked (one axes each, shared time axis), titled by their keys."""
    items = [(name, list(spans)) for name, spans in timelines.items()]
    if not items:
        raise ValueError("timelines must hold at least one timeline")
    heights = [max(1, len({s.row for s in spans})) for _, spans in items]
    # inches: 0.8 for the time axis, 0.45 per timeline for its title and legend, the rest shared by the rows
    # (0.55 each at most, fewer inches each when many): the whole stack fits the screen's height
    fixed = 0.8 + 0.45 * len(items)
    row = max(0.18, min(0.55, (FIGURE_MAX_IN[1] - fixed) / sum(heights)))   # 0.18: a 9-pt rank label's height
    with plt.ioff():
        fig, axes = plt.subplots(len(items), 1, sharex=True, figsize=(8, fixed + row * sum(heights)),
                                 height_ratios=heights, layout="constrained", squeeze=False)
    for ax, (name, spans) in zip(axes[:, 0], items):
        timeline_figure(spans, title=name, row_label=row_label, unit=unit, ax=ax)
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    plt.close(fig)          # handed back, not left with pyplot: a notebook shows it once, as the cell's value
    return fig
