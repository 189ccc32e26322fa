"""Figures for chapter 11: pure functions of the panel's PlannerView and of the published-run scores.

`draw_steps` stacks each ranked layout's step time by term (the chosen one outlined); `draw_memory` stacks
the chosen layout's bytes on its fullest GPU by tensor kind against the GPU's HBM; `scores_figure` sets
each published run's predicted utilisation against the printed one. No widgets, no display.
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from wmdist.memory.footprint import KINDS
from wmdist.planner.breakdown import TERMS
from wmdist.planner.explore import PlannerView
from wmdist.planner.misses import MISS_POINTS, RunComparison
from wmdist.ui.render import FONT, SMALL, axes_grid, empty, eng_axis

TERM_COLORS = {"compute": "tab:green", "elementwise": "yellowgreen", "optimizer": "olive", "bubble": "0.7",
               "tp": "tab:blue", "cp": "tab:purple", "ep": "tab:pink", "pp": "tab:orange", "dp": "tab:red"}
KIND_COLORS = {"parameters": "tab:blue", "gradients": "tab:orange", "optimizer_state": "tab:red",
               "master_weights": "tab:brown", "activations": "tab:green", "batch": "0.6"}
LEGEND_BESIDE = (0.08, 0.72, 0.16, 0.9)     # margins leaving a column on the right for the key


def _nothing_fits(fig: Figure, view: PlannerView) -> None:
    ax = axes_grid(fig, margins=LEGEND_BESIDE)[0]
    empty(ax)
    ax.set_axis_off()
    ax.text(0.02, 0.5, f"no layout of {view.config.model} fits on {view.config.gpus:,} GPUs\n"
            "(every candidate needs more memory than HBM holds)", fontsize=FONT, va="center")
    ax.set_title("nothing fits", fontsize=FONT, loc="left")


def draw_steps(fig: Figure, view: PlannerView) -> None:
    """One horizontal bar per ranked layout, its step split into the breakdown's terms; the chosen one outlined."""
    if not view.plans:
        _nothing_fits(fig, view)
        return
    ax = axes_grid(fig, margins=LEGEND_BESIDE)[0]
    rows = list(range(len(view.plans)))
    for term in TERMS:
        left = [sum(p.step.terms[t] for t in TERMS[:TERMS.index(term)]) for p in view.plans]
        widths = [p.step.terms[term] for p in view.plans]
        if any(w > 0 for w in widths):
            ax.barh(rows, widths, left=left, color=TERM_COLORS[term], height=0.7, label=term)
    pick = view.plans.index(view.chosen)
    ax.barh([pick], [view.chosen.step.total], fill=False, edgecolor="k", lw=1.8, height=0.78)
    ax.set_yticks(rows, [f"#{i + 1}" for i in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)             # #1 on top (set, not inverted: the axes are reused)
    eng_axis(ax.xaxis, "s")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlim(0, max(p.step.total for p in view.plans) * 1.04)
    ax.set_xlabel("predicted step time, per term")
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    c = view.config
    ax.set_title(f"{c.model} on {c.gpus:,} {c.gpu}: the {len(rows)} fastest layouts that fit", fontsize=FONT,
                 loc="left")


def draw_memory(fig: Figure, view: PlannerView) -> None:
    """Each ranked layout's bytes on its fullest GPU, stacked by tensor kind (the calculator's), against HBM;
    the chosen one outlined."""
    if view.chosen is None:
        _nothing_fits(fig, view)
        return
    ax = axes_grid(fig, margins=LEGEND_BESIDE)[0]
    rows, hbm = list(range(len(view.plans))), view.chosen.hbm_bytes
    for kind in KINDS:
        left = [sum(p.memory[k] for k in KINDS[:KINDS.index(kind)]) for p in view.plans]
        widths = [p.memory[kind] for p in view.plans]
        if any(widths):
            ax.barh(rows, widths, left=left, color=KIND_COLORS[kind], height=0.7, label=kind.replace("_", " "))
    pick = view.plans.index(view.chosen)
    ax.barh([pick], [view.chosen.memory["total"]], fill=False, edgecolor="k", lw=1.8, height=0.78)
    ax.axvline(hbm, color="k", ls="--", lw=1.4, label="HBM")
    ax.set_yticks(rows, [f"#{i + 1}" for i in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)             # #1 on top (set, not inverted: the axes are reused)
    eng_axis(ax.xaxis, "B")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlim(0, max(hbm, *(p.memory["total"] for p in view.plans)) * 1.05)
    ax.set_xlabel("bytes on the fullest GPU")
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"memory: layout #{pick + 1} fills {100 * view.chosen.memory['total'] / hbm:.0f}% of "
                 f"{view.config.gpu} HBM", fontsize=FONT, loc="left")


def scores_figure(scores: Sequence[RunComparison]) -> Figure:
    """Predicted against published utilisation for every run (the diagonal: a perfect prediction; the band:
    MISS_POINTS either side), one marker per source."""
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
    plt.close(fig)      # returned, not left in pyplot: a cell shows it once
    sources = sorted({s.run.citation.authors.split()[0].rstrip(",") for s in scores})
    markers = "osD^vP*X"
    for i, src in enumerate(sources):
        mine = [s for s in scores if s.run.citation.authors.split()[0].rstrip(",") == src]
        ax.plot([100 * s.published for s in mine], [100 * s.predicted for s in mine], markers[i % len(markers)],
                label=src, ms=6)
    lo = 100 * min(min(s.published, s.predicted) for s in scores) - 8
    hi = 100 * max(max(s.published, s.predicted) for s in scores) + 8
    ax.plot([lo, hi], [lo, hi], "k-", lw=1)
    band = MISS_POINTS
    ax.fill_between([lo, hi], [lo - band, hi - band], [lo + band, hi + band], color="0.9", zorder=0,
                    label=f"within {band:g} points")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published utilisation (% of peak)")
    ax.set_ylabel("planner's prediction (% of peak)")
    ax.set_title("published training runs: predicted against printed", fontsize=FONT, loc="left")
    ax.legend(fontsize=SMALL, loc="upper left")
    fig.tight_layout()
    return fig
