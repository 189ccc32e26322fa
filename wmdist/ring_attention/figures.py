"""Figures for chapter 06: the traffic widget's six plots and the load-balance timelines (pure functions)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from wmdist.ring_attention.traffic import RingMeasurement, TrafficConfig, TrafficResult
from wmdist.spans import Span
from wmdist.ui import timeline_figure, timelines_figure

COLORS = {"DP": "tab:orange", "TP": "tab:purple", "CP": "tab:blue"}
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
# Tick labels 10^k as plain text: matplotlib's default writes them as mathtext, whose parsing was a third
# of a redraw.
DECADES = FuncFormatter(lambda y, _: f"10{str(round(math.log10(y))).translate(_SUPERSCRIPT)}" if y > 0 else "")


def _f(values: tuple[int, ...] | list[int]) -> list[float]:
    return [float(v) for v in values]


def _finish(ax: plt.Axes, title: str, xlabel: str, ylabel: str, mark: float | None = None) -> None:
    """Title, axis labels and legend, alike on every axes; `mark`: a dotted line at the configured value."""
    if mark is not None:
        ax.axvline(mark, color="0.5", ls=":", lw=1)
    ax.set_title(title, fontsize=10)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=8)


def _blank(into: Figure | None) -> tuple[Figure, list[plt.Axes]]:
    """A new figure of 3 x 2 axes, or `into` (made by traffic_figure) emptied of its curves.

    Making axes is most of a redraw's cost (their ticks), so a slider reuses
    the six axes and only replaces what is drawn in them.
    """
    if into is None:
        fig, axes = plt.subplots(3, 2, figsize=(8.6, 9.6))
        # Fixed margins and no minor ticks: on log axes spanning ten decades, a layout engine and minor tick
        # labels made each redraw take seconds.
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.05, top=0.97, wspace=0.3, hspace=0.42)
        return fig, list(axes.flat)
    for ax in into.axes:
        for artist in [*ax.lines, *ax.collections, *ax.patches]:
            artist.remove()
        ax.relim()
        ax.set_prop_cycle(None)
    return into, list(into.axes)


def traffic_figure(c: TrafficConfig, r: TrafficResult, measured: RingMeasurement | None = None,
                   into: Figure | None = None) -> Figure:
    """Six plots: bytes per rank, FLOPs vs traffic, memory per rank, overlap, DP/TP/CP vs S and vs width.

    `into`: a figure this function made before, redrawn in place (same axes).
    """
    with plt.ioff():                    # drawing included: a pyplot figure drawn on interactively is shown again
        return _traffic(c, r, measured, into)


def _traffic(c: TrafficConfig, r: TrafficResult, measured: RingMeasurement | None, into: Figure | None) -> Figure:
    fig, axes = _blank(into)
    s = [float(x) for x in r.s_grid]                 # floats: FLOP counts pass 2^63, which numpy keeps as objects
    ax = axes[0]
    ax.loglog(s, _f(r.sent_s), color="tab:blue", label="N-1 sends (no return)")
    ax.loglog(s, _f(r.sent_paper_s), color="tab:red", ls="--", label="N sends (paper's loop)")
    if measured is not None:
        ax.loglog([measured.seq_len] * len(measured.sent), measured.sent, "ko", ms=5,
                  label=f"measured, N={measured.world_size}")
    _finish(ax, "forward K, V bytes sent per rank", "S (tokens)", "bytes", mark=c.seq_len)

    ax = axes[1]
    ax.loglog(s, _f(r.flops_s), color="tab:green", label="attention FLOPs (all ranks)")
    ax.loglog(s, _f(r.total_sent_s), color="tab:blue", label="K, V bytes sent (all ranks)")
    _finish(ax, "arithmetic ~ S^2, traffic ~ S", "S (tokens)", "FLOPs / bytes", mark=c.seq_len)

    ax = axes[2]
    ax.loglog(s, _f(r.kv_storage_s), color="tab:blue", label="K, V held per rank (2 blocks)")
    ax.loglog(s, [r.scores_blocked] * len(s), color="tab:green", label="score tiles per rank (2)")
    ax.loglog(s, _f(r.scores_full_s), color="tab:red", ls="--", label="full S x S scores (1 process)")
    if measured is not None:
        ax.loglog([measured.seq_len] * len(measured.peak), measured.peak, "ko", ms=5, label="measured peak per rank")
    _finish(ax, "memory per rank", "S (tokens)", "bytes", mark=c.seq_len)

    ax = axes[3]
    blocks = [2 ** i for i in range(4, 17)]
    scale = r.step_compute_s / r.tokens_per_rank ** 2, r.step_comm_s / r.tokens_per_rank
    ax.loglog(blocks, [scale[0] * x * x for x in blocks], color="tab:green", label="compute one step ~ c^2")
    ax.loglog(blocks, [scale[1] * x for x in blocks], color="tab:blue", label="send next K, V ~ c")
    ax.axvline(r.min_block, color="k", lw=1, label=f"c* = {r.min_block}")
    ax.plot([r.tokens_per_rank], [r.step_compute_s], "o", color="tab:green" if r.hides else "tab:red")
    _finish(ax, f"overlap on {c.device}", "c = S/N tokens per rank", "seconds per step")

    ax = axes[4]
    for k, ys in r.parallel_s.items():
        ax.loglog(s, _f(ys), color=COLORS[k], label=k)
    _finish(ax, "bytes per rank, one layer and step", "S (tokens)", "bytes", mark=c.seq_len)

    ax = axes[5]
    for k, ys in r.parallel_w.items():
        ax.loglog(_f(r.width_grid), _f(ys), color=COLORS[k], label=k)
    _finish(ax, f"same, over width h (S = {c.seq_len:,})", "h = heads x head width", "bytes", mark=c.width)
    for ax in fig.axes:
        ax.minorticks_off()
        ax.xaxis.set_major_formatter(DECADES)
        ax.yaxis.set_major_formatter(DECADES)
    return fig


def balance_figure(spans: dict[str, tuple[Span, ...]], cpu_s: dict[str, list[float]]) -> Figure:
    """Per-rank timelines of the causal forward for each layout (left) and compute CPU time per rank (right)."""
    with plt.ioff():                    # drawing included: a pyplot figure drawn on interactively is shown again
        return _detached(_balance(spans, cpu_s))


def ring_timelines(forward: tuple[Span, ...], backward: tuple[Span, ...]) -> Figure:
    """Per-rank timelines of one ring forward and backward (block work in green, waits for transfers in blue)."""
    t0 = min(sp.start for sp in (*forward, *backward))     # time from the forward's first span
    with plt.ioff():
        return _detached(timelines_figure({"forward": _since(forward, t0), "backward": _since(backward, t0)}))


def _since(spans: tuple[Span, ...], t0: float) -> list[Span]:
    """The spans with time measured from t0."""
    return [Span(sp.row, sp.start - t0, sp.end - t0, sp.kind, sp.label) for sp in spans]


def _detached(fig: Figure) -> Figure:
    """`fig`, no longer tracked by pyplot: returned from a notebook cell it is displayed once, by its repr.

    (A figure pyplot still tracks is also shown by the inline backend at the end of a cell whenever anything
    in the cell drew interactively, rendering the repr included: then it appears twice.)
    """
    plt.close(fig)
    return fig


def _balance(spans: dict[str, tuple[Span, ...]], cpu_s: dict[str, list[float]]) -> Figure:
    layouts = list(spans)
    fig, axes = plt.subplots(len(layouts), 2, figsize=(12, 1.2 + 2.0 * len(layouts)), layout="constrained",
                             squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    for i, layout in enumerate(layouts):
        t0 = min(sp.start for sp in spans[layout])           # each layout's run from its own start
        timeline_figure(_since(spans[layout], t0), title=f"{layout}: one causal forward", ax=axes[i, 0])
        ranks = range(len(cpu_s[layout]))
        axes[i, 1].barh(list(ranks), [1e3 * t for t in cpu_s[layout]], color="tab:green")
        axes[i, 1].invert_yaxis()
        axes[i, 1].set(title="compute CPU ms (median)", xlabel="ms", ylabel="rank", yticks=list(ranks))
    return fig
