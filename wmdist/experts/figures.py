"""Figures for chapter 10: pure functions of the panel's ExpertsView and of finished runs; no widgets, no display.

The panel's views draw into a figure they are handed (`draw_*`). The notebook's static figures
(`*_figure`) take what a run returned: counts per expert and a capacity, a Report's bytes per rank,
a balance run's imbalance per step (any object with BalanceResult's fields: this file imports no
demo module, so drawing a stored result loads no runner).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from wmdist.costs import experts as ecosts
from wmdist.experts.tradeoff import ExpertsView, capacity_sweep, rank_sweep
from wmdist.course.report import Report
from wmdist.ui.render import FONT, SMALL, axes_grid, eng_axis, integer_axis, log2_axis

PHASES = ("dispatch", "combine", "combine backward", "dispatch backward")
PHASE_COLORS = {"dispatch": "tab:blue", "combine": "tab:orange", "combine backward": "tab:green",
                "dispatch backward": "tab:red"}
KEPT, DROPPED = "tab:blue", "tab:red"
ONE = (0.12, 0.97, 0.15, 0.89)          # margins of a one-plot view
TWO = (0.1, 0.98, 0.16, 0.84)          # margins of two plots side by side (room for a shared title)


class BalanceLike(Protocol):
    """What the balance figure reads (wmdist.experts.balance.BalanceResult has these fields)."""
    aux_weights: tuple[float, ...]
    imbalance: tuple[tuple[float, ...], ...]
    busiest: tuple[tuple[int, ...], ...]


def loads_axes(ax: Axes, loads: Sequence[float], cap: int | None, ranks: int, *, title: str) -> None:
    """Assignments per expert: the part its expert keeps (blue), the part past capacity C (red, dropped),
    the capacity as a dashed line, and which rank holds which experts."""
    e = len(loads)
    kept = [x if cap is None else min(x, cap) for x in loads]
    ax.bar(range(e), kept, color=KEPT, width=0.8, label="kept")
    over = [x - k for x, k in zip(loads, kept)]
    if any(o > 0 for o in over):
        ax.bar(range(e), over, bottom=kept, color=DROPPED, width=0.8, label="dropped")
    if cap is not None:
        ax.axhline(cap, color="k", ls="--", lw=1.2, label=f"capacity C = {cap:,}")
    per = e // ranks
    for r in range(1, ranks):
        ax.axvline(r * per - 0.5, color="0.6", lw=0.8, ls=":")
    if ranks <= 16:
        for r in range(ranks):
            ax.annotate(f"rank {r}", ((r + 0.5) * per - 0.5, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(0, -3), textcoords="offset points", ha="center", va="top", fontsize=SMALL)
    ax.set_xlim(-0.6, e - 0.4)
    ax.set_ylim(0, max([*loads, cap or 0, 1]) * 1.22)
    integer_axis(ax.xaxis)
    eng_axis(ax.yaxis, "")
    ax.set_xlabel("expert")
    ax.set_ylabel("assignments")
    ax.legend(fontsize=SMALL, loc="upper right", bbox_to_anchor=(1.0, 0.9))
    ax.set_title(title, fontsize=FONT, loc="left")


def draw_loads(fig: Figure, view: ExpertsView) -> None:
    """The panel's first view: expected assignments per expert, capacity and drops."""
    c = view.config
    loads_axes(axes_grid(fig, margins=ONE)[0], view.loads, view.capacity, c.ranks,
               title=f"expected assignments per expert at skew {c.skew:.1f}: {100 * view.dropped_fraction:.1f}% dropped")


def _mark(ax: Axes, x: float) -> None:
    ax.axvline(x, color="0.3", lw=1, ls=":")


def draw_ranks(fig: Figure, view: ExpertsView) -> None:
    """Bytes per rank in one dispatch, and one forward's all-to-all time against the expert compute, vs N."""
    left, right = axes_grid(fig, cols=2, margins=TWO, wspace=0.35)
    sweep = rank_sweep(view.config)
    ns = [v.config.ranks for v in sweep]
    left.plot(ns, [v.dispatch_bytes for v in sweep], "o-", color="tab:blue", label="busiest rank")
    left.plot(ns, [v.uniform_bytes for v in sweep], "k--", lw=1, label="uniform routing")
    right.plot(ns, [v.a2a_seconds for v in sweep], "o-", color="tab:red", label="dispatch + combine")
    right.plot(ns, [v.compute_seconds for v in sweep], "s-", color="tab:green", label="busiest rank's experts")
    for ax, unit in ((left, "B"), (right, "s")):
        _mark(ax, view.config.ranks)
        ax.set_xscale("log")
        log2_axis(ax.xaxis, ns)
        ax.set_xlim(min(ns) / 1.3, max(ns) * 1.3)
        ax.set_ylim(bottom=0)
        eng_axis(ax.yaxis, unit)
        ax.set_xlabel("ranks N")
        ax.legend(fontsize=SMALL, loc="lower right")
    left.set_title("bytes per rank, one dispatch", fontsize=FONT, loc="left")
    right.set_title("one forward, no overlap", fontsize=FONT, loc="left")


def draw_capacity(fig: Figure, view: ExpertsView) -> None:
    """Dropped fraction, and the dispatch buffer a padded all-to-all would ship, against the capacity factor."""
    left, right = axes_grid(fig, cols=2, margins=TWO, wspace=0.35)
    sweep = capacity_sweep(view.config)
    cs = [v.config.capacity_factor for v in sweep]
    left.plot(cs, [100 * v.dropped_fraction for v in sweep], "o-", color=DROPPED, ms=4)
    right.plot(cs, [v.padded_bytes for v in sweep], "o-", color="0.4", ms=4, label="padded: C_r slots per expert")
    right.plot(cs, [v.dispatch_sent for v in sweep], "-", color="tab:blue",
               label="uneven: the rows (busiest)")
    for ax in (left, right):
        _mark(ax, view.config.capacity_factor)
        ax.set_xlabel("capacity factor c")
        ax.set_ylim(bottom=0)
    left.set_ylabel("% of assignments dropped")
    eng_axis(right.yaxis, "B")
    right.legend(fontsize=SMALL, loc="upper left")
    left.set_title(f"drops at skew {view.config.skew:.1f}", fontsize=FONT, loc="left")
    right.set_title("bytes sent per rank, one dispatch", fontsize=FONT, loc="left")


def alltoall_bytes_axes(ax: Axes, report: Report, case: str, *, uniform: float | None = None) -> None:
    """Bytes each rank sent in each all-to-all of one case: the ledger's (bars) and the formula's (black ticks)."""
    n = report.world_size
    width = 0.8 / len(PHASES)
    for i, phase in enumerate(PHASES):
        xs = [r - 0.4 + (i + 0.5) * width for r in range(n)]
        ax.bar(xs, report.measured(quantity="bytes sent", phase=phase, case=case), width=width * 0.9,
               color=PHASE_COLORS[phase], label=phase)
        ax.plot(xs, report.predicted(quantity="bytes sent", phase=phase, case=case), "k_", ms=9, mew=2)
    ax.plot([], [], "k_", ms=9, mew=2, label="formula")
    if uniform is not None:
        ax.axhline(uniform, color="0.4", ls="--", lw=1, label="uniform expectation")
    ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
    eng_axis(ax.yaxis, "B")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_measured(fig: Figure, report: Report | None, case: str | None, *, uniform: float | None = None) -> None:
    """After "run it": the ledger's bytes per rank and all-to-all against rank_traffic of the run's routing
    (`uniform`: the uniform-routing expectation at the run's sizes, dashed)."""
    ax = axes_grid(fig, margins=(0.1, 0.7, 0.12, 0.89))[0]
    if report is None or case is None:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "press the run button: the layer at this E, k, N and c on local ranks",
                ha="center", va="center", fontsize=FONT, transform=ax.transAxes)
        return
    ax.set_axis_on()
    alltoall_bytes_axes(ax, report, case, uniform=uniform)
    verdict = "PASS" if report.passed else "FAIL"
    ax.set_title(f"measured on {report.world_size} ranks ({case}): ledger vs formula, {verdict}", fontsize=FONT,
                 loc="left")


# --- the notebook's static figures ------------------------------------------------------------

def _figure(width: float = 6.4, height: float = 3.2) -> tuple[Figure, Axes]:
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(width, height))
    plt.close(fig)      # returned, not left in pyplot: a cell shows it once
    return fig, ax


def tokens_figure(counts: Sequence[int], cap: int, *, ranks: int, title: str) -> Figure:
    """Tokens (assignments) per expert from one run, the capacity line, the dropped ones in red."""
    fig, ax = _figure()
    loads_axes(ax, counts, cap, ranks, title=f"{title}: {ecosts.dropped(counts, cap)} of {sum(counts)} dropped")
    fig.tight_layout()
    return fig


def expert_imbalance_figure(result: BalanceLike) -> Figure:
    """Imbalance (max / mean tokens per expert) at every training step, with and without the balancing loss."""
    fig, ax = _figure()
    for w, series in zip(result.aux_weights, result.imbalance):
        ax.plot(range(len(series)), series, "o-", label=f"balancing loss × {w:g}")
    ax.axhline(1.0, color="0.5", ls=":", lw=1, label="perfect balance")
    integer_axis(ax.xaxis)
    ax.set(xlabel="training step", ylabel="max / mean tokens per expert")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("load imbalance over training (skewed start)", fontsize=FONT, loc="left")
    fig.tight_layout()
    return fig


def alltoall_bytes_figure(report: Report, case: str) -> Figure:
    """Bytes per rank per all-to-all in one case of a moe-ep Report: ledger against formula."""
    fig, ax = _figure(7.2, 3.2)
    alltoall_bytes_axes(ax, report, case)
    ax.set_title(f"{case} on {report.world_size} ranks: bytes sent per all-to-all", fontsize=FONT, loc="left")
    fig.tight_layout()
    return fig

