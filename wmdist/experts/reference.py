"""The MoE layer on one process, and how far expert parallelism may be from it (tolerances derived, stated).

Expert parallelism computes the same mathematics as one process; what changes is which rows meet
in one matrix product, and the order of some float32 sums:
  * the router and the experts run on a rank's rows, not all T at once: each row's own sums (over
    d input features for the router and fc1, F for fc2) may be grouped differently by a kernel
    picked for another number of rows;
  * the router's weight gradient is a sum over all T tokens, now a partial sum per rank added by an
    all-reduce; with data parallelism an expert's gradient is split over its replicas the same way;
  * the balancing loss's P_e sums T probabilities in per-rank parts.
Every compared entry is therefore a sum of at most K = max(d, F, T) terms in another order, and two
orders differ by at most 2(K-1) u times the largest partial sum (`costs.reordered_sum_bound`,
u = 2^-24), taken to be max|X| of the compared tensor X, as chapters 04 and 09 do: a first-order
allowance that assumes no cancellation. Permuting rows, sending them and combining a token's k
outputs in the same order are exact: which expert a token chose, the rows each expert received and
every count are compared bit for bit. A wrong permutation, a row at the wrong expert or a missing
all-reduce moves results by about max|X|, far past this.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist.course.compare import one_thread
from wmdist.costs.rounding import reordered_sum_bound
from wmdist.experts.moe import balance_loss, dispatch_order, moe_forward
from wmdist.experts.spec import LayerCase, LayerSpec

WHY = ("float32 sums over rows regrouped by rank: 2(K-1) 2^-24 max|X|, K = max(d, F, T) (first order)")
EXACT_WHY = "rows permuted and sent, never added: bit for bit"


@dataclass(frozen=True, kw_only=True)
class LayerReference:
    """One process, all T tokens: output, gradients, routing and what each expert received."""
    y: torch.Tensor                      # (T, d) the layer's output (capacity applied, if any)
    dx: torch.Tensor                     # (T, d) input gradient
    grads: dict[str, torch.Tensor]       # every parameter's gradient, by name (zeros for an expert with no rows)
    experts: torch.Tensor                # (T, k) the routing
    counts: list[int]                    # (E,) assignments per expert
    inputs: torch.Tensor                 # (T k, d) the rows each expert received, expert by expert
    aux: float                           # the balancing loss


def layer_terms(spec: LayerSpec) -> int:
    """K = max(d, F, T): the longest sum whose order expert parallelism changes."""
    return max(spec.width, spec.hidden, spec.tokens)


def layer_tolerance(spec: LayerSpec, want: torch.Tensor) -> float:
    """2(K-1) u max|want|: the entries of one compared tensor, summed in another order."""
    return reordered_sum_bound(layer_terms(spec), float(want.detach().abs().max()) if want.numel() else 0.0)


def aux_tolerance(spec: LayerSpec, aux: float) -> float:
    """The balancing loss sums T k-scaled probabilities in per-rank parts: T positive terms reordered, plus
    the rounding of each rank's division by T and of the sum of ranks' shares (2 more)."""
    return reordered_sum_bound(spec.tokens, abs(aux), extra_roundings=2)


def layer_reference(spec: LayerSpec, case: LayerCase, cap: int | None) -> LayerReference:
    """Forward and backward of the case's layer on all T tokens at once, on one thread (as every rank runs)."""
    with one_thread():
        moe = spec.layer(case)
        x_all, dout = spec.inputs()
        x = x_all.clone().requires_grad_(True)
        out = moe_forward(moe, x, cap=cap)
        aux = balance_loss(out.routing.probs, out.counts, tokens=spec.tokens, k=case.k)
        ((out.y * dout).sum() + spec.aux_weight * aux).backward()
        ids = out.routing.experts.reshape(-1)
        order, _ = dispatch_order(ids)
        grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in moe.named_parameters()}
        return LayerReference(y=out.y.detach(), dx=x.grad.clone(), grads=grads, experts=out.routing.experts,
                              counts=out.counts.tolist(), inputs=x_all[order // case.k], aux=float(aux.detach()))
