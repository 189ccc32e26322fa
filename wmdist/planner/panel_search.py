"""The planner panel's own search: the planner's physics (breakdown, gpu_memory) on a narrowed, bounded space of
layouts, so that a move of the panel costs tens of milliseconds; the CLI (`wmdist plan`) searches the full space
and may find a faster layout (measured: 0-2.7% faster on 405B and GPT-3 jobs of 1,024-16,384 GPUs; 5.4% on 7.1B on
64 GPUs, with 2 sequences per microbatch).

The rule, stated on the page: every mesh shape dp x tp x pp x cp (tp within a node) is a candidate, with one
sequence per microbatch, the largest interleaving v <= MAX_VIRTUAL the schedule allows (the bubble (P-1)/(vM)
only falls with v), and for MoE the largest ep that divides the experts and dp (the most experts split). The
secondary knobs come from SECONDARY: ZeRO-1 without recompute, else the first pair in that order that fits.
Every shape's breakdown without dp (breakdown.partial_breakdown, which neither ZeRO stage changes) is computed;
shapes are tried in that order, and the search stops when the next one cannot beat the TOP-th plan found (dp's
traffic and recompute only add), or after MAX_EVALUATIONS calls of partial_breakdown or gpu_memory (each a
fraction of a millisecond). `Search.evaluations` says how many it spent, so a test bounds a move's work
without a clock.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from wmdist.planner.breakdown import partial_breakdown, with_data_parallel
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.memory import gpu_memory
from wmdist.planner.model import TrainingJob
from wmdist.planner.rank import Plan

MAX_VIRTUAL = 4
MAX_EVALUATIONS = 600
# (ZeRO stage, recompute) in the order the panel tries them; the last is the leanest in memory (ZeRO-1 with full
# recompute is left out: ZeRO-3 with it holds less, and its extra traffic is dp's, mostly hidden).
SECONDARY: tuple[tuple[int, str], ...] = ((1, "none"), (3, "none"), (3, "full"))


@dataclass(frozen=True, kw_only=True)
class Search:
    """The fastest plans the panel's search found (fastest first), the evaluations it spent, and whether it
    stopped at MAX_EVALUATIONS (then a layout it did not try might be faster, or fit where none it tried did)."""
    plans: tuple[Plan, ...]
    evaluations: int
    exhausted: bool


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def closed_virtual(job: TrainingJob, pp: int, dp: int) -> int:
    """The largest v <= MAX_VIRTUAL with pp*v <= layers, and 1 unless pp > 1 divides the microbatches (the
    interleaved schedule's rule, layout.check_layout), at one sequence per microbatch."""
    micro = -(-job.sequences // dp)
    if pp == 1 or micro % pp:
        return 1
    return max(v for v in range(1, MAX_VIRTUAL + 1) if pp * v <= job.model.layers)


def panel_shapes(job: TrainingJob) -> list[ParallelLayout]:
    """One layout per mesh shape check_layout accepts (tp within a node), b=1, v by closed_virtual, ZeRO-1, no
    recompute; the order is the enumeration's."""
    m, n = job.model, job.gpus
    out = []
    for tp in (t for t in _divisors(n) if t <= job.cluster.gpus_per_node
               and not (m.heads % t or m.kv_heads % t or m.ffn % t)):
        for pp in (p for p in _divisors(n // tp) if p <= m.layers):
            for cp in (c for c in _divisors(n // (tp * pp)) if job.seq_len % c == 0):
                dp = n // (tp * pp * cp)
                if job.sequences % dp:
                    continue
                v = closed_virtual(job, pp, dp)
                ep = max(e for e in _divisors(dp) if m.experts % e == 0) if m.experts else 1
                out.append(ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=1, micro_batch=1, virtual=v,
                                          recompute="none"))
    return out


def panel_search(job: TrainingJob, *, top: int) -> Search:
    """The `top` fastest fitting layouts of the panel's space (module docstring), fastest first."""
    hbm, spent = job.cluster.hbm_bytes, 0
    shapes = panel_shapes(job)
    partials = [partial_breakdown(job, lay) for lay in shapes]     # every term but dp's, which only adds
    spent += len(shapes)
    queue = sorted(range(len(shapes)), key=lambda i: (partials[i].total, i))
    best: list[tuple[float, int, Plan]] = []
    for i in queue:
        if len(best) >= top and partials[i].total >= best[-1][0]:
            break          # ZeRO-3 only adds dp's traffic and full recompute only adds work: none can beat it
        if spent >= MAX_EVALUATIONS:
            return Search(plans=tuple(p for _, _, p in best), evaluations=spent, exhausted=True)
        for zero, recompute in SECONDARY:
            layout = replace(shapes[i], zero=zero, recompute=recompute)
            memory = gpu_memory(job, layout)
            spent += 1
            if memory["total"] > hbm:
                continue
            partial = partials[i] if recompute == "none" else partial_breakdown(job, layout)
            spent += recompute != "none"
            step = with_data_parallel(job, layout, partial)
            bisect.insort(best, (step.total, i, Plan(layout=layout, step=step, memory=memory, hbm_bytes=hbm)),
                          key=lambda t: t[:2])
            del best[top:]
            break
    return Search(plans=tuple(p for _, _, p in best), evaluations=spent, exhausted=False)
