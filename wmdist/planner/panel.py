"""PlannerPanel: a published model shape on a cluster, its fastest layouts that fit, and the chosen one's step and memory.

Menus and sliders set a PlannerConfig (explore.py: model and GPU presets, GPU count, batch, context, which
ranked layout to show); compute() is explore.planner_view, the planner's physics on the panel's narrowed,
bounded space (panel_search.py; no processes) with one PlanCache per panel, so the prefetcher's look-ahead and a control moved back cost a look-up. The views
come from .figures; the key numbers name, for every term, the chapter whose demo checked its formula.
There is no "run it": a cluster is not on this machine (the notebook runs the small end instead).
"""
from __future__ import annotations

import html

from wmdist.costs.units import seconds
from wmdist.memory.footprint import format_bytes
from wmdist.planner.breakdown import TERMS
from wmdist.planner.explore import (
    CHECKED_IN,
    MEMORY_CHAPTER,
    PLACEMENT_CHAPTER,
    PlanCache,
    PlannerConfig,
    SEARCH_RULE,
    PlannerView,
    planner_view,
)
from wmdist.planner.figures import draw_memory, draw_steps
from wmdist.planner.rank import Plan
from wmdist.ui.panel import Panel, View

LAYOUT_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batch", "virtual", "recompute")


def layout_table(view: PlannerView) -> str:
    """The ranked layouts as a small HTML table: degrees, step, MFU, memory; the chosen row in bold."""
    head = "".join(f"<th>{h}</th>" for h in ("#", "dp", "tp", "pp", "cp", "ep", "ZeRO", "b", "v", "recompute",
                                             "step", "MFU", "memory"))
    rows = []
    for i, p in enumerate(view.plans, 1):
        cells = [str(i), *(str(getattr(p.layout, f)) for f in LAYOUT_COLUMNS), seconds(p.step.total),
                 f"{100 * p.step.mfu:.1f}%", format_bytes(p.memory["total"])]
        style = " style='font-weight:bold'" if p is view.chosen else ""
        rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def terms_text(plan: Plan) -> str:
    """Each non-zero term of the chosen step with its seconds, its link tier for an axis, and the chapter that
    checked its formula on real ranks."""
    parts = []
    for t in TERMS:
        value = plan.step.terms[t]
        if value <= 0 and t != "compute":
            continue
        tier = ""
        if t in plan.step.axes:
            tier = ", in a node" if plan.step.axes[t].in_node else ", across nodes"
        parts.append(f"{t} <b>{seconds(value)}</b>{tier} <i>(ch. {html.escape(CHECKED_IN[t])})</i>")
    return "; ".join(parts)


def summary(view: PlannerView) -> str:
    """The numbers to take away, as HTML."""
    c, job = view.config, view.job
    if view.chosen is None:
        return (f"<b>Nothing fits</b>: every layout the panel tries of {html.escape(c.model)} ({job.model.params / 1e9:.0f}B "
                f"parameters) on {c.gpus:,} {html.escape(c.gpu)} needs more than "
                f"{format_bytes(job.cluster.hbm_bytes)} on some GPU. Add GPUs.")
    p = view.chosen
    number = view.plans.index(p) + 1
    return (f"<b>Layout #{number}</b> of {len(view.plans)}: {html.escape(p.layout.describe())}<br>"
            f"<b>Step {seconds(p.step.total)}</b>, <b>MFU {100 * p.step.mfu:.1f}%</b> at the {c.gpu}'s stated "
            f"efficiency {job.cluster.efficiency:.2f}; memory <b>{format_bytes(p.memory['total'])}</b> of "
            f"{format_bytes(p.hbm_bytes)} (ch. {MEMORY_CHAPTER}'s calculator; most of it "
            f"{', '.join(k.replace('_', ' ') for k in p.limit)})<br>"
            f"Terms: {terms_text(p)}. Link tiers from the mesh order (ch. {PLACEMENT_CHAPTER}).")


class PlannerPanel(Panel):
    """The fastest fitting layouts of a model on a cluster: step time by term, memory against HBM.

    `result` is the current PlannerView; `cache` the rankings computed so far.
    """

    hint = ("switch the context from 8K to 128K and see which axis the best layouts add; then halve the GPUs "
            "until nothing fits, and read which tensors fill the memory bar.")
    control_groups = {"job": ("model", "gpu", "gpus", "batch_tokens", "seq_len"), "show": ("pick",)}

    def __init__(self, config: PlannerConfig | None = None):
        self.cache = PlanCache()
        super().__init__(config or PlannerConfig())

    def compute(self, config: PlannerConfig) -> PlannerView:
        return planner_view(config, cache=self.cache)

    def views(self) -> list[View]:
        return [View("step time", lambda fig, c, r: draw_steps(fig, r)),
                View("memory", lambda fig, c, r: draw_memory(fig, r))]

    def describe(self, config: PlannerConfig, result: PlannerView) -> str:
        return summary(result)

    def details(self, config: PlannerConfig, result: PlannerView) -> str:
        if not result.plans:
            return ""
        return ("The fastest layouts that fit (b: sequences per microbatch, v: virtual stages). "
                + html.escape(SEARCH_RULE) + "<br>" + layout_table(result))
