"""The all-reduce trade-off in one figure: model time of ring, tree, halving-doubling and direct over payload size.

Draws an `AlgorithmCurves` (wmdist.costs.allreduce, pure); computes nothing itself. The default alpha
and beta are the scaling model's (ScalingParams: 100 us per round, 10 GB/s), so this figure and the
chapter's T(N) panel describe the same made-up network.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from wmdist.costs.allreduce import ALGORITHMS, AlgorithmCurves, algorithm_curves, model_time
from wmdist.costs.units import seconds, si
from wmdist.data_parallel.scaling import ScalingParams
from wmdist.ui.render import DPI, FONT, SMALL, axes_grid, eng_axis

FIGURE_PX = (920, 380)
MARGINS = (0.09, 0.6, 0.14, 0.9)          # left, right, bottom, top: the table goes right of the plot
# Drawn in this order: the thin lines on top of the thick ones they coincide with (direct on the ring,
# halving-doubling on the tree at small G, where both take the same rounds).
STYLE = {"ring": ("tab:blue", "-", 3.0), "tree": ("tab:orange", "-", 3.0),
         "halving-doubling": ("tab:green", "-", 1.5), "direct": ("tab:red", "--", 1.5)}
SIZES = tuple(float(s) for s in np.geomspace(1e3, 1e9, 61))     # payload G: 1 kB .. 1 GB
PANEL_SIZES = tuple(float(s) for s in np.geomspace(1e3, 1e11, 41))   # the scaling panel's G slider range and below
PANEL_MARGINS = (0.1, 0.66, 0.14, 0.9)    # the scaling panel's other views' layout: the key right of the plot


def curves(world_size: int, *, alpha: float | None = None, beta: float | None = None) -> AlgorithmCurves:
    """The model at `world_size` over SIZES, with the scaling model's alpha and beta unless given."""
    defaults = ScalingParams()
    return algorithm_curves(world_size, defaults.alpha if alpha is None else alpha,
                            defaults.beta if beta is None else beta, SIZES)


def algorithms_summary(c: AlgorithmCurves) -> str:
    """Rounds and bytes of each algorithm's busiest rank, and where the tree stops beating the ring, as text."""
    lines = [f"N = {c.world_size} ranks", f"α = {seconds(c.alpha)} per round",
             f"β = {seconds(c.beta)} per byte", f"  ({si(1 / c.beta, 'B/s')})" if c.beta else "", "",
             f"{'busiest rank':17}rounds  bytes*"]
    lines += [f"{a:17}{c.rounds[a]:6d}  {c.bytes_per_g[a]:.3g} G" for a in ALGORITHMS]
    cross = c.crossover("tree", "ring")
    lines += ["* per round the larger of", "  what it sends and receives", "",
              f"tree beats ring for G < {si(cross, 'B')}" if cross else "tree never beats ring here"]
    return "\n".join(lines)


def draw_tradeoff(fig: Figure, c: AlgorithmCurves) -> None:
    """T(G) = α rounds + β bytes for every algorithm, log-log, the tree/ring crossover marked; the table beside."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    for a in ALGORITHMS:
        color, ls, lw = STYLE[a]
        label = a + (" (= ring in this model)" if a == "direct" and c.times[a] == c.times["ring"] else "")
        ax.plot(c.sizes, c.times[a], color=color, ls=ls, lw=lw, label=label)
    cross = c.crossover("tree", "ring")
    if cross and c.sizes[0] < cross < c.sizes[-1]:
        ax.axvline(cross, color="0.5", ls=":", lw=1)
        ax.text(cross, 0.97, " tree = ring", transform=ax.get_xaxis_transform(), fontsize=SMALL, va="top",
                color="0.3")
    ax.set(xscale="log", yscale="log", xlim=(c.sizes[0], c.sizes[-1]), xlabel="payload G per rank",
           ylabel="modelled all-reduce time")
    eng_axis(ax.xaxis, "B")
    eng_axis(ax.yaxis, "s")
    ax.set_title(f"small G: rounds decide; large G: bytes decide (N = {c.world_size})", fontsize=FONT, loc="left")
    column = MARGINS[1] + 0.03
    fig.text(column, MARGINS[3], algorithms_summary(c), va="top", family="monospace", fontsize=SMALL)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=SMALL, loc="lower left", frameon=False,
               bbox_to_anchor=(column - 0.01, MARGINS[2] - 0.04))


def algorithms_tradeoff_figure(world_size: int, *, alpha: float | None = None, beta: float | None = None) -> Figure:
    """The trade-off figure at `world_size` (the notebook shows N = 8), returned for a cell to show once."""
    with plt.ioff():
        fig = plt.figure(figsize=(FIGURE_PX[0] / DPI, FIGURE_PX[1] / DPI), dpi=DPI)
    draw_tradeoff(fig, curves(world_size, alpha=alpha, beta=beta))
    plt.close(fig)
    return fig


def panel_curves(world_size: int, alpha: float, beta: float) -> AlgorithmCurves:
    """The four algorithms at the scaling panel's N, alpha and beta, over PANEL_SIZES (a fixed axis)."""
    return algorithm_curves(world_size, alpha, beta, PANEL_SIZES)


def draw_panel_tradeoff(fig: Figure, c: AlgorithmCurves, payload_bytes: float) -> None:
    """The scaling panel's "algorithms" view: T(G) of every algorithm at the panel's N, the panel's G marked.

    Rounds cost alpha each, bytes beta each (model_time): left of the crossover the tree's
    2 ceil(log2 N) rounds win, right of it the ring's 2(N-1)/N G bytes. The marker says which is
    fastest at the G the sliders set, so moving alpha, beta or G moves the learner across it.
    """
    ax = axes_grid(fig, margins=PANEL_MARGINS)[0]
    for a in ALGORITHMS:
        color, ls, lw = STYLE[a]
        ax.plot(c.sizes, c.times[a], color=color, ls=ls, lw=lw,
                label=f"{a}\n{c.rounds[a]} rounds, {c.bytes_per_g[a]:.3g} G")
    times = {a: model_time(a, c.world_size, c.alpha, c.beta, payload_bytes) for a in ALGORITHMS}
    best = min(ALGORITHMS, key=times.__getitem__)
    ax.axvline(payload_bytes, color="k", ls=":", lw=1)
    ax.plot([payload_bytes], [times[best]], "o", color=STYLE[best][0], ms=6, zorder=5)
    # The label stands where no curve goes: top left of the marker (curves are flat and low at small G),
    # or top right of it when the marker is far left (curves reach the top only at large G).
    left = payload_bytes > 1e7
    ax.text(payload_bytes, 0.97, f"{' ' * (not left)}G = {si(payload_bytes, 'B')}\n{' ' * (not left)}fastest: {best} ",
            transform=ax.get_xaxis_transform(), fontsize=SMALL, va="top", ha="right" if left else "left")
    ax.set(xscale="log", yscale="log", xlim=(c.sizes[0], c.sizes[-1]), xlabel="payload G per rank",
           ylabel="modelled all-reduce time")
    eng_axis(ax.xaxis, "B")
    eng_axis(ax.yaxis, "s")
    ax.set_title(f"N = {c.world_size}: few rounds win small G, few bytes win large G", fontsize=FONT, loc="left")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=SMALL, loc="upper left", frameon=False,
               bbox_to_anchor=(PANEL_MARGINS[1] + 0.01, PANEL_MARGINS[3]), title="busiest rank", title_fontsize=SMALL,
               alignment="left")
