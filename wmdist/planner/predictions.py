"""The answer to chapter 11's prompt: which axis Llama 3 405B's 128K-context run adds to its 8K layout, and what
the long context costs by the planner's breakdown.

Read from the published layouts (published.py: Dubey et al. 2024, Table 4) and the planner's completion of
them (scoring.published_plan). Here, not in the notebook, so nothing above the prompt's buttons gives the
answer away (issue 33); it runs only at the press.
"""
from __future__ import annotations

from dataclasses import replace

from wmdist.costs.units import seconds
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.model import TrainingJob
from wmdist.planner.published import RUNS, PublishedRun
from wmdist.planner.rank import plan
from wmdist.planner.scoring import EFFICIENCY, published_plan, published_utilisation, run_job
from wmdist.ui.choose import ChoiceAnswer

SHORT, LONG = "llama3-405b-8k-16384gpu", "llama3-405b-128k-16384gpu"
AXES = ("dp", "tp", "pp", "cp")


def _run(name: str) -> PublishedRun:
    return next(r for r in RUNS if r.name == name)


def added_axes(short: PublishedRun, long: PublishedRun) -> list[str]:
    """The axes whose degree is 1 in `short`'s layout and more than 1 in `long`'s."""
    return [a for a in AXES if getattr(short.layout, a) == 1 < getattr(long.layout, a)]


def planner_axes(job: TrainingJob, layout: ParallelLayout, factor: int) -> list[str]:
    """The axes that can take `factor` from dp in `layout` (dp / factor, that axis x factor) and still fit in
    the job's memory by the planner: what the planner would move dp's share to."""
    out = []
    for axis in AXES[1:]:
        trial = replace(layout, dp=layout.dp // factor, **{axis: getattr(layout, axis) * factor})
        try:
            if plan(job, trial).fits:
                out.append(axis)
        except ValueError:           # a degree the model cannot take (tp past the KV heads, pp past the layers)
            continue
    return out


def _plans() -> tuple[PublishedRun, PublishedRun, dict]:
    short, long = _run(SHORT), _run(LONG)
    return short, long, {r.name: published_plan(run_job(r, efficiency=EFFICIENCY[r.gpu]), r) for r in (short, long)}


def added_axis_formula() -> tuple[str | None, dict[str, float]]:
    """The pure half: the planner's pick (the one axis that can take dp's factor and still fit the 128K job) and
    each axis's exposed seconds per step in the planner's prediction of the 128K run."""
    short, long, plans = _plans()
    factor = short.layout.dp // long.layout.dp
    lay = short.layout
    start = replace(plans[LONG].layout, dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, virtual=1)
    picks = planner_axes(run_job(long, efficiency=EFFICIENCY[long.gpu]), start, factor)
    return (picks[0] if len(picks) == 1 else None), {a: plans[LONG].step.axes[a].exposed for a in AXES}


def added_axis() -> ChoiceAnswer:
    """The axis the 128K run adds (from the published layouts), the planner's pick, and each axis's exposed
    seconds per step in the planner's prediction of that run."""
    short, long, plans = _plans()
    added = added_axes(short, long)
    if len(added) != 1:
        raise ValueError(f"the two layouts differ in {added or 'no axis'}: the question needs exactly one added")
    pick, values = added_axis_formula()
    p8, p128 = plans[SHORT].step, plans[LONG].step
    axis = added[0]
    lay8, lay128 = short.layout, long.layout
    factor = lay8.dp // lay128.dp
    return ChoiceAnswer(
        measured=axis, formula=pick,
        formula_text=f"the one axis that can take dp's factor {factor} and still fit (rank.plan)",
        values=values,
        why=f"the published 128K layout keeps tp={lay128.tp} and pp={lay128.pp}, and cuts every sequence into "
            f"{lay128.cp} pieces along {axis} (dp falls from {lay8.dp} to {lay128.dp}: the same 16M tokens are "
            f"now {long.batch_tokens // long.seq_len} sequences). The ring's K, V passes run beside the attention "
            f"they feed, so the planner exposes {seconds(p128.axes[axis].exposed)} of them; the long context costs "
            f"arithmetic instead: attention grows with the context, compute per step {seconds(p8.compute)} at 8K "
            f"and {seconds(p128.compute)} at 128K, predicted MFU {100 * p8.mfu:.0f}% and {100 * p128.mfu:.0f}% "
            f"(published {100 * published_utilisation(short):.0f}% and {100 * published_utilisation(long):.0f}%). "
            "The values listed are each axis's "
            "exposed time per step at 128K")
