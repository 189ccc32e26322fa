"""Turning rank results into Report rows: tolerances, gradient checks, collectives against their formulas.

Tolerance. Splitting a layer over ranks changes the order of some float32
sums and nothing else: a row layer's output is a sum over its input
features, computed as N partial sums and then added around the ring; a
column layer's input gradient likewise over its output features; with SP
or CP, LayerNorm and weight gradients are sums over tokens split by rank.
The longest such sum has K = max(3H, F, B*T) terms (QKV's output features,
the MLP's hidden width, the tokens of a batch). Two orders of one K-term sum
differ by at most 2(K-1) u times its largest partial sum
(`costs.reordered_sum_bound`, u = 2^-24); we take that partial sum to be at
most max|X| of the compared tensor X. That makes it a first-order allowance,
not a bound: it assumes no cancellation (a partial sum can exceed max|X|),
and it does not add up how LayerNorm or softmax pass an earlier difference
on. The
measured differences are a few ulps of max|X|; a wrong slice or a missing
or doubled reduction changes results by about max|X|.
"""
from __future__ import annotations

import torch

from wmdist.course.compare import reordered_terms as block_terms, worst as worst_of
from wmdist.costs import reordered_sum_bound
from wmdist.costs.tensor_parallel import OPS, BlockShape, Collective
from wmdist.course.report import Check, Count, close_check, max_abs_error
from wmdist.tensor_parallel.layers import Measured

WHY = ("first-order allowance for float32 sums regrouped by rank: 2(K-1) 2^-24 max|X|, K = max(3H, F, B*T) "
       "terms (assumes partial sums within max|X|)")


def shape_terms(shape: BlockShape) -> int:
    """K: the most terms of any float32 sum whose order the split changes (`wmdist.course.compare.reordered_terms`)."""
    return block_terms(shape.width, shape.hidden, shape.batch * shape.seq)


def reordered_tolerance(reference: torch.Tensor, terms: int) -> float:
    """2(K-1) u max|reference|: a K-term sum in another order, partial sums taken below max|reference| (a
    first-order allowance)."""
    return reordered_sum_bound(terms, float(reference.abs().max()))


def agreement_checks(label: str, got: list[dict[str, torch.Tensor]], expected: list[dict[str, torch.Tensor]],
                     terms: int) -> list[Check]:
    """One check per tensor name: every rank's tensor against the reference's (its slice), worst rank shown."""
    checks = []
    for name in expected[0]:
        worst = worst_of([max_abs_error(got[r][name], expected[r][name]) for r in range(len(got))])
        want = expected[worst][name]
        checks.append(close_check(f"{label}: {name} == single device, every rank", got[worst][name], want,
                                  reordered_tolerance(want, terms), f"{WHY}; worst: rank {worst}"))
    return checks


def _op(phase: str) -> str:
    return phase.rsplit(" ", 1)[-1]


def collective_counts(measured: list[list[Measured]], schedule: list[Collective], case: str) -> list[Count]:
    """Per rank: how many collectives of each op, bytes sent by each and in total, rounds, and order.

    On one rank the ring collectives send nothing and record nothing, and the
    formula's schedule is empty too.
    """
    predicted = [c for c in schedule if len(c.sizes) > 1]
    out: list[Count] = []
    for r, mine in enumerate(measured):
        by_phase: dict[str, int] = {}
        for m in mine:
            by_phase[m.phase] = by_phase.get(m.phase, 0) + m.bytes_sent
        out.append(Count(quantity="collectives", rank=r, measured=len(mine), predicted=len(predicted), case=case))
        for op in OPS:
            out.append(Count(quantity=f"{op} calls", rank=r, measured=sum(_op(m.phase) == op for m in mine),
                             predicted=sum(c.op == op for c in predicted), case=case))
        out += [Count(quantity="bytes sent", rank=r, measured=by_phase.get(c.phase, 0), predicted=c.bytes_sent(r), phase=c.phase, case=case)
                for c in predicted]
        out.append(Count(quantity="bytes sent", rank=r, measured=sum(by_phase.values()), predicted=sum(c.bytes_sent(r) for c in predicted),
                         phase="total", case=case))
        out.append(Count(quantity="rounds", rank=r, measured=sum(m.rounds for m in mine), predicted=sum(c.rounds for c in predicted), case=case))
        order = [m.phase for m in mine]
        out.append(Count(quantity="collectives out of the predicted order", rank=r,
                         measured=sum(a != b for a, b in zip(order, [c.phase for c in predicted])) + abs(len(order) - len(predicted)),
                         predicted=0, case=case))
    return out
