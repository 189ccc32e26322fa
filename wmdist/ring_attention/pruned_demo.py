"""The pruned causal ring beside the uniform ring and zigzag: all equal SDPA, and each sends what its formula says.

One call runs four causal float32 cases on every rank, forward then
backward: the pruned ring and the uniform ring on the contiguous layout, the
uniform ring on zigzag, and the pruned ring on zigzag (which has nothing to
prune, so it must send exactly what the uniform ring sends). Outputs and
gradients are assembled and compared with SDPA on the whole sequence within
the chapter's derived rounding bound (tolerance.py); the pruned and uniform
contiguous rings must agree bit for bit. Bytes and messages sent per rank
and phase, query-key pairs and skipped steps must equal their formulas
exactly. The trade shows in the counts: pruning halves the contiguous ring's
sends but leaves its work where the mask puts it, on the last rank; zigzag
evens the work and sends every block N-1 hops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from wmdist.comm import Context
from wmdist.costs import ring_attention as costs
from wmdist.costs.validate import require_choice
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, counts_per_rank, exact_check
from wmdist.ring_attention import layout as lay
from wmdist.ring_attention.checks import assembled, sdpa_checks, sdpa_reference, sizes, work_counts
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.pruned import pruned_backward, pruned_forward
from wmdist.ring_attention.ring import BACKWARD_GRAD, BACKWARD_KV, FORWARD, ring_backward, ring_forward
from wmdist.ring_attention.spec import DTYPES, Cases, RankCase, RingRun, RingSpec, ring_run, run_case

Ring = Literal["pruned", "uniform"]     # the pruned ring (pruned.py) or the uniform one (ring.py)
RINGS: tuple[Ring, ...] = get_args(Ring)
CASES: tuple[tuple[Ring, Layout], ...] = (("pruned", "contiguous"), ("uniform", "contiguous"), ("uniform", "zigzag"),
                                          ("pruned", "zigzag"))
PHASES = (FORWARD, BACKWARD_KV, BACKWARD_GRAD)


def pruned_case_name(ring: Ring, *, layout: Layout) -> str:
    """The case key of a Report row, e.g. "pruned contiguous"."""
    return f"{ring} {layout}"


def pruned_cases(ctx: Context, run: RingRun) -> Cases[RankCase]:
    """Rank function: every case, causal, float32, forward and backward, each with a fresh ledger."""
    rings = {"pruned": (pruned_forward, pruned_backward), "uniform": (ring_forward, ring_backward)}
    out = {pruned_case_name(ring, layout=layout): run_case(ctx, run.ring, dtype="float32", causal=True, layout=layout,
                                                    forward=rings[ring][0], backward=rings[ring][1])
           for ring, layout in CASES}
    return Cases(tuple(out), tuple(out.values()))


def predicted_sends(world_size: int, *, ring: Ring, layout: Layout) -> dict[str, list[int]]:
    """Messages each rank sends per phase: the pruned formulas on contiguous, the uniform ring's N-1 otherwise."""
    n = world_size
    if require_choice("ring", ring, RINGS) == "pruned" and costs.dead_kv_sends(n, layout=layout):
        kv = [costs.pruned_kv_sends(n, r) for r in range(n)]
        return {FORWARD: kv, BACKWARD_KV: kv, BACKWARD_GRAD: [costs.pruned_grad_sends(n, r) for r in range(n)]}
    return {FORWARD: [costs.ring_kv_sends(n)] * n, BACKWARD_KV: [costs.ring_kv_sends(n)] * n,
            BACKWARD_GRAD: [costs.ring_grad_sends(n)] * n}


def predicted_bytes(spec: RingSpec, world_size: int, *, ring: Ring, layout: Layout) -> dict[str, list[int]]:
    """Bytes each rank sends per phase, from costs.ring_attention (the cases run in float32)."""
    elem = DTYPES["float32"].itemsize
    args, sizes = (spec.seq_len, world_size, spec.kv_width), {"batch": spec.batch, "elem_size": elem}
    if require_choice("ring", ring, RINGS) == "pruned" and costs.dead_kv_sends(world_size, layout=layout):
        rows = costs.pruned_ring_bytes_per_rank(*args, **sizes)
        return {phase: [row[i] for row in rows] for i, phase in enumerate(PHASES)}
    kv_back, grad_back = costs.ring_backward_bytes_per_rank(*args, **sizes)
    return {FORWARD: [costs.ring_kv_bytes_per_rank(*args, **sizes)] * world_size, BACKWARD_KV: [kv_back] * world_size,
            BACKWARD_GRAD: [grad_back] * world_size}


def _counts(spec: RingSpec, n: int, name: str, ring: Ring, layout: Layout, ranks: list[RankCase]) -> list[Count]:
    want_bytes = predicted_bytes(spec, n, ring=ring, layout=layout)
    want_sends = predicted_sends(n, ring=ring, layout=layout)
    out: list[Count] = []
    for phase in PHASES:
        out += counts_per_rank("bytes sent", [rk.sent.get(phase, 0) for rk in ranks], want_bytes[phase],
                               phase=phase, case=name)
        out += counts_per_rank("sends", [rk.sends.get(phase, 0) for rk in ranks], want_sends[phase],
                               phase=phase, case=name)
    return out + work_counts(spec, n, name, ranks, layout=layout, causal=True)


@dataclass(frozen=True)
class PrunedData:
    """Per case: forward K, V bytes and query-key pairs per rank, and all three phases' bytes summed over ranks."""
    forward_bytes: dict[str, list[int]]
    pairs: dict[str, list[int]]
    total_bytes: dict[str, int]


def compare_pruned(run: RingRun, results: list[Cases[RankCase]]) -> Verdict:
    """Every case against SDPA in units of its rounding bound, pruned against uniform (exact), bytes, sends and work
    against the formulas."""
    spec, world_size = run.ring, run.world_size
    ref = sdpa_reference(spec, world_size, dtype="float32", causal=True)
    checks: list[Check] = []
    exact: list[Count] = []
    full: dict[str, list[torch.Tensor]] = {}
    for ring, layout in CASES:
        name = pruned_case_name(ring, layout=layout)
        ranks = [res[name] for res in results]
        full[name] = assembled(spec, ranks)
        checks += sdpa_checks(name, full[name], ref)
        exact += _counts(spec, world_size, name, ring, layout, ranks)
    for layout in lay.LAYOUTS:
        checks.append(exact_check(f"pruned {layout}: out, dq, dk, dv == uniform ring's", full[f"pruned {layout}"],
                                  full[f"uniform {layout}"], "the same tiles merged in the same order; a dropped "
                                  "send carried a block nobody read, and a skipped step's dK, dV share is 0"))
    data = PrunedData({c: [res[c].sent.get(FORWARD, 0) for res in results] for c in full},
                      {c: [sum(res[c].forward.pairs) for res in results] for c in full},
                      {c: sum(sum(res[c].sent.values()) for res in results) for c in full})
    params: dict[str, Any] = {**sizes(spec),
                              "dead forward sends (contiguous)": costs.dead_kv_sends(world_size, layout="contiguous")}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


PRUNED_DEMO = Experiment(name="ring-attention-pruned", chapter="06", world_sizes=(2, 4), spec=ring_run,
                         title="Pruned causal ring (no dead K, V sends) == SDPA forward and backward, beside the "
                               "uniform ring and zigzag; bytes and sends per rank exact",
                         ranks=pruned_cases, compare=compare_pruned)


def pruned_ring_demo(world_size: int, *, seq_len: int | None = None, block_size: int = 4, seed: int = 0) -> Report:
    """Pruned causal ring vs uniform ring vs zigzag on `world_size` ranks: == SDPA, bytes and sends exact."""
    return PRUNED_DEMO.run_spec(ring_run(world_size, seq_len=seq_len, block_size=block_size, seed=seed))


DEMOS = [PRUNED_DEMO]
