"""Figures for chapter 09: pure functions of a PatternsResult and of a measured MeshRun; no widgets, no display."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.costs.mesh import AXES
from wmdist.memory.footprint import format_bytes
from wmdist.mesh.demos import MeshRun
from wmdist.mesh.patterns import PATTERNS, PatternsResult, Placement

COLORS = {"dp": "tab:blue", "tp": "tab:red", "pp": "tab:green", "cp": "tab:purple"}
MAX_PLACEMENTS = 8


def format_seconds(s: float) -> str:
    """e.g. 3.2e-05 -> '32 µs', 0.0041 -> '4.1 ms'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def measured_for(result: PatternsResult, measured: MeshRun | None) -> dict[str, int] | None:
    """The ledger's bytes per axis for the rank the widget shows, if `measured` ran the widget's current sizes."""
    if measured is None or measured.spec.shape != result.config.shape:
        return None
    rank = measured.coords.index(result.coords)
    return {a: measured.measured[rank][a].bytes_sent for a in AXES}


def bytes_axes(ax: plt.Axes, result: PatternsResult, ledger: dict[str, int] | None) -> None:
    """Bytes per axis for one rank (log scale), messages in the label; the ledger's bytes as markers."""
    values = [max(result.traffic[a].bytes_sent, 1) for a in AXES]
    for i, a in enumerate(AXES):
        t = result.traffic[a]
        ax.barh(i + 0.18, values[i], height=0.42, color=COLORS[a], alpha=0.8)
        ax.text(1.2, i - 0.2, f"{PATTERNS[a]}: {format_bytes(t.bytes_sent)}, {t.messages} messages", va="center",
                fontsize=8)
    if ledger is not None:
        ax.plot([max(ledger[a], 1) for a in AXES], [i + 0.18 for i in range(len(AXES))], "kD", ms=6,
                label="measured (ledger)")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xscale("log")
    top = max(values) * 10
    ax.set_xlim(1, top)
    decades = [10 ** k for k in range(0, len(str(int(top))), 3)]          # 1 B, 1 kB, 1 MB, ...: no mathtext
    ax.set_xticks(decades, [format_bytes(d) for d in decades])
    ax.minorticks_off()
    ax.set_ylim(len(AXES) - 0.5, -0.6)
    ax.set_yticks([])
    c = result.coords
    ax.set_title(f"bytes sent per step by one rank\n(dp {c['dp']}, tp {c['tp']}, pp stage {c['pp']}, cp {c['cp']})",
                 fontsize=9)
    ax.set_xlabel("bytes (log scale)")


def _unit(top: float) -> tuple[str, float]:
    """A time unit for an axis whose largest value is `top` seconds: (name, seconds per unit)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if top >= scale:
            return unit, scale
    return "ns", 1e-9


def time_axes(ax: plt.Axes, result: PatternsResult) -> None:
    """Each axis's time on the best placement's links: latency term (hatched) + bandwidth term."""
    best = result.best
    unit, scale = _unit(max(best.latency[a] + best.transfer[a] for a in AXES) or 1e-9)
    for i, a in enumerate(AXES):
        lat, tra = best.latency[a] / scale, best.transfer[a] / scale
        ax.barh(i + 0.18, lat, height=0.42, color=COLORS[a], alpha=0.35, hatch="//")
        ax.barh(i + 0.18, tra, left=lat, height=0.42, color=COLORS[a], alpha=0.85)
        if result.traffic[a].messages:
            kind = "latency-bound" if lat > tra else "bandwidth-bound"
            link = "fast" if best.inside[a] else "slow"
            ax.text(0, i - 0.2, f"{a.upper()}: {format_seconds((lat + tra) * scale)}, {kind}, {link} link",
                    va="center", fontsize=8)
    ax.set_xlim(0, max([(best.latency[a] + best.transfer[a]) / scale for a in AXES] + [1e-9]) * 1.1)
    ax.set_ylim(len(AXES) - 0.5, -0.6)
    ax.set_yticks([])
    ax.set_xlabel(f"{unit} per step")
    ax.set_title("time per axis on the best order's links\n(hatched: messages x latency; solid: bytes / bandwidth)",
                 fontsize=9)


def order_label(p: Placement, result: PatternsResult) -> str:
    """e.g. "tp·cp·dp·pp (in a node: dp, tp)": the order, and the axes of more than one rank that fit in a node."""
    inside = ", ".join(a for a in AXES if p.inside[a] and getattr(result.config, a) > 1) or "none"
    return f"{'·'.join(p.order)} (in a node: {inside})"


def placement_axes(ax: plt.Axes, result: PatternsResult) -> None:
    """Exposed time of each distinct placement, best first; the default order (tp fastest) outlined."""
    shown = list(result.placements[:MAX_PLACEMENTS])
    key = tuple(result.default.inside[a] for a in AXES)
    unit, scale = _unit(max(p.total for p in shown) or 1e-9)
    for i, p in enumerate(shown):
        default = tuple(p.inside[a] for a in AXES) == key
        ax.barh(i + 0.18, p.total / scale, height=0.42, color="tab:green" if i == 0 else "0.7",
                edgecolor="k" if default else "none", linewidth=1.5)
        ax.text(0, i - 0.2, f"{order_label(p, result)}: {format_seconds(p.total)}", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(len(shown) - 0.5, -0.6)
    ax.set_xlim(0, max(p.total for p in shown) / scale * 1.1 or 1.0)
    ax.set_xlabel(f"exposed communication, {unit} per step")
    ax.set_title("Mesh orders on the two-level machine\n(green: best; outlined: default tp·cp·dp·pp)", fontsize=9)


def patterns_figure(result: PatternsResult, measured: MeshRun | None = None) -> Figure:
    """Bytes per pattern, time per pattern, and exposed time per placement, side by side."""
    with plt.ioff():
        fig, axes = plt.subplots(3, 1, figsize=(6.4, 8.4))
        fig.subplots_adjust(left=0.03, right=0.97, bottom=0.06, top=0.95, hspace=0.55)   # fixed: no layout pass
        bytes_axes(axes[0], result, measured_for(result, measured))
        time_axes(axes[1], result)
        placement_axes(axes[2], result)
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig


def ledger_figure(run: MeshRun) -> Figure:
    """Each rank's ledger split by axis (stacked bars), with each axis's formula total as a marker."""
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ranks = range(len(run.coords))
        bottom = [0] * len(run.coords)
        for a in AXES:
            values = [m[a].bytes_sent for m in run.measured]
            if any(values):
                ax.bar(ranks, values, bottom=bottom, color=COLORS[a], label=f"{a}/ (ledger)")
                tops = [b + p[a].bytes_sent for b, p in zip(bottom, run.predicted)]
                ax.plot(ranks, tops, "k_", ms=14, mew=2)
                bottom = [b + v for b, v in zip(bottom, values)]
        ax.plot([], [], "k_", ms=14, mew=2, label="formula (cumulative)")
        ax.set_xticks(list(ranks), [f"rank {r}\n" + "\n".join(f"{a} {c[a]}" for a in AXES if getattr(run.spec, a) > 1)
                                    for r, c in zip(ranks, run.coords)], fontsize=7)
        ax.set(ylabel="bytes sent in the step", title=f"ledger by axis, {run.spec.degrees}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
