"""Chapter 11's published-runs table: each run predicted at its GPU type's stated efficiency, and the misses explained.

`scoring.score_runs` fits the efficiencies and searches every run's best layout (minutes); the notebook
needs only the comparison, so `compare_runs` takes the stored constants (scoring.EFFICIENCY, which that fit
produced) and the planner's completion of each published layout (scoring.published_plan). A run whose
prediction is more than MISS_POINTS from the printed figure is a miss, and MISSES says why, in terms of
what the model leaves out; `unexplained` lists the misses without a reason (the tests want none).
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.planner.published import RUNS, PublishedRun
from wmdist.planner.rank import Plan
from wmdist.planner.scoring import EFFICIENCY, predicted_utilisation, published_plan, published_utilisation, run_job

MISS_POINTS = 5.0          # the median goal: a run further off than that is named and explained

SHAPE = ("one efficiency per GPU type is fitted on mid-sized layers; matmul kernels run faster on wide "
         "shapes and slower on narrow ones, which the model does not see")
MISSES: dict[str, str] = {
    "mcore24-1.7b": f"a 2,048-wide model on 1 GPU per replica: {SHAPE}, so it over-predicts the small end",
    "mcore24-7.1b": f"a 4,096-wide model: {SHAPE} (over-predicted, as for 1.7B)",
    "korthikanti22-530b": f"a 20,480-wide layer: {SHAPE} (under-predicted)",
    "korthikanti22-1t": f"a 25,600-wide layer: {SHAPE} (under-predicted, as for 530B)",
    "narayanan21-529.6b": f"a 20,480-wide layer: {SHAPE} (under-predicted)",
    "narayanan21-1008.0b": f"a 25,600-wide layer: {SHAPE} (under-predicted)",
    "llama3-405b-128k-16384gpu": "the planner prices cp as chapter 06's ring, hidden behind the attention it feeds; "
                                 "Llama 3 all-gathers K and V before computing attention (Dubey et al. 2024, "
                                 "section 3.3.2), an exchange that waits instead of overlapping",
    "mt-nlg-530b-3360gpu": "from 2,240 to 3,360 GPUs the published utilisation falls faster than the planner's; "
                           "the likely cause is more nodes sharing the network (congestion, stragglers), which "
                           "the model does not see",
    "mt-nlg-530b-2800gpu": "as for 3,360 GPUs: likely the network's congestion, growing with the node count",
}


@dataclass(frozen=True, kw_only=True)
class RunComparison:
    """One published run against the planner: printed and predicted utilisation (fractions of peak)."""
    run: PublishedRun
    plan: Plan
    published: float
    predicted: float

    @property
    def points(self) -> float:
        """predicted - published, in percentage points."""
        return 100 * (self.predicted - self.published)

    @property
    def miss(self) -> bool:
        return abs(self.points) > MISS_POINTS

    @property
    def why(self) -> str:
        return MISSES.get(self.run.name, "") if self.miss else ""


def compare_runs(runs: tuple[PublishedRun, ...] = RUNS) -> list[RunComparison]:
    """Every run predicted at scoring.EFFICIENCY of its GPU type, its published layout completed by the planner."""
    out = []
    for r in runs:
        p = published_plan(run_job(r, efficiency=EFFICIENCY[r.gpu]), r)
        out.append(RunComparison(run=r, plan=p, published=published_utilisation(r), predicted=predicted_utilisation(p, r)))
    return out


def unexplained(rows: list[RunComparison]) -> list[str]:
    """The misses MISSES has no reason for."""
    return [c.run.name for c in rows if c.miss and not c.why]


def comparison_table(rows: list[RunComparison]) -> str:
    """One line per run: source, GPUs, layout as printed, utilisation printed and predicted, the gap; misses marked."""
    head = f"{'run':27s} {'source':16s} {'GPUs':>6s} {'counted':8s} {'printed':>7s} {'planner':>7s} {'gap':>6s}"
    lines = [head]
    for c in rows:
        cite = f"{c.run.citation.authors.split()[0].rstrip(',')} {c.run.citation.year}"
        lines.append(f"{c.run.name:27s} {cite[:16]:16s} {c.run.gpus:6,d} {c.run.flops_counted:8s} "
                     f"{100 * c.published:6.1f}% {100 * c.predicted:6.1f}% {c.points:+6.1f}" + ("  miss" if c.miss else ""))
    return "\n".join(lines)
