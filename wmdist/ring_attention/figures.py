"""Figures for chapter 06: the traffic panel's six views and the load-balance timelines (pure functions)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.ring_attention.traffic import RingMeasurement, TrafficConfig, TrafficResult
from wmdist.base.spans import Span
from wmdist.ui.render import FONT, SMALL, axes_grid, eng_axis, log2_axis
from wmdist.ui.timeline import timeline_figure, timelines_figure

COLORS = {"DP": "tab:orange", "TP": "tab:purple", "CP": "tab:blue"}
MARGINS = (0.16, 0.68, 0.14, 0.9)          # the legend sits right of the plot, never over a curve


def _f(values: tuple[int, ...] | list[int]) -> list[float]:
    return [float(v) for v in values]      # floats: FLOP counts pass 2^63, which numpy keeps as objects


def _axes(fig: Figure, title: str, xlabel: str, ylabel: str, yunit: str) -> plt.Axes:
    """One log-log axes in `fig` (reused), titled on the left, the y axis in engineering units of `yunit`."""
    ax = axes_grid(fig, margins=MARGINS)[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=FONT, loc="left")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    eng_axis(ax.yaxis, yunit)
    return ax


def _finish(ax: plt.Axes, xs: list[float], mark: float | None = None) -> None:
    """Integer ticks on the x axis, a dotted line at the configured value, the legend beside the plot."""
    log2_axis(ax.xaxis, [int(x) for x in xs])
    if mark is not None:
        ax.axvline(mark, color="0.5", ls=":", lw=1, label="this setting")
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def draw_sent(fig: Figure, c: TrafficConfig, r: TrafficResult, measured: RingMeasurement | None) -> None:
    """Forward K, V bytes per rank against S: N-1 sends and the paper's N, and the run's ledger."""
    ax = _axes(fig, "forward K, V bytes sent per rank", "S (tokens)", "bytes", "B")
    s = _f(r.s_grid)
    ax.plot(s, _f(r.sent_s), color="tab:blue", lw=2, label="N-1 sends (no return)")
    ax.plot(s, _f(r.sent_paper_s), color="tab:red", ls="--", label="N sends (paper's loop)")
    if measured is not None:
        ax.plot([measured.seq_len] * len(measured.sent), _f(measured.sent), "ko", ms=6,
                label=f"measured, N={measured.world_size}")
    _finish(ax, s, c.seq_len)


def draw_flops(fig: Figure, c: TrafficConfig, r: TrafficResult) -> None:
    """Arithmetic grows like S², traffic like S: the two against S on one log axis."""
    ax = _axes(fig, "arithmetic ~ S², traffic ~ S (all ranks)", "S (tokens)", "FLOP or bytes", "")
    s = _f(r.s_grid)
    ax.plot(s, _f(r.flops_s), color="tab:green", lw=2, label="attention FLOP")
    ax.plot(s, _f(r.total_sent_s), color="tab:blue", lw=2, label="K, V bytes sent")
    _finish(ax, s, c.seq_len)


def draw_memory(fig: Figure, c: TrafficConfig, r: TrafficResult, measured: RingMeasurement | None) -> None:
    """What a rank holds: K, V blocks, score tiles; against the full S x S scores of one process."""
    ax = _axes(fig, "memory per rank", "S (tokens)", "bytes", "B")
    s = _f(r.s_grid)
    ax.plot(s, _f(r.kv_storage_s), color="tab:blue", lw=2, label="K, V held (2 blocks)")
    ax.plot(s, [float(r.scores_blocked)] * len(s), color="tab:green", lw=2, label="score tiles (2)")
    ax.plot(s, _f(r.scores_full_s), color="tab:red", ls="--", label="full S x S scores\n(one process)")
    if measured is not None:
        ax.plot([measured.seq_len] * len(measured.peak), _f(measured.peak), "ko", ms=6,
                label="measured peak per rank")
    _finish(ax, s, c.seq_len)


def draw_overlap(fig: Figure, c: TrafficConfig, r: TrafficResult) -> None:
    """One ring step: compute ~ c² against the next block's send ~ c; the send hides where compute is larger."""
    ax = _axes(fig, f"overlap on {c.device}", "c = S/N tokens per rank", "time per ring step", "s")
    blocks = [2 ** i for i in range(4, 17)]
    scale = r.step_compute_s / r.tokens_per_rank ** 2, r.step_comm_s / r.tokens_per_rank
    ax.plot(blocks, [scale[0] * x * x for x in blocks], color="tab:green", lw=2, label="compute one step ~ c²")
    ax.plot(blocks, [scale[1] * x for x in blocks], color="tab:blue", lw=2, label="send next K, V ~ c")
    ax.axvline(r.min_block, color="k", lw=1, label=f"c* = {r.min_block:,}: hides above")
    ax.plot([r.tokens_per_rank], [r.step_compute_s], "o", ms=8, color="tab:green" if r.hides else "tab:red",
            label=f"this setting: c = {r.tokens_per_rank:,}")
    _finish(ax, blocks)


def draw_parallel_s(fig: Figure, c: TrafficConfig, r: TrafficResult) -> None:
    """DP, TP and CP bytes per rank for one layer and step, against S."""
    ax = _axes(fig, "bytes per rank, one layer and step", "S (tokens)", "bytes", "B")
    s = _f(r.s_grid)
    for k, ys in r.parallel_s.items():
        ax.plot(s, _f(ys), color=COLORS[k], lw=2, label=k)
    _finish(ax, s, c.seq_len)


def draw_parallel_w(fig: Figure, c: TrafficConfig, r: TrafficResult) -> None:
    """The same three against the model width h, at this S."""
    ax = _axes(fig, f"same, against width h (S = {c.seq_len:,})", "h = heads x head width", "bytes", "B")
    w = _f(r.width_grid)
    for k, ys in r.parallel_w.items():
        ax.plot(w, _f(ys), color=COLORS[k], lw=2, label=k)
    _finish(ax, w, c.width)


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
    return [Span(row=sp.row, start=sp.start - t0, end=sp.end - t0, kind=sp.kind, label=sp.label) for sp in spans]


def _detached(fig: Figure) -> Figure:
    """`fig`, no longer tracked by pyplot: returned from a notebook cell it is displayed once, by its repr.

    (A figure pyplot still tracks is also shown by the inline backend at the end of a cell whenever anything
    in the cell drew interactively, rendering the repr included: then it appears twice.)
    """
    plt.close(fig)
    return fig


def _balance(spans: dict[str, tuple[Span, ...]], cpu_s: dict[str, list[float]]) -> Figure:
    layouts = list(spans)
    fig, axes = plt.subplots(len(layouts), 2, figsize=(9.0, 1.2 + 2.0 * len(layouts)), layout="constrained",
                             squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    for i, layout in enumerate(layouts):
        t0 = min(sp.start for sp in spans[layout])           # each layout's run from its own start
        timeline_figure(_since(spans[layout], t0), title=f"{layout}: one causal forward", ax=axes[i, 0])
        ranks = range(len(cpu_s[layout]))
        axes[i, 1].barh(list(ranks), [1e3 * t for t in cpu_s[layout]], color="tab:green")
        axes[i, 1].invert_yaxis()
        axes[i, 1].set(title="compute CPU ms (median)", xlabel="ms", ylabel="rank", yticks=list(ranks))
    return fig
