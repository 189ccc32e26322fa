"""Plans: a layout's predicted step and memory together, the fitting layouts ranked, and one layout judged.

`rank_layouts` returns the `top` fastest layouts that fit, exactly, without evaluating all of them: every
candidate first gets a lower bound on its step (its compute and the bubble that compute alone implies, both
of which the full breakdown only adds to), candidates are evaluated in order of that bound, and the search
stops when the next bound is no faster than the `top`-th plan found. `fitting_layouts` walks them all.

A layout fits when the calculator's bytes on its fullest GPU are at most the GPU's HBM (memory.gpu_memory).
Nothing is kept back for the allocator's fragmentation, workspaces or communication buffers: those are
among what the model leaves out.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace

from wmdist.costs.units import seconds, si
from wmdist.memory.footprint import KINDS, format_bytes
from wmdist.planner.breakdown import TERMS, StepBreakdown, breakdown, partial_breakdown, with_data_parallel
from wmdist.planner.layout import ParallelLayout, candidate_layouts, check_layout
from wmdist.planner.memory import gpu_memory
from wmdist.planner.model import TrainingJob
from wmdist.planner.stage import StageWork, bubble_ratio, stage_work


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One layout of a job: its predicted step, the bytes on its fullest GPU, and whether they fit in HBM."""
    layout: ParallelLayout
    step: StepBreakdown
    memory: dict[str, int]
    hbm_bytes: int

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.hbm_bytes

    @property
    def limit(self) -> list[str]:
        """The tensor kinds that make up most of the memory, largest first, until they pass half of it."""
        kinds = sorted((k for k in KINDS if self.memory[k]), key=lambda k: -self.memory[k])
        out, held = [], 0
        for k in kinds:
            out.append(k)
            held += self.memory[k]
            if 2 * held >= self.memory["total"]:
                break
        return out


def plan(job: TrainingJob, layout: ParallelLayout) -> Plan:
    """Breakdown and memory of one layout (a ValueError if the job cannot run it at all)."""
    check_layout(job, layout)
    return Plan(layout=layout, step=breakdown(job, layout), memory=gpu_memory(job, layout),
                hbm_bytes=job.cluster.hbm_bytes)


def lower_bound(job: TrainingJob, layout: ParallelLayout, work: StageWork) -> float:
    """Seconds no breakdown of `layout` can beat, from its stage work (stage.stage_work): the slowest stage's
    compute and the bubble on that compute alone (the breakdown applies the bubble's ratio to a busy time of
    compute or more, and only adds terms)."""
    compute = work.flops / (job.cluster.efficiency * job.cluster.peak_flops)
    return compute * (1 + bubble_ratio(work, layout.microbatches(job), layout.virtual))


def fitting_layouts(job: TrainingJob, **bounds: object) -> Iterator[Plan]:
    """Every candidate layout (layout.candidate_layouts with `bounds`) that fits, in enumeration order."""
    for layout in candidate_layouts(job, **bounds):  # type: ignore[arg-type]
        p = plan(job, layout)
        if p.fits:
            yield p


def search_space(job: TrainingJob) -> dict[str, tuple]:
    """The ZeRO stages and recompute kinds rank_layouts tries by default: every stage, and every recompute kind
    but selective with FlashAttention (then it recomputes nothing the kernel does not: the same step and bytes
    as none)."""
    kinds = ("none", "full") if job.flash_attention else ("none", "selective", "full")
    return {"zero_stages": (0, 1, 2, 3), "recompute": kinds}


def rank_layouts(job: TrainingJob, *, top: int = 10, **bounds: object) -> list[Plan]:
    """The `top` fitting layouts with the shortest predicted step, fastest first (exact; module docstring).

    bounds: candidate_layouts' options; zero_stages and recompute default to search_space(job)."""
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    options = {**search_space(job), **bounds}
    works: dict[tuple, StageWork] = {}        # stage_work depends on these five fields only

    def bound(lay: ParallelLayout) -> float:
        key = (lay.tp, lay.pp, lay.cp, lay.dp, lay.recompute)
        if key not in works:
            works[key] = stage_work(job, lay)
        return lower_bound(job, lay, works[key])
    queue = sorted(((bound(lay), i, lay) for i, lay in enumerate(candidate_layouts(job, **options))),
                   key=lambda t: t[:2])   # type: ignore[arg-type]
    best: list[tuple[float, int, Plan]] = []
    partials: dict[ParallelLayout, StepBreakdown] = {}
    for bound, i, layout in queue:
        if len(best) >= top and bound >= best[-1][0]:
            break
        key = replace(layout, zero=0)
        if key not in partials:
            partials[key] = partial_breakdown(job, layout)
        if len(best) >= top and partials[key].total >= best[-1][0]:
            continue
        memory = gpu_memory(job, layout)
        if memory["total"] > job.cluster.hbm_bytes:
            continue
        p = Plan(layout=layout, step=with_data_parallel(job, layout, partials[key]), memory=memory,
                 hbm_bytes=job.cluster.hbm_bytes)
        bisect.insort(best, (p.step.total, i, p), key=lambda t: t[:2])
        del best[top:]
    return [p for _, _, p in best]


def judge(job: TrainingJob, layout: ParallelLayout) -> str:
    """Why `layout` fits or does not (the tensors that take the memory) and its predicted step and MFU."""
    p = plan(job, layout)
    mem, hbm = p.memory, p.hbm_bytes
    verdict = "fits" if p.fits else "does NOT fit"
    share = ", ".join(f"{k} {format_bytes(mem[k])} ({100 * mem[k] / mem['total']:.0f}%)" for k in p.limit)
    lines = [f"{layout.describe()}",
             (f"  memory: {format_bytes(mem['total'])} on the fullest GPU, {verdict} in {format_bytes(hbm)} of HBM; "
             f"most of it: {share}"),
             (f"  step: {seconds(p.step.total)}, MFU {100 * p.step.mfu:.1f}% "
             f"({si(p.step.model_flops / p.step.total / p.step.gpus, 'FLOP/s')} per GPU of model FLOPs)"),
             "  " + format_terms(p.step)]
    return "\n".join(lines)


def format_terms(step: StepBreakdown) -> str:
    """'compute 5.28 s | bubble 0.78 s | tp 0.57 s (in node) | ...': the non-zero terms, axes with their tier."""
    parts = []
    for name in TERMS:
        value = step.terms[name]
        if value > 0 or name == "compute":
            where = "" if name not in step.axes else (" (in node)" if step.axes[name].in_node else " (network)")
            parts.append(f"{name} {seconds(value)}{where}")
    return " | ".join(parts)


def format_table(plans: list[Plan]) -> str:
    """The ranked plans as a table: layout, step, MFU, memory, then each term's seconds."""
    head = ["#", "dp", "tp", "pp", "cp", "ep", "zero", "b", "v", "recompute", "step", "MFU", "memory",
            *TERMS[:2], *TERMS[2:]]
    rows = [head]
    for i, p in enumerate(plans, 1):
        lay = p.layout
        rows.append([str(i), *(str(getattr(lay, a)) for a in ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batch",
                                                               "virtual")), lay.recompute, seconds(p.step.total),
                     f"{100 * p.step.mfu:.1f}%", format_bytes(p.memory["total"]),
                     *(seconds(p.step.terms[t]) for t in TERMS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
