"""Chapter 04's figure: what each MLP layout costs in collectives and bytes (a pure function of a Report)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.costs import tensor_parallel as costs
from wmdist.course.report import Report
from wmdist.ui.render import eng_axis

def layouts_figure(report: Report, *, rank: int = 0) -> Figure:
    """One bar per MLP layout: bytes rank `rank` sent (the ledger), the formula's total as a black tick, and
    its collectives by kind on the bar's label."""
    def count(quantity: str, layout: str) -> int:
        return report.counts(quantity=quantity, case=layout, rank=rank)[0].measured

    layouts = list(costs.MLP_LAYOUTS)
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(7.6, 0.9 + 0.62 * len(layouts)))
        fig.subplots_adjust(left=0.02, right=0.98, bottom=0.22, top=0.86)
    for i, layout in enumerate(layouts):
        total = report.counts(quantity="bytes sent", phase="total", case=layout, rank=rank)[0]
        calls = {op: count(f"{op} calls", layout) for op in ("all-reduce", "all-gather")}
        ax.barh(i + 0.18, total.measured, height=0.42, color="tab:blue", alpha=0.85,
                label="ledger" if i == 0 else None)
        ax.plot([total.predicted], [i + 0.18], "k|", ms=16, mew=2, label="formula" if i == 0 else None)
        ops = ", ".join(f"{n} {op}" for op, n in calls.items() if n) or "no collective"
        ax.annotate(f"{layout}: {total.measured:,} B in {count('collectives', layout)} collectives ({ops})",
                    (0, i - 0.2), xycoords=ax.get_yaxis_transform(), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=9)
    ax.set_ylim(len(layouts) - 0.5, -0.6)
    ax.set_yticks([])
    ax.set_xlabel(f"bytes rank {rank} sent in the demo (ledger)")
    ax.set_title(f"MLP layouts on {report.world_size} ranks: collectives and bytes", fontsize=10, loc="left")
    ax.legend(fontsize=8.5, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)
    eng_axis(ax.xaxis, "B")
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
