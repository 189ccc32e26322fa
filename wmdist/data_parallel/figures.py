"""Figures for the all-reduce scaling model: pure functions of a ScalingCurve (and a Fit)."""
from __future__ import annotations

import math
import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator

from wmdist.costs.units import seconds
from wmdist.data_parallel.scaling import MIB, Fit, Measurement, ScalingCurve
from wmdist.ui.render import DPI, FONT, SMALL, axes_grid, eng_axis, integer_axis, whole_figure_extent

MARGINS = (0.1, 0.72, 0.14, 0.9)      # left, right, bottom, top: the legend goes right of the plot
# Sizes measured, in order: blue, orange, green, red, ... (no yellow on white)
SIZE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:cyan")
FIT_FIGURE_PX = (760, 360)          # the notebook's fit figure; the panel draws the same at its own size


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


FIT_MARGINS = (0.13, 0.6, 0.14, 0.9)   # the plot on the left; the fitted numbers and the legend right of it
SUMMARY_WIDTH = 27                     # characters per line of the fitted numbers (monospace, in the right column)


def draw_fit(fig: Figure, fit: Fit | None) -> None:
    """This machine: measured all-reduce times against the fitted model; the fitted numbers and the legend beside them.

    The legend stands in the right-hand column, under the numbers, so it never covers a measured point.
    """
    ax = axes_grid(fig, margins=FIT_MARGINS)[0]
    if fit is None:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "Press \"Measure on this machine\" to time real all-reduces\nand fit α and β here.",
                ha="center", va="center", fontsize=FONT + 1, transform=ax.transAxes)
        return
    ax.set_axis_on()
    measured_axes(ax, fit)
    column = FIT_MARGINS[1] + 0.03
    fig.text(column, FIT_MARGINS[3], fit_summary(fit), va="top", family="monospace", fontsize=SMALL)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=SMALL, loc="lower left", frameon=False,
               bbox_to_anchor=(column - 0.01, FIT_MARGINS[2] - 0.04), title="payload (dots: measured)",
               title_fontsize=SMALL, alignment="left")


def log_ticks(low: float, high: float, *, at_least: int = 3) -> list[float]:
    """Tick values for a log axis from `low` to `high`, at least `at_least` of them when the range allows.

    Decades first; a range narrower than that gets 1-2-5 steps, then every mantissa 1..9, and one
    narrower still `at_least` values evenly spaced in log, to the fewest significant digits that keep them apart.
    """
    lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
    for mantissas in ((1,), (1, 2, 5), range(1, 10)):
        ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in mantissas if low <= m * 10.0 ** e <= high]
        if len(ticks) >= at_least:
            return ticks
    inner = np.geomspace(low, high, at_least + 2)[1:-1]
    for digits in range(2, 16):
        ticks = [float(f"{v:.{digits}g}") for v in inner]
        if len(set(ticks)) == len(ticks):
            return ticks
    return [float(v) for v in inner]


def measured_axes(ax: plt.Axes, fit: Fit) -> None:
    """Measured median times (markers) and the fitted model (lines), one colour per size, on a log time axis."""
    sizes = sorted({m.payload_bytes for m in fit.measurements})
    shown = []
    for i, size in enumerate(sizes):
        pts: Sequence[Measurement] = sorted((m for m in fit.measurements if m.payload_bytes == size),
                                            key=lambda m: m.world_size)
        ns = [m.world_size for m in pts]
        color = SIZE_COLORS[i % len(SIZE_COLORS)]
        ax.plot(ns, [m.seconds for m in pts], "o", color=color,
                label=f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB")
        grid = list(range(2, max(ns) + 1))
        model = [fit.predict(k, size) for k in grid]
        ax.plot(grid, model, "-", color=color, lw=1)
        shown += [m.seconds for m in pts] + [t for t in model if t > 0]
    ax.set(xlabel="workers N", ylabel="all-reduce time", yscale="log")
    low, high = min(shown) / 1.2, max(shown) * 1.2
    ax.set_ylim(low, high)
    ax.set_title("this machine: measured (dots) vs fit (lines)", fontsize=FONT, loc="left")
    eng_axis(ax.yaxis, "s")
    ax.yaxis.set_major_locator(FixedLocator(log_ticks(low, high)))
    integer_axis(ax.xaxis)


def fit_summary(fit: Fit, *, width: int = SUMMARY_WIDTH) -> str:
    """The fitted numbers as a few lines of text; a term the timings do not resolve says so, and what would."""
    def term(symbol: str, name: str) -> list[str]:
        if fit.resolved(name):
            return [f"{symbol} = {fit.describe(name)}"] if name == "alpha" else \
                [f"β = {seconds(fit.beta)} per byte", f"  ({fit.bandwidth_bytes_per_s / 1e9:.3g} GB/s)"]
        return textwrap.wrap(f"{symbol} {fit.describe(name)}", width, subsequent_indent="  ")
    return "\n".join([f"fitted on {len(fit.measurements)} points", *term("α", "alpha"), *term("β", "beta"),
                      f"contention g = {fit.contention:.2g}", f"  (on {fit.cores} cores)",
                      f"median rel. error {fit.median_rel_error:.1%}", f"max rel. error    {fit.max_rel_error:.1%}"])


def fit_figure(fit: Fit) -> Figure:
    """Measured all-reduce times against the fitted model (left), the fitted numbers and legend (right)."""
    with plt.ioff():
        fig = plt.figure(figsize=(FIT_FIGURE_PX[0] / DPI, FIT_FIGURE_PX[1] / DPI), dpi=DPI)
    draw_fit(fig, fit)
    whole_figure_extent(fig)     # measured tick labels and numbers change width from run to run
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
