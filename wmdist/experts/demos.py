"""Chapter 10 demos: the MoE layer on N expert-parallel ranks against one process, its all-to-alls counted.

`moe-ep` runs every routing case (random, skewed, one expert, local; k = 1 and 2) forward and
backward: outputs, input, router and expert gradients against the single-process layer, routing and
the rows each expert received bit for bit, and every rank's bytes in each all-to-all against
`costs.experts.rank_traffic` from the routing. `moe-capacity` adds a capacity factor: the drops
counted against `costs.experts.dropped`, the run equal to one process with the same capacity rule,
and different from the dropless layer exactly at the tokens that lost an assignment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist.comm import Context
from wmdist.course.compare import bound_ratio, worst
from wmdist.costs import experts as ecosts
from wmdist.course.experiment import Experiment, Verdict
from wmdist.experts.dispatch import ExpertLayout, ep_forward, expert_group, global_counts, sync_gradients
from wmdist.experts.moe import balance_loss
from wmdist.experts.reference import EXACT_WHY, WHY, LayerReference, aux_tolerance, layer_reference, layer_tolerance
from wmdist.experts.spec import LayerCase, LayerSpec, layer_spec
from wmdist.course.report import Check, Count, counts_per_rank, differ_check, exact_check, fact_check, max_abs_error

PHASES = ("dispatch", "combine", "combine backward", "dispatch backward")


@dataclass(frozen=True, kw_only=True)
class LayerRun:
    """What one rank computed in one case."""
    y: torch.Tensor                      # (T/N, d) its tokens' outputs
    dx: torch.Tensor                     # (T/N, d) their input gradient
    grads: dict[str, torch.Tensor]       # router (all-reduced) and this rank's experts, by name
    experts: torch.Tensor                # (T/N, k) its tokens' routing
    inputs: torch.Tensor                 # rows its experts received, expert by expert
    dropped: tuple[int, ...]             # per local expert: rows past capacity
    aux: float                           # its share of the balancing loss
    bytes: dict[str, tuple[int, int]]    # per ledger phase: (sent, received)


@dataclass(frozen=True)
class LayerRanks:
    """One rank's runs, in the spec's case order."""
    runs: tuple[LayerRun, ...]


def layer_rank(ctx: Context, spec: LayerSpec) -> LayerRanks:
    """Rank function: each case's layer forward and backward on this rank's T/N tokens and E/N experts."""
    torch.set_num_threads(1)
    layout, per, rows = ExpertLayout(ep=spec.world_size), spec.per_rank, spec.rows(ctx.rank)
    x_all, dout = spec.inputs()
    ep = expert_group(ctx, layout, spec.experts)
    runs = []
    for case, cap in zip(spec.cases, spec.capacities, strict=True):
        ctx.ledger.reset()
        moe = spec.layer(case)
        moe.keep_experts(ctx.rank * per, per)
        x = x_all[rows].clone().requires_grad_(True)
        res = ep_forward(moe, x, ep, cap=cap)
        aux = balance_loss(res.out.routing.probs, global_counts(ctx, res.out.counts), tokens=spec.tokens, k=case.k)
        ((res.out.y * dout[rows]).sum() + spec.aux_weight * aux).backward()
        sync_gradients(ctx, moe, layout)
        runs.append(LayerRun(y=res.out.y.detach(), dx=x.grad, grads={n: p.grad for n, p in moe.named_parameters()},
                             experts=res.out.routing.experts, inputs=res.inputs, dropped=tuple(res.dropped),
                             aux=float(aux.detach()), bytes={p: (t["bytes_sent"], t["bytes_recv"])
                                                    for p, t in ctx.ledger.by_phase(kind=None).items()}))
    return LayerRanks(tuple(runs))


def _grad_check(spec: LayerSpec, name: str, runs: list[LayerRun], ref: LayerReference) -> Check:
    """Every parameter a rank holds against the reference's, each to its own tolerance: the worst ratio."""
    rows = [(bound_ratio(g, ref.grads[n], layer_tolerance(spec, ref.grads[n])), f"{n} on rank {rank}")
            for rank, run in enumerate(runs) for n, g in run.grads.items()]
    ratio, where = rows[worst([r for r, _ in rows])]
    return Check(name=name, error=ratio, tolerance=1.0, reason=f"{WHY}; in units of each tensor's tolerance", detail=where)


def traffic_counts(spec: LayerSpec, runs: list[LayerRun], ref: LayerReference, case: str) -> list[Count]:
    """Each rank's bytes in the four all-to-alls and the counts exchange, against the formulas from the routing."""
    matrix = ecosts.rank_matrix([ref.experts[spec.rows(r)].reshape(-1).tolist() for r in range(len(runs))],
                                spec.experts)
    traffic = ecosts.rank_traffic(matrix, spec.width, 4)
    names = {"dispatch": "dispatch forward", "combine": "combine forward", "combine backward": "combine backward",
             "dispatch backward": "dispatch backward"}
    attrs = {"dispatch": "dispatch", "combine": "combine", "combine backward": "combine_backward",
             "dispatch backward": "dispatch_backward"}
    out: list[Count] = []
    for phase in PHASES:
        for side, what in ((0, "bytes sent"), (1, "bytes received")):
            out += counts_per_rank(what, [r.bytes[names[phase]][side] for r in runs],
                                   [getattr(t, attrs[phase])[side] for t in traffic], phase=phase, case=case)
    exchange = ecosts.counts_exchange_bytes(spec.experts, spec.world_size)
    out += counts_per_rank("bytes sent", [r.bytes["counts"][0] for r in runs], [exchange] * len(runs),
                           phase="counts", case=case)
    out += counts_per_rank("rows received by this rank's experts", [r.inputs.shape[0] for r in runs],
                           ecosts.rank_loads(ref.counts, spec.world_size), case=case)
    return out


def case_verdict(spec: LayerSpec, case: LayerCase, cap: int | None, runs: list[LayerRun]) -> tuple[list[Check],
                                                                                                   list[Count]]:
    """One case's checks and counts against the single-process layer with the same capacity rule."""
    ref = layer_reference(spec, case, cap)
    n, per, label = spec.world_size, spec.per_rank, case.name
    y, dx = torch.cat([r.y for r in runs]), torch.cat([r.dx for r in runs])
    starts = [sum(ref.counts[:r * per]) for r in range(n + 1)]
    checks = [
        exact_check(f"{label}: routing == one process", torch.cat([r.experts for r in runs]), ref.experts,
                    "which experts each token chose: integers, compared exactly"),
        exact_check(f"{label}: rows each expert received == one process",
                    torch.cat([r.inputs for r in runs]), ref.inputs[:starts[n]], EXACT_WHY),
        Check(name=f"{label}: output == one process", error=max_abs_error(y, ref.y), tolerance=layer_tolerance(spec, ref.y), reason=WHY),
        Check(name=f"{label}: input gradient == one process", error=max_abs_error(dx, ref.dx), tolerance=layer_tolerance(spec, ref.dx), reason=WHY),
        _grad_check(spec, f"{label}: router and expert gradients == one process", runs, ref),
        Check(name=f"{label}: balancing loss == one process", error=abs(sum(r.aux for r in runs) - ref.aux),
              tolerance=aux_tolerance(spec, ref.aux),
              reason="T positive terms in per-rank parts, two more roundings: (2(T-1)+2) 2^-24 |aux|"),
    ]
    exact = traffic_counts(spec, runs, ref, label)
    drops = [ecosts.dropped(ref.counts[r * per:(r + 1) * per], cap) for r in range(n)]
    exact += counts_per_rank("assignments dropped at this rank's experts", [sum(r.dropped) for r in runs], drops,
                             case=label)
    return checks, exact


def compare_layer(spec: LayerSpec, results: list[LayerRanks]) -> Verdict:
    """Every case against one process; bytes and drops against their formulas (see the module doc)."""
    checks: list[Check] = []
    exact: list[Count] = []
    for i, (case, cap) in enumerate(zip(spec.cases, spec.capacities, strict=True)):
        c, e = case_verdict(spec, case, cap, [r.runs[i] for r in results])
        checks += c
        exact += e
        if cap is not None:
            checks += drop_checks(spec, case, cap, [r.runs[i] for r in results])
    params = {"experts": spec.experts, "width": spec.width, "hidden": spec.hidden, "tokens": spec.tokens,
              "cases": [c.name for c in spec.cases]}
    return Verdict(checks=checks, exact=exact, params=params)


def drop_checks(spec: LayerSpec, case: LayerCase, cap: int, runs: list[LayerRun]) -> list[Check]:
    """With capacity: the rows of tokens that lost an assignment differ from the dropless layer, the others do not."""
    dropless = layer_reference(spec, case, None)
    ids = torch.cat([r.experts for r in runs]).reshape(-1).tolist()
    kept = torch.tensor(ecosts.kept_mask(ids, spec.experts, cap)).view(-1, case.k).all(1)     # (T,) lost nothing
    y = torch.cat([r.y for r in runs])
    label = f"{case.name}: vs the dropless layer"
    out = [fact_check(f"{label}: some token lost an assignment", holds=not bool(kept.all()),
                      reason=f"capacity C = {cap} against counts {dropless.counts}")]
    if bool(kept.any()):
        out.append(Check(name=f"{label}: tokens that kept every assignment are unchanged",
                         error=max_abs_error(y[kept], dropless.y[kept]), tolerance=layer_tolerance(spec, dropless.y), reason=WHY))
    if not bool(kept.all()):
        gap = (y[~kept] - dropless.y[~kept]).abs().amax(1)
        out.append(differ_check(f"{label}: every token that lost one differs", gap.min(), torch.zeros(()),
                                layer_tolerance(spec, dropless.y), "a dropped expert output is missing from the sum: "
                                "more than rounding"))
    return out


EP_DEMO = Experiment(name="moe-ep", chapter="10", world_sizes=(1, 2, 4), spec=layer_spec, ranks=layer_rank,
                     compare=compare_layer,
                     title="Expert parallelism: the MoE layer on N ranks == one process; all-to-all bytes exact")


def capacity_spec(world_size: int) -> LayerSpec:
    """The skewed and one-expert routers with capacity factor 1.0: some experts overflow."""
    return layer_spec(world_size, routers=("skewed", "one expert"), capacity_factor=1.0)


CAPACITY_DEMO = Experiment(name="moe-capacity", chapter="10", world_sizes=(1, 2, 4), spec=capacity_spec,
                           ranks=layer_rank, compare=compare_layer,
                           title="Capacity: drops counted; == one process with the same rule, "
                                 "!= dropless where dropped")

DEMOS = [EP_DEMO, CAPACITY_DEMO]
