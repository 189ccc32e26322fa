"""Figures for the all-reduce scaling model: pure functions of a ScalingCurve (and a Fit)."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.data_parallel.scaling import MIB, Fit, Measurement, ScalingCurve


def scaling_figure(curve: ScalingCurve, fit: Fit | None = None) -> Figure:
    """Four panels (T(N) and its terms, step time, speedup, efficiency), plus a fifth
    with measured all-reduce times against the fitted model when `fit` is given."""
    n = curve.workers
    cols = 3 if fit is not None else 2
    with plt.ioff():
        fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 6.4), layout="constrained")
    ax = axes.flat

    ax[0].plot(n, curve.allreduce, color="k", label="T(N)")
    ax[0].plot(n, curve.latency, color="tab:red", label="latency 2(N-1)α")
    ax[0].plot(n, curve.bandwidth, color="tab:blue", label="bytes 2(N-1)/N βG")
    ax[0].axhline(curve.byte_limit, color="tab:blue", ls="--", lw=1, label="2βG (byte limit)")
    ax[0].set(title="all-reduce time", xlabel="workers N", ylabel="seconds")

    ax[1].plot(n, curve.compute, color="tab:green", label="compute C/N")
    ax[1].plot(n, curve.allreduce, color="k", label="all-reduce T(N)")
    ax[1].plot(n, curve.total, color="tab:purple", lw=2, label="step = C/N + T(N)")
    ax[1].set(title="time per step", xlabel="workers N", ylabel="seconds", yscale="log")

    speed_ax, eff_ax = (ax[2], ax[3]) if fit is None else (ax[3], ax[4])
    speed_ax.plot(n, n, color="0.6", ls=":", label="ideal (= N)")
    speed_ax.plot(n, curve.speedup, color="tab:purple", label="speedup")
    speed_ax.set(title="speedup total(1)/total(N)", xlabel="workers N", ylabel="speedup (x)")

    eff_ax.axhline(1.0, color="0.6", ls=":")
    eff_ax.plot(n, curve.efficiency, color="tab:orange", label="efficiency")
    eff_ax.set(title="efficiency = speedup / N", xlabel="workers N", ylabel="efficiency", ylim=(0, 1.05))

    if fit is not None:
        measured_axes(ax[2], fit)
        ax[5].set_axis_off()
        ax[5].text(0, 0.5, fit_summary(fit), va="center", family="monospace", fontsize=9)
    for a in (ax[0], ax[1], speed_ax):
        a.legend(fontsize=9)
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig


def measured_axes(ax: plt.Axes, fit: Fit) -> None:
    """Measured median times (markers) and the fitted model (lines), one colour per size."""
    sizes = sorted({m.payload_bytes for m in fit.measurements})
    for i, size in enumerate(sizes):
        pts: Sequence[Measurement] = sorted((m for m in fit.measurements if m.payload_bytes == size),
                                            key=lambda m: m.world_size)
        ns = [m.world_size for m in pts]
        color = plt.cm.viridis(i / max(1, len(sizes) - 1))
        ax.plot(ns, [m.seconds for m in pts], "o", color=color,
                label=f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB")
        grid = list(range(2, max(ns) + 1))
        ax.plot(grid, [fit.predict(k, size) for k in grid], "-", color=color, lw=1)
    ax.set(title="this machine: measured (dots) vs fit", xlabel="workers N", ylabel="seconds", yscale="log")
    ax.legend(fontsize=9)


def fit_summary(fit: Fit) -> str:
    """The fitted numbers as a few lines of text."""
    return (f"fitted on {len(fit.measurements)} points\n"
            f"α = {fit.alpha * 1e6:.3g} µs per round\n"
            f"β = {fit.beta:.3g} s/B\n"
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
