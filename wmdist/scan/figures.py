"""Figures for chapter 07: pure functions of the demos' data (and of costs.scan), made under plt.ioff()."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from wmdist.costs.scan import blelloch_ops, brent_steps, chunked_ops, hillis_steele_ops, sequential_ops
from wmdist.scan.results import ByteSweep, CellSplit, PicardSweeps, ScanTimes
from wmdist.base.spans import Span
from wmdist.ui import timelines_figure


def _subplots(*args: Any, **kwargs: Any) -> tuple[Figure, Any]:
    """plt.subplots made under plt.ioff() and released from pyplot at once.

    A figure pyplot still holds can be shown twice in Jupyter (once returned,
    once flushed at the end of the cell, as happens to a kernel's first
    figure); a released one is shown only where it is returned or displayed.
    """
    with plt.ioff():
        fig, axes = plt.subplots(*args, **kwargs)
    plt.close(fig)
    return fig, axes


STYLE = {("gathered", False): ("tab:red", "-o"), ("gathered", True): ("tab:orange", "--o"),
         ("handoff", False): ("tab:blue", "-s")}


def bytes_figure(sweep: ByteSweep) -> Figure:
    """Bytes all ranks sent, against T (flat) and against the state size n, per combine and A structure."""
    fig, (left, right) = _subplots(1, 2, figsize=(9.0, 3.8), layout="constrained")
    series = [("gathered", False, "all-gather, dense A"), ("gathered", True, "all-gather, diagonal A"),
              ("handoff", False, "hand-off, any A (one state per hop)")]
    for combine, diagonal, label in series:
        color, style = STYLE[(combine, diagonal)]
        by_t = sweep.select(combine, diagonal=diagonal, over="steps")
        left.plot([r.steps for r in by_t], [r.total for r in by_t], style, color=color, label=label)
        by_n = sweep.select(combine, diagonal=diagonal, over="state_size")
        right.plot([r.state_size for r in by_n], [r.total for r in by_n], style, color=color, label=label)
    left.set(xscale="log", yscale="log", xlabel="time steps T", ylabel="bytes sent, all ranks together")
    left.set_title(f"vs T (n = {sweep.fixed_state_size}, N = {sweep.world_size}): flat", fontsize=10, loc="left")
    right.set(xscale="log", yscale="log", xlabel="state size n", ylabel="bytes sent, all ranks together")
    right.set_title(f"vs n (T = {sweep.fixed_steps}): n² for dense summaries, n otherwise", fontsize=10, loc="left")
    right.legend(fontsize=8)
    return fig


def ops_figure(*, steps: Sequence[int] = (4, 16, 64, 256, 1024, 4096), workers_at: int = 1024,
               times: Sequence[ScanTimes] = ()) -> Figure:
    """Work and depth of the loop and the scans vs T; parallel steps vs workers; measured times if given."""
    if times:
        fig, grid = _subplots(2, 2, figsize=(9.0, 6.2), layout="constrained")
        ax = list(grid.flat)
    else:
        fig, ax = _subplots(1, 3, figsize=(9.0, 3.6), layout="constrained")
    schedules = [("loop", sequential_ops, "k"), ("Hillis-Steele", hillis_steele_ops, "tab:red"),
                 ("Blelloch (torch generic)", blelloch_ops, "tab:blue")]
    for name, ops, color in schedules:
        counts = [ops(t) for t in steps]
        ax[0].plot(steps, [c.composes + c.applies for c in counts], "-o", color=color, label=name)
        ax[1].plot(steps, [c.depth for c in counts], "-o", color=color, label=name)
    ax[0].set(xscale="log", yscale="log", xlabel="T", ylabel="operations (composes + applies)", title="total work")
    ax[1].set(xscale="log", yscale="log", xlabel="T", ylabel="dependent steps", title="depth")
    t = workers_at
    workers = [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if p <= t]
    for name, ops, color in schedules:
        ax[2].plot(workers, [brent_steps(ops(t), p) for p in workers], "-", color=color, label=name)
    ax[2].plot(workers, [chunked_ops(t, p).depth for p in workers], "-", color="tab:green",
               label="N chunks on N ranks")
    ax[2].set(xscale="log", yscale="log", xlabel="workers P", ylabel="parallel steps (Brent bound)",
              title=f"when it pays, T = {t}")
    for a in ax[:3]:
        a.legend(fontsize=8)
    if times:
        # colour: which state, line style: which method (one short legend, not one entry per line)
        methods = (("loop", "-o", "loop_s"), ("Hillis-Steele", "--s", "hillis_steele_s"),
                   ("torch scan", ":^", "torch_scan_s"))
        for st, color in zip(times, ("tab:purple", "tab:brown", "tab:gray")):
            for _, style, field in methods:
                ax[3].plot(st.steps, getattr(st, field), style, color=color)
        ax[3].set(xscale="log", yscale="log", xlabel="T", ylabel="seconds (best of repeats)",
                  title="this machine, one process")
        handles = [Line2D([], [], color=c, lw=2, label=f"{'diagonal' if st.diagonal else 'dense'} n={st.state_size}")
                   for st, c in zip(times, ("tab:purple", "tab:brown", "tab:gray"))]
        handles += [Line2D([], [], color="k", ls=style[:-1], marker=style[-1], label=name)
                    for name, style, _ in methods]
        ax[3].legend(handles=handles, fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                     frameon=False)                    # below the axes: the measured lines fill every corner
    return fig


def from_zero_figure(split: CellSplit) -> Figure:
    """Error of chunks started from zero at every step; chunk boundaries dashed; the rounding bound dotted."""
    errors = split.from_zero_errors
    steps = range(1, len(errors) + 1)
    fig, ax = _subplots(figsize=(8, 3.4), layout="constrained")
    ax.semilogy([t for t, e in zip(steps, errors) if e > 0], [e for e in errors if e > 0], "-o", ms=3,
                color="tab:red", label="chunks from zero (0 where not drawn: exact)")
    ax.axhline(split.bound, color="k", ls=":", label="largest gap rounding could explain")
    edge = 0
    for size in split.chunk_sizes[:-1]:
        edge += size
        ax.axvline(edge + 0.5, color="0.6", ls="--", lw=1)
    ax.set(xlabel="time step t (dashed: chunk boundaries)", ylabel="max |h_t - exact|",
           title=f"{len(split.chunk_sizes)} chunks, every chunk after the first started from zero")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def sweeps_figure(sweeps: PicardSweeps) -> Figure:
    """Left: error and start change per sweep (log). Right: work and depth so far, as multiples of the loop's T."""
    k = list(range(1, sweeps.sweeps + 1))
    fig, (left, right) = _subplots(1, 2, figsize=(9.0, 3.6), layout="constrained")
    for values, style, label in ((sweeps.errors, "-o", "error vs the loop"),
                                 (sweeps.changes, "--s", "largest start change (what ranks see)")):
        shown = [(i, v) for i, v in zip(k, values) if v > 0]
        left.semilogy([i for i, _ in shown], [v for _, v in shown], style, label=label)
    exact = [i for i, e in zip(k, sweeps.errors) if e == 0]
    if exact:
        left.axvline(exact[0], color="tab:green", ls=":", label=f"exact (error 0) from sweep {exact[0]}")
    left.set(xlabel="sweep", ylabel="max abs", title=f"{len(sweeps.chunk_sizes)} chunks in parallel", xticks=k)
    left.legend(fontsize=8)
    right.plot(k, [w / sweeps.loop_steps for w in sweeps.work], "-o", color="tab:red", label="work / loop's work")
    right.plot(k, [d / sweeps.loop_steps for d in sweeps.depth], "-s", color="tab:blue",
               label="depth / loop's depth")
    right.axhline(1.0, color="k", ls=":", lw=1)
    right.set(xlabel="sweep", ylabel="multiple of the loop (T steps)", title="what the sweeps cost", xticks=k)
    right.legend(fontsize=8)
    return fig


def schedules_figure(timelines: dict[str, list[Span]]) -> Figure:
    """Per-rank timelines of several schemes, stacked on one time axis (wmdist.ui.timelines_figure)."""
    fig = timelines_figure(timelines, row_label="rank", unit="ms")
    plt.close(fig)                                      # see _subplots
    return fig
