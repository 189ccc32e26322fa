"""What the chapter's ring demos check the same way, written once: SDPA, the rounding bound, the forward's work.

Every case of `ring-attention` and of `ring-attention-pruned` is judged alike:
the ranks' rows are put back into the whole sequence, and its output and three
gradients are compared with torch's SDPA on one process, in units of the
derived rounding bound (tolerance.py); the forward's query-key pairs and
skipped steps per rank must equal the layout's formulas (layout.py). Each demo
adds what only it checks (bytes per dtype, tiles, the pruned ring's sends).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from wmdist.course.compare import bound_ratio
from wmdist.course.report import Check, Count, counts_per_rank
from wmdist.ring_attention import layout as lay
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.ring import FORWARD
from wmdist.ring_attention.spec import DTypeName, RankCase, RingSpec, assemble_sequence
from wmdist.ring_attention.tolerance import REASON, attention_tolerance, exact_attention

KEYS = ("out", "dq", "dk", "dv")


@dataclass(frozen=True)
class SDPAReference:
    """SDPA's output and gradients on the whole sequence (one process), and the bound on each, by KEYS."""
    wanted: tuple[torch.Tensor, ...]
    bounds: tuple[torch.Tensor, ...]


def sdpa_reference(spec: RingSpec, world_size: int, *, dtype: DTypeName, causal: bool) -> SDPAReference:
    """SDPA forward and backward on the seeded inputs in `dtype`, and the bounds of the ring's tiles on N ranks."""
    q, k, v, dout = spec.inputs(dtype=dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    grads = torch.autograd.grad(want, leaves, dout)
    tol = attention_tolerance(exact_attention(q, k, v, dout, causal=causal), getattr(torch, dtype),
                              spec.tile(world_size), spec.key_blocks(world_size))
    return SDPAReference(wanted=(want.detach(), *grads), bounds=tuple(getattr(tol, key) for key in KEYS))


def assembled(spec: RingSpec, ranks: list[RankCase]) -> list[torch.Tensor]:
    """out, dq, dk, dv of the whole sequence, put together from every rank's rows of one case."""
    rows = [rc.rows for rc in ranks]
    return [assemble_sequence(spec, [rc.out for rc in ranks], rows)] + \
        [assemble_sequence(spec, [rc.grads[i] for rc in ranks], rows) for i in range(3)]


def sdpa_checks(name: str, got: list[torch.Tensor], ref: SDPAReference) -> list[Check]:
    """One check per tensor of KEYS: |ours - SDPA| in units of its bound, passing at 1."""
    return [Check(name=f"{name}: {key} == SDPA", error=bound_ratio(g, want, bound), tolerance=1.0, reason=REASON)
            for key, g, want, bound in zip(KEYS, got, ref.wanted, ref.bounds)]


def work_counts(spec: RingSpec, world_size: int, name: str, ranks: list[RankCase], *, layout: Layout,
                causal: bool) -> list[Count]:
    """The forward's query-key pairs and skipped ring steps on each rank, against the layout's formulas."""
    n = world_size
    skipped = lay.skipped_steps(spec.seq_len, n, layout=layout) if causal else []
    out = counts_per_rank("query-key pairs", [sum(rc.forward.pairs) for rc in ranks],
                          lay.rank_work(spec.seq_len, n, layout=layout, causal=causal), phase=FORWARD, case=name)
    out += counts_per_rank("steps skipped", [len(rc.forward.skipped) for rc in ranks],
                           [sum(1 for r, _ in skipped if r == rank) for rank in range(n)], phase=FORWARD, case=name)
    return out


def sizes(spec: RingSpec) -> dict[str, Any]:
    """The run's sizes as a Report shows them."""
    return {"seq_len": spec.seq_len, "batch": spec.batch, "heads": spec.heads, "head_dim": spec.head_dim,
            "kv_width": spec.kv_width, "block_size": spec.block_size}
