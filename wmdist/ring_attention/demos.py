"""Ring attention on N ranks equals SDPA on the whole sequence, forward and backward, and sends what the formulas say.

One call runs six cases on every rank (float32 and float64; full attention
on the contiguous layout, causal on contiguous and on zigzag), each forward
then backward, and the paper's N-sends loop once more. The parent assembles
the ranks' rows into full tensors and compares them with
torch.nn.functional.scaled_dot_product_attention, each element within the
derived rounding bound of tolerance.py. The ledger's bytes per rank and
phase, and the tiles, query-key pairs and skipped steps each rank reports,
must equal their formulas exactly.

The demo is an `Experiment` on `RingRun` (the sizes, checked on both layouts
before any process starts); RingRun, Cases, RankCase and the rank's run of one
case live in spec.py, which the chapter's other demos share (re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wmdist.comm import Context
from wmdist.costs import ring_attention as costs
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, counts_per_rank, exact_check
from wmdist.ring_attention import layout as lay
from wmdist.ring_attention.checks import assembled, sdpa_checks, sdpa_reference, sizes, work_counts
from wmdist.ring_attention.ring import BACKWARD_GRAD, BACKWARD_KV, FORWARD
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.spec import DTYPES, Cases, DTypeName, RankCase, RingRun, RingSpec, ring_run, run_case
from wmdist.base.spans import Span

CASES = tuple((dtype, causal, layout) for dtype in ("float32", "float64")
              for causal, layout in ((False, "contiguous"), (True, "contiguous"), (True, "zigzag")))
PAPER = "paper loop, N sends"
__all__ = ["CASES", "PAPER", "Cases", "RankCase", "RingRun", "ring_run", "case_name", "ring_cases",
           "compare_ring_attention", "RingDemoData", "RING_DEMO", "ring_attention_demo", "DEMOS"]


def case_name(dtype: DTypeName, *, causal: bool, layout: Layout) -> str:
    """The case key of a Report row, e.g. "float32 causal zigzag"."""
    return f"{dtype} {'causal' if causal else 'full'} {layout}"


def ring_cases(ctx: Context, run: RingRun) -> Cases[RankCase]:
    """Rank function: every case forward and backward, then the paper's N-sends forward (N > 1)."""
    spec = run.ring
    out = {case_name(d, causal=c, layout=lo): run_case(ctx, spec, dtype=d, causal=c, layout=lo) for d, c, lo in CASES}
    if ctx.world_size > 1:
        out[PAPER] = run_case(ctx, spec, dtype="float32", causal=True, layout="contiguous", backward=None,
                              final_exchange=True)
    return Cases(tuple(out), tuple(out.values()))


def _checks(spec: RingSpec, n: int, results: list[Cases[RankCase]], dtype: DTypeName, causal: bool,
            layout: Layout) -> list[Check]:
    """Output and three gradients of one case against SDPA on the full sequence, in units of the rounding bound."""
    name = case_name(dtype, causal=causal, layout=layout)
    ranks = [res[name] for res in results]
    return sdpa_checks(name, assembled(spec, ranks), sdpa_reference(spec, n, dtype=dtype, causal=causal))


def _counts(spec: RingSpec, n: int, results: list[Cases[RankCase]], dtype: DTypeName, causal: bool,
            layout: Layout) -> list[Count]:
    """Bytes per phase (every case), and tiles, pairs and skipped steps (float32 cases), against their formulas."""
    name = case_name(dtype, causal=causal, layout=layout)
    ranks = [res[name] for res in results]
    elem = DTYPES[dtype].itemsize
    args, sizes = (spec.seq_len, n, spec.kv_width), {"batch": spec.batch, "elem_size": elem}
    kv_back, grad_back = costs.ring_backward_bytes_per_rank(*args, **sizes)
    out = counts_per_rank("bytes sent", [rc.sent.get(FORWARD, 0) for rc in ranks],
                          [costs.ring_kv_bytes_per_rank(*args, **sizes)] * n, phase=FORWARD, case=name)
    out += counts_per_rank("bytes sent", [rc.sent.get(BACKWARD_KV, 0) for rc in ranks], [kv_back] * n,
                           phase=BACKWARD_KV, case=name)
    out += counts_per_rank("bytes sent", [rc.sent.get(BACKWARD_GRAD, 0) for rc in ranks], [grad_back] * n,
                           phase=BACKWARD_GRAD, case=name)
    if dtype != "float32":
        return out
    tiles = [sum(row) for row in lay.tile_pairs(spec.seq_len, n, layout=layout, block_size=spec.tile(n),
                                                causal=causal)]
    for phase, pick in ((FORWARD, lambda rc: rc.forward), (BACKWARD_KV, lambda rc: rc.backward)):
        out += counts_per_rank("tiles computed", [sum(pick(rc).tiles) for rc in ranks], tiles, phase=phase, case=name)
    return out + work_counts(spec, n, name, ranks, layout=layout, causal=causal)


@dataclass(frozen=True)
class RingDemoData:
    """Per-rank timelines of one case (float32 causal zigzag), forward and backward, for a Gantt chart."""
    forward: tuple[Span, ...]
    backward: tuple[Span, ...]


def compare_ring_attention(run: RingRun, results: list[Cases[RankCase]]) -> Verdict:
    """Every case against SDPA in units of its rounding bound, bytes and work against the formulas, the paper's
    N-sends loop against N-1 sends."""
    spec, world_size = run.ring, run.world_size
    checks = [c for case in CASES for c in _checks(spec, world_size, results, *case)]
    exact = [c for case in CASES for c in _counts(spec, world_size, results, *case)]
    if world_size > 1:
        paper = [res[PAPER] for res in results]
        base = [res[case_name("float32", causal=True, layout="contiguous")] for res in results]
        exact += counts_per_rank("bytes sent", [rc.sent.get(FORWARD, 0) for rc in paper],
                                 [costs.ring_kv_bytes_per_rank(spec.seq_len, world_size, spec.kv_width,
                                                               batch=spec.batch, elem_size=DTYPES["float32"].itemsize,
                                                               final_exchange=True)] * world_size,
                                 phase=FORWARD, case=PAPER)
        checks.append(exact_check(f"{PAPER}: same output as N-1 sends", [rc.out for rc in paper],
                                  [rc.out for rc in base],
                                  "the same tiles merged in the same order; the last send only returns blocks home"))
    zig = [res[case_name("float32", causal=True, layout="zigzag")] for res in results]
    data = RingDemoData(tuple(s for rc in zig for s in rc.forward.spans),
                        tuple(s for rc in zig for s in rc.backward.spans))
    params: dict[str, Any] = sizes(spec)
    if world_size == 1:
        params["note"] = "one rank has no neighbour: the paper's N-sends loop would send to itself, which gloo refuses"
    return Verdict(checks=checks, exact=exact, params=params, data=data)


RING_DEMO = Experiment(name="ring-attention", chapter="06", world_sizes=tuple(range(1, 9)), spec=ring_run,
                       title="Ring attention on N ranks == SDPA (fp32, fp64, causal or not, forward and backward); "
                             "KV bytes (N-1) S d_KV / N per rank", ranks=ring_cases, compare=compare_ring_attention)


def ring_attention_demo(world_size: int, *, seq_len: int | None = None, block_size: int = 4, seed: int = 0) -> Report:
    """Ring attention on `world_size` ranks vs SDPA, six cases forward and backward, bytes and work counted exactly."""
    return RING_DEMO.run_spec(ring_run(world_size, seq_len=seq_len, block_size=block_size, seed=seed))


DEMOS = [RING_DEMO]
