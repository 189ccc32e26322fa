"""Stacked bars of the bytes each rank holds, by tensor kind, against a device's capacity."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.memory.footprint import KINDS
from wmdist.ui.render import FONT, SMALL, axes_grid

COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
          "master_weights": "#8172b3", "activations": "#c44e52", "batch": "#937860"}
Breakdowns = Sequence[tuple[str, dict[str, int]]]      # (bar label, bytes by kind)


def rank_label(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0-7' or '5 ranks': the ranks one bar stands for."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous else f"{len(ranks)} ranks"


def scale(most: float, *, binary: bool) -> tuple[float, str]:
    """(bytes per unit, unit name) for an axis whose largest value is `most` bytes: GB for a 7B model, kB for ours."""
    base, names = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else (1000, ("B", "kB", "MB", "GB", "TB",
                                                                                          "PB"))
    k = 0
    while k < len(names) - 1 and most >= base ** (k + 1):
        k += 1
    return float(base ** k), names[k]


def bars_axes(ax: plt.Axes, bars: Breakdowns, *, capacity_bytes: float | None = None, binary: bool = False,
              title: str = "", peak: tuple[int, int] | None = None) -> None:
    """One stacked bar per breakdown; `peak=(bar index, bytes)` a hatched box for the peak within a step;
    a dashed line at the device's capacity. Legend beside the plot."""
    most = max([b["total"] for _, b in bars] + [peak[1] if peak else 0, capacity_bytes or 0, 1])
    unit, name = scale(most, binary=binary)
    x = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for kind in KINDS:
        h = [b[kind] / unit for _, b in bars]
        if any(h):
            ax.bar(x, h, bottom=bottom, color=COLORS[kind], label=kind.replace("_", " "), width=0.6)
            bottom = [a + c for a, c in zip(bottom, h)]
    top = max(bottom, default=0.0)
    if peak is not None and peak[1] > bars[peak[0]][1]["total"]:
        steady = bars[peak[0]][1]["total"] / unit
        ax.bar([peak[0]], [peak[1] / unit - steady], bottom=[steady], fill=False, hatch="//", edgecolor="0.3",
               label="peak within a step", width=0.6)
        top = max(top, peak[1] / unit)
    if capacity_bytes is not None:
        ax.axhline(capacity_bytes / unit, color="black", linestyle="--", linewidth=1.2,
                   label=f"capacity {capacity_bytes / unit:.3g} {name}")
        top = max(top, capacity_bytes / unit)
    ax.set_xticks(x, [label for label, _ in bars])
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylim(0, top * 1.08 or 1.0)
    ax.set_ylabel(f"bytes held per rank ({name})")
    ax.set_title(title or "memory per rank by tensor kind", fontsize=FONT, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=SMALL, frameon=False)


def draw_bars(fig: Figure, bars: Breakdowns, *, capacity_bytes: float | None, binary: bool, title: str,
              peak: tuple[int, int] | None, note: str = "") -> None:
    """The memory panel's view: bars_axes in `fig` (reused), and `note` (e.g. what a run measured) under it."""
    bars_axes(axes_grid(fig, margins=(0.1, 0.7, 0.16 if note else 0.1, 0.9))[0], bars, capacity_bytes=capacity_bytes,
              binary=binary, title=title, peak=peak)
    if note:
        fig.text(0.01, 0.015, note, fontsize=SMALL, color="0.3", va="bottom")


def zero_stages_figure(held: dict[int, dict[str, int]], predicted: dict[int, int], world_size: int, *,
                       rank: int = 0) -> Figure:
    """Chapter 03's evidence: bytes one rank really held at each ZeRO stage, by kind (bars), and the memory
    model's total for that rank (black ticks). `held[stage][kind]` and `predicted[stage]` are bytes."""
    unknown = sorted({k for kinds in held.values() for k in kinds} - set(KINDS))
    if unknown:
        raise ValueError(f"held: unknown tensor kinds {unknown}; expected some of {list(KINDS)}")
    bars = [(f"ZeRO-{stage}", {**{k: 0 for k in KINDS}, **kinds, "total": sum(kinds.values())})
            for stage, kinds in sorted(held.items())]
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(7.6, 3.3))
        fig.subplots_adjust(left=0.1, right=0.72, bottom=0.12, top=0.9)
    bars_axes(ax, bars, title=f"bytes rank {rank} of {world_size} held, measured, by ZeRO stage")
    unit, _ = scale(max(b["total"] for _, b in bars), binary=False)
    ax.plot(range(len(bars)), [predicted[stage] / unit for stage in sorted(held)], "k_", ms=40, mew=2)
    ax.plot([], [], "k_", ms=14, mew=2, label="memory model")          # a legend-sized stand-in for the ticks
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=SMALL, frameon=False)
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
