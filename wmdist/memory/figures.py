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
                binary: bool = False, title: str = "") -> Figure:
    """One stacked bar per distinct breakdown (labelled by its ranks); a dashed capacity line."""
    unit, name = (1024 ** 3, "GiB") if binary else (1e9, "GB")
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(groups) + 2.5), 3.6))
    x = range(len(groups))
    bottom = [0.0] * len(groups)
    for kind in KINDS:
        h = [b[kind] / unit for _, b in groups]
        if any(h):
            ax.bar(x, h, bottom=bottom, color=COLORS[kind], label=kind.replace("_", " "))
            bottom = [a + c for a, c in zip(bottom, h)]
    if capacity_bytes is not None:
        ax.axhline(capacity_bytes / unit, color="black", linestyle="--", linewidth=1.2,
                   label=f"device capacity ({capacity_bytes / unit:.3g} {name})")
    ax.set_xticks(list(x), [_label(r) for r, _ in groups])
    ax.set_ylabel(f"bytes held per rank ({name})")
    ax.set_title(title or "memory per rank by tensor kind")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    return fig
