"""Figures for chapter 08: gather bytes per step, step/sample timelines, Picard's error and work, when it pays.

Pure functions of the chapter's results (and of the cost formulas), each
returning one matplotlib Figure made under plt.ioff().
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from wmdist.costs import diffusion as dcost
from wmdist.diffusion.results import PicardRun, StepTimelines
from wmdist.diffusion.tradeoff import TradeoffRow
from wmdist.ui import timelines_figure


def gather_bytes_figure(batch: int, tokens: int, dim: int, channels: int, world_sizes: list[int], *,
                        measured: dict[int, dict[str, int]] | None = None) -> Figure:
    """Most bytes any rank sends per solver step, gathering K/V (2D per token) or x (C per token), against N.

    Lines are `costs.diffusion.token_all_gather_bytes`; `measured` maps N to
    {"kv": bytes, "x": bytes} from the ledger (dots).
    """
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    for mode, elems, color in (("kv", 2 * dim, "tab:blue"), ("x", channels, "tab:green")):
        most = [max(dcost.token_all_gather_bytes(batch, tokens, elems, n, r)["sent"] for r in range(n))
                for n in world_sizes]
        label = "K/V (2D numbers per token)" if mode == "kv" else "x (C numbers per token)"
        ax.plot(world_sizes, most, "-", color=color, label=f"gather {label}")
        ax.axhline(batch * tokens * elems * 4, color=color, ls=":", lw=1)
        if measured:
            ns = sorted(measured)
            ax.plot(ns, [measured[n][mode] for n in ns], "o", color=color, ms=5)
    ax.set(title="bytes a rank sends per step (dots: ledger; dotted: the whole tensor)",
           xlabel="ranks N", ylabel="bytes per step")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def steps_figure(data: StepTimelines, world_size: int) -> Figure:
    """The three timelines of `step_parallel.steps_demo`, titled with how many ranks computed at once."""
    titled = {f"{case}: {data.concurrency[case]:.2f} of {world_size} ranks busy on average "
              f"(ideal {data.ideal[case]:.2f})": spans for case, spans in data.timelines.items()}
    return timelines_figure(titled)


def picard_figure(run: PicardRun) -> Figure:
    """Left: max error of the whole trajectory per round. Right: evaluations per round and busiest-rank slots."""
    r = run.result
    rounds = list(range(1, r.rounds + 1))
    with plt.ioff():
        fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6), layout="constrained")
    floor = run.rounding_level / 100                       # where a bitwise-zero error is drawn on a log axis
    left.semilogy(rounds, [max(e, floor) for e in r.errors], "o-", color="tab:purple", label="Picard iterate")
    left.axhline(run.rounding_level, color="0.4", ls="--", lw=1, label="rounding level of the sum")
    left.set(xlabel="round", ylabel="max |iterate - sequential|")
    left.set_title(f"error vs the sequential sampler\n(an error of 0 is drawn at {floor:.0e})", fontsize=10, loc="left")
    left.legend(fontsize=8)
    slots = [-(-e // run.world_size) for e in r.evaluations]
    right.bar(rounds, r.evaluations, color="tab:orange", label="evaluations, all ranks")
    right.bar(rounds, slots, color="tab:red", width=0.5, label=f"slots on the busiest of {run.world_size} ranks")
    right.set(xlabel="round", ylabel="evaluations")
    right.set_title(f"work: {r.total_evaluations} evaluations in {run.critical_path} slots\n"
                    f"(sequential: {run.steps} in {run.steps})", fontsize=10, loc="left")
    right.legend(fontsize=8)
    return fig


def tradeoff_figure(rows: list[TradeoffRow]) -> Figure:
    """Sequential slots (left) and total evaluations (right) against N for each method in `rows`."""
    methods = list(dict.fromkeys(r.method for r in rows if r.method != "sequential"))
    sequential = next(r for r in rows if r.method == "sequential")
    sizes = sorted({r.world_size for r in rows if r.method != "sequential"})
    with plt.ioff():
        fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6), layout="constrained")
    for ax, field, title in ((left, "slots", "evaluation slots in sequence"),
                             (right, "evaluations", "evaluations, all ranks together")):
        ax.axhline(getattr(sequential, field), color="k", ls="--", lw=1, label="sequential sampler")
        for method, color in zip(methods, ("tab:purple", "tab:orange", "tab:green")):
            pts = sorted((r.world_size, getattr(r, field)) for r in rows if r.method == method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=method)
        ax.set(title=title, xlabel="ranks N", xscale="log")
        ax.set_yscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    return fig
