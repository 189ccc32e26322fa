"""Stacked bars of the bytes each rank holds, by tensor kind, against a device's capacity."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.memory.footprint import KINDS

COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
          "master_weights": "#8172b3", "activations": "#c44e52", "batch": "#937860"}


def _label(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous else f"{len(ranks)} ranks"


def memory_bars(groups: Sequence[tuple[Sequence[int], dict[str, int]]], capacity_bytes: float | None = None,
                binary: bool = False, title: str = "", peak: tuple[int, int] | None = None,
                note: str = "") -> Figure:
    """One stacked bar per distinct breakdown (labelled by its ranks); a dashed capacity line.

    `peak=(group index, bytes)` draws that group's transient peak within a step
    as a hatched, unfilled box on top of its steady-state bar; `note` is a line
    under the plot (e.g. what a real run measured).
    """
    unit, name = (1024 ** 3, "GiB") if binary else (1e9, "GB")
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(groups) + 2.5), 3.1))
    x = range(len(groups))
    bottom = [0.0] * len(groups)
    for kind in KINDS:
        h = [b[kind] / unit for _, b in groups]
        if any(h):
            ax.bar(x, h, bottom=bottom, color=COLORS[kind], label=kind.replace("_", " "))
            bottom = [a + c for a, c in zip(bottom, h)]
    if peak is not None and peak[1] > groups[peak[0]][1]["total"]:
        steady = groups[peak[0]][1]["total"] / unit
        ax.bar([peak[0]], [peak[1] / unit - steady], bottom=[steady], fill=False, hatch="//", edgecolor="0.3",
               label="peak within a step")
    if capacity_bytes is not None:
        ax.axhline(capacity_bytes / unit, color="black", linestyle="--", linewidth=1.2,
                   label=f"device capacity ({capacity_bytes / unit:.3g} {name})")
    ax.set_xticks(list(x), [_label(r) for r, _ in groups])
    ax.set_ylabel(f"bytes held per rank ({name})")
    ax.set_title(title or "memory per rank by tensor kind")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, color="0.3", va="bottom")
    fig.tight_layout(rect=(0, 0.05 if note else 0, 1, 1))
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
