"""Figures for chapter 09: pure functions of a PatternsResult and of a measured MeshRun; no widgets, no display."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from wmdist.costs.mesh import TRAFFIC_AXES
from wmdist.costs.units import seconds
from wmdist.memory.footprint import format_bytes
from wmdist.mesh.spec import MeshRun
from wmdist.mesh.patterns import PATTERNS, PatternsResult, Placement
from wmdist.ui.render import FONT, SMALL, axes_grid, eng_axis

COLORS = {"dp": "tab:blue", "tp": "tab:red", "pp": "tab:green", "cp": "tab:purple", "ep": "tab:orange"}
MAX_PLACEMENTS = 8
MARGINS = (0.02, 0.98, 0.16, 0.91)


def label(ax: plt.Axes, row: int, text: str) -> None:
    """A bar's label above its bar, a few pixels right of the axis line (never struck through by it)."""
    ax.annotate(text, (0, row - 0.2), xycoords=ax.get_yaxis_transform(), xytext=(4, 0), textcoords="offset points",
                va="center", fontsize=SMALL + 0.5)


def measured_for(result: PatternsResult, measured: MeshRun | None) -> dict[str, int] | None:
    """The ledger's bytes per axis for the rank the widget shows, if `measured` ran the widget's current sizes."""
    if measured is None or measured.spec.shape != result.config.shape:
        return None
    rank = measured.coords.index(result.coords)
    return {a: measured.measured[rank][a].bytes_sent for a in TRAFFIC_AXES}


def bytes_axes(ax: plt.Axes, result: PatternsResult, ledger: dict[str, int] | None) -> None:
    """Bytes per axis for one rank (log scale), messages in the label; the ledger's bytes as markers."""
    axes = result.config.axes
    values = [max(result.traffic[a].bytes_sent, 1) for a in axes]
    for i, a in enumerate(axes):
        t = result.traffic[a]
        ax.barh(i + 0.18, values[i], height=0.42, color=COLORS[a], alpha=0.8)
        expected = " expected" if a == "ep" else ""
        label(ax, i, f"{PATTERNS[a]}: {format_bytes(int(round(t.bytes_sent)))}{expected}, {t.messages} messages")
    if ledger is not None:
        ax.plot([max(ledger[a], 1) for a in TRAFFIC_AXES], [i + 0.18 for i in range(len(TRAFFIC_AXES))], "kD", ms=6,
                label="measured (ledger)")
        ax.legend(fontsize=SMALL, loc="lower right")
    ax.set_xscale("log")
    ax.set_xlim(1, max(values) * 10)
    ax.xaxis.set_major_locator(LogLocator(base=10, numticks=7))     # every other decade past 6: labels apart
    eng_axis(ax.xaxis, "B")
    ax.minorticks_off()
    ax.set_ylim(len(axes) - 0.5, -0.6)
    ax.set_yticks([])
    c = result.coords
    ax.set_title(f"bytes sent per step by one rank (dp {c['dp']}, tp {c['tp']}, pp stage {c['pp']}, cp {c['cp']})",
                 fontsize=FONT, loc="left")
    ax.set_xlabel("bytes (log scale)")


def time_axes(ax: plt.Axes, result: PatternsResult) -> None:
    """Each axis's time on the best placement's links: latency term (hatched) + bandwidth term."""
    best, axes = result.best, result.config.axes
    for i, a in enumerate(axes):
        lat, tra = best.latency[a], best.transfer[a]
        ax.barh(i + 0.18, lat, height=0.42, color=COLORS[a], alpha=0.35, hatch="//")
        ax.barh(i + 0.18, tra, left=lat, height=0.42, color=COLORS[a], alpha=0.85)
        if result.traffic[a].messages:
            kind = "latency-bound" if lat > tra else "bandwidth-bound"
            link = "fast" if best.inside[a] else "slow"
            label(ax, i, f"{a.upper()}: {seconds(lat + tra)}, {kind}, {link} link")
    ax.set_xlim(0, max([best.latency[a] + best.transfer[a] for a in axes] + [1e-9]) * 1.1)
    ax.set_ylim(len(axes) - 0.5, -0.6)
    ax.set_yticks([])
    eng_axis(ax.xaxis, "s")
    ax.set_xlabel("time per step")
    ax.set_title("time per axis on the best order's links (hatched: messages × latency; solid: bytes / bandwidth)",
                 fontsize=FONT, loc="left")


def order_label(p: Placement, result: PatternsResult) -> str:
    """e.g. "tp·cp·dp·pp (in a node: dp, tp)": the order, and the axes of more than one rank that fit in a node."""
    inside = ", ".join(a for a in TRAFFIC_AXES if p.inside[a] and getattr(result.config, a) > 1) or "none"
    return f"{'·'.join(p.order)} (in a node: {inside})"


def placement_axes(ax: plt.Axes, result: PatternsResult) -> None:
    """Exposed time of each distinct placement, best first; the default order (tp fastest) outlined."""
    shown = list(result.placements[:MAX_PLACEMENTS])
    key = tuple(result.default.inside[a] for a in TRAFFIC_AXES)
    for i, p in enumerate(shown):
        default = tuple(p.inside[a] for a in TRAFFIC_AXES) == key
        ax.barh(i + 0.18, p.total, height=0.42, color="tab:green" if i == 0 else "0.7",
                edgecolor="k" if default else "none", linewidth=1.5)
        label(ax, i, f"{order_label(p, result)}: {seconds(p.total)}")
    ax.set_yticks([])
    ax.set_ylim(len(shown) - 0.5, -0.6)
    ax.set_xlim(0, max(p.total for p in shown) * 1.1 or 1.0)
    eng_axis(ax.xaxis, "s")
    ax.set_xlabel("exposed communication per step")
    ax.set_title("mesh orders on the two-level machine (green: best; outlined: default tp·cp·dp·pp)",
                 fontsize=FONT, loc="left")


def draw_bytes(fig: Figure, result: PatternsResult, measured: MeshRun | None) -> None:
    """The panel's main view: bytes per axis for the shown rank, the ledger's bytes after a run."""
    bytes_axes(axes_grid(fig, margins=MARGINS)[0], result, measured_for(result, measured))


def draw_time(fig: Figure, result: PatternsResult) -> None:
    """Time per axis on the best order's links."""
    time_axes(axes_grid(fig, margins=MARGINS)[0], result)


def draw_orders(fig: Figure, result: PatternsResult) -> None:
    """Exposed time of each distinct mesh order."""
    placement_axes(axes_grid(fig, margins=MARGINS)[0], result)


def ledger_figure(run: MeshRun) -> Figure:
    """Each rank's ledger split by axis (stacked bars), with each axis's formula total as a marker."""
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ranks = range(len(run.coords))
        bottom = [0] * len(run.coords)
        for a in TRAFFIC_AXES:
            values = [m[a].bytes_sent for m in run.measured]
            if any(values):
                ax.bar(ranks, values, bottom=bottom, color=COLORS[a], label=f"{a}/ (ledger)")
                tops = [b + p[a].bytes_sent for b, p in zip(bottom, run.predicted)]
                ax.plot(ranks, tops, "k_", ms=14, mew=2)
                bottom = [b + v for b, v in zip(bottom, values)]
        ax.plot([], [], "k_", ms=14, mew=2, label="formula (cumulative)")
        ax.set_xticks(list(ranks), [f"rank {r}\n" + "\n".join(f"{a} {c[a]}" for a in TRAFFIC_AXES if getattr(run.spec, a) > 1)
                                    for r, c in zip(ranks, run.coords)], fontsize=8)
        ax.set(ylabel="bytes sent in the step", title=f"ledger by axis, {run.spec.degrees}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
