"""Figures for the all-reduce scaling model: pure functions of a ScalingCurve (and a Fit)."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.costs.units import seconds
from wmdist.data_parallel.scaling import MIB, Fit, Measurement, ScalingCurve
from wmdist.ui.render import FONT, SMALL, axes_grid, eng_axis, integer_axis

MARGINS = (0.1, 0.72, 0.14, 0.9)      # left, right, bottom, top: the legend goes right of the plot
# Sizes measured, in order: blue, orange, green, red, ... (no yellow on white)
SIZE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:cyan")


def _workers(ax: plt.Axes, curve: ScalingCurve, title: str, ylabel: str) -> None:
    """The N axis (integer ticks), the title on the left and a legend beside the plot."""
    ax.set_title(title, fontsize=FONT, loc="left")
    ax.set(xlabel="workers N", ylabel=ylabel, xlim=(1, curve.workers[-1]))
    integer_axis(ax.xaxis)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def draw_speedup(fig: Figure, curve: ScalingCurve) -> None:
    """Speedup total(1)/total(N) against the ideal N, the fastest N marked."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    n = curve.workers
    ax.plot(n, n, color="0.6", ls=":", label="ideal (= N)")
    ax.plot(n, curve.speedup, color="tab:purple", lw=2, label="speedup")
    best = curve.fastest
    ax.plot([best], [curve.speedup[best - 1]], "o", color="tab:purple", ms=7, label=f"fastest step: N = {best}")
    ax.set_ylim(0, max(curve.speedup) * 1.25 + 0.5)
    _workers(ax, curve, "speedup = step time at N = 1 / step time at N", "speedup (×)")


def draw_efficiency(fig: Figure, curve: ScalingCurve) -> None:
    """Efficiency = speedup / N."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    ax.axhline(1.0, color="0.6", ls=":", label="ideal (1)")
    ax.plot(curve.workers, curve.efficiency, color="tab:orange", lw=2, label="efficiency")
    ax.set_ylim(0, 1.05)
    _workers(ax, curve, "efficiency = speedup / N", "efficiency")


def draw_allreduce(fig: Figure, curve: ScalingCurve) -> None:
    """T(N) and its two terms, and the byte limit 2βG the byte term tends to."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    n = curve.workers
    ax.plot(n, curve.allreduce, color="k", lw=2, label="T(N)")
    ax.plot(n, curve.latency, color="tab:red", label="latency 2(N-1)α")
    ax.plot(n, curve.bandwidth, color="tab:blue", label="bytes 2(N-1)/N βG")
    ax.axhline(curve.byte_limit, color="tab:blue", ls="--", lw=1, label="2βG (byte limit)")
    ax.set_ylim(0, max(max(curve.allreduce), curve.byte_limit) * 1.08)
    eng_axis(ax.yaxis, "s")
    _workers(ax, curve, "all-reduce time T(N) = 2(N-1)α + 2(N-1)/N βG", "time")


def draw_step(fig: Figure, curve: ScalingCurve) -> None:
    """Step time C/N + T(N) on a log axis, with its two parts."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    n = curve.workers
    ax.plot(n, curve.compute, color="tab:green", label="compute C/N")
    ax.plot(n, curve.allreduce, color="k", label="all-reduce T(N) (0 at N = 1: off the log axis)")
    ax.plot(n, curve.total, color="tab:purple", lw=2, label="step = C/N + T(N)")
    ax.set_yscale("log")
    positive = [v for v in (*curve.compute, *curve.allreduce, *curve.total) if v > 0]
    ax.set_ylim(min(positive) / 1.5, max(positive) * 1.5)
    eng_axis(ax.yaxis, "s")
    _workers(ax, curve, "time per step (log scale)", "time")


def draw_fit(fig: Figure, fit: Fit | None) -> None:
    """This machine: measured all-reduce times against the fitted model, the fitted numbers beside them."""
    ax = axes_grid(fig, margins=(0.1, 0.6, 0.14, 0.9))[0]
    if fit is None:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "Press \"Measure on this machine\" to time real all-reduces\nand fit α and β here.",
                ha="center", va="center", fontsize=FONT + 1, transform=ax.transAxes)
        return
    ax.set_axis_on()
    measured_axes(ax, fit)
    ax.legend(fontsize=SMALL, loc="upper left", frameon=False)
    fig.text(0.63, 0.5, fit_summary(fit), va="center", family="monospace", fontsize=FONT)


def measured_axes(ax: plt.Axes, fit: Fit) -> None:
    """Measured median times (markers) and the fitted model (lines), one colour per size."""
    sizes = sorted({m.payload_bytes for m in fit.measurements})
    for i, size in enumerate(sizes):
        pts: Sequence[Measurement] = sorted((m for m in fit.measurements if m.payload_bytes == size),
                                            key=lambda m: m.world_size)
        ns = [m.world_size for m in pts]
        color = SIZE_COLORS[i % len(SIZE_COLORS)]
        ax.plot(ns, [m.seconds for m in pts], "o", color=color,
                label=f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB")
        grid = list(range(2, max(ns) + 1))
        ax.plot(grid, [fit.predict(k, size) for k in grid], "-", color=color, lw=1)
    ax.set(xlabel="workers N", ylabel="all-reduce time", yscale="log")
    ax.set_title("this machine: measured (dots) vs fit (lines)", fontsize=FONT, loc="left")
    eng_axis(ax.yaxis, "s")
    integer_axis(ax.xaxis)
    ax.legend(fontsize=SMALL)


def fit_summary(fit: Fit) -> str:
    """The fitted numbers as a few lines of text."""
    return (f"fitted on {len(fit.measurements)} points\n"
            f"α = {seconds(fit.alpha)} per round\n"
            f"β = {seconds(fit.beta)} per byte\n"
            f"contention g = {fit.contention:.2g}\n"
            f"  (on {fit.cores} cores)\n"
            f"  ({fit.bandwidth_bytes_per_s / 1e9:.3g} GB/s)\n"
            f"median rel. error {fit.median_rel_error:.1%}\n"
            f"max rel. error    {fit.max_rel_error:.1%}")


def fit_figure(fit: Fit) -> Figure:
    """Measured all-reduce times against the fitted model (left) and the fitted numbers (right)."""
    with plt.ioff():
        fig, (ax, text) = plt.subplots(1, 2, figsize=(9.0, 3.4), layout="constrained", width_ratios=(2, 1))
    measured_axes(ax, fit)
    text.set_axis_off()
    text.text(0, 0.5, fit_summary(fit), va="center", family="monospace", fontsize=9)
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
