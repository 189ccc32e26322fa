"""The same all-reduce four ways (ring, tree, halving-doubling, direct), checked three ways each.

Every rank sums the ring demo's seeded vector (ring.rank_vector) with each algorithm, then sums a
vector of small integers with each. Checked: every algorithm's result against the float64
single-process sum and against the ring, within the rounding that a different summation order
allows; on integer-valued inputs, bit for bit (no addition rounds there); and the ledger's bytes
sent and rounds on every rank against costs.allreduce's formula for that algorithm, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.comm import Context, ring_all_reduce
from wmdist.course.compare import bound_ratio, worst
from wmdist.costs import allreduce
from wmdist.data_parallel.algorithms import direct_all_reduce, halving_doubling_all_reduce, tree_all_reduce
from wmdist.data_parallel.ring import DEFAULT_NUMEL, RingAllReduceSpec, rank_vector, reference_sum, sum_bound
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, exact_check

ALGORITHMS = allreduce.ALGORITHMS
RUN = {"ring": ring_all_reduce, "tree": tree_all_reduce, "halving-doubling": halving_doubling_all_reduce,
       "direct": direct_all_reduce}
INTEGER_RANGE = 1000     # integer inputs in [-1000, 1000]: any partial sum of <= 8 is far below 2^24, so exact


@dataclass(frozen=True, kw_only=True)
class AllReduceAlgorithmsSpec(RingAllReduceSpec):
    """The ring demo's inputs (its N seeded `numel` vectors) for every algorithm, with two more refusals: fewer
    elements than ranks, and more ranks than the exact integer check allows."""

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.world_size
        if self.numel < n:
            raise ValueError(f"numel must be at least world_size: {self.numel} elements cannot give each of "
                             f"{n} ranks a chunk of the sum to own")
        if n * INTEGER_RANGE >= 2 ** 24:
            raise ValueError(f"world_size {n} is too large for the exact integer check: {n} x {INTEGER_RANGE} "
                             "must stay below 2^24 for float32 sums of integers to be exact")


def integer_vector(rank: int, numel: int, *, seed: int = 0) -> torch.Tensor:
    """Integer-valued float32 inputs: every float32 sum of N of them is exact, in any order."""
    g = torch.Generator().manual_seed(seed * 1000 + rank + 500)
    return torch.randint(-INTEGER_RANGE, INTEGER_RANGE + 1, (numel,), generator=g).float()   # (numel,)


@dataclass(frozen=True)
class AlgorithmsRank:
    """One rank's result of each algorithm (random and integer inputs) and what its ledger counted for each."""
    outputs: dict[str, torch.Tensor]            # algorithm -> (numel,)
    integer_outputs: dict[str, torch.Tensor]    # algorithm -> (numel,)
    bytes_sent: dict[str, int]
    rounds: dict[str, int]


def all_algorithms(ctx: Context, spec: AllReduceAlgorithmsSpec) -> AlgorithmsRank:
    """Rank function: the same vector summed by each algorithm, its ledger read per algorithm (phase prefix)."""
    x = rank_vector(ctx.rank, spec.numel, seed=spec.seed)
    outputs = {a: RUN[a](ctx, x, phase=a) for a in ALGORITHMS}
    totals = {a: ctx.ledger.totals(phase=f"{a}/", prefix=True) for a in ALGORITHMS}
    ints = integer_vector(ctx.rank, spec.numel, seed=spec.seed)
    integer_outputs = {a: RUN[a](ctx, ints, phase=f"integers/{a}") for a in ALGORITHMS}
    return AlgorithmsRank(outputs, integer_outputs, {a: t["bytes_sent"] for a, t in totals.items()},
                          {a: t["rounds"] for a, t in totals.items()})


def _worst_rank(name: str, errors: list[float], tolerance: float, reason: str) -> Check:
    i = worst(errors)
    return Check(name=name, error=errors[i], tolerance=tolerance, reason=reason, detail=f"rank {i}")


def compare_algorithms(spec: AllReduceAlgorithmsSpec, results: list[AlgorithmsRank]) -> Verdict:
    """Each algorithm against the float64 sum and the ring (rounding bounds), integers bit for bit, counts exact."""
    n, numel, seed = spec.world_size, spec.numel, spec.seed
    expected = reference_sum(n, numel, seed=seed)
    to_reference = sum_bound(n, numel, seed=seed)                       # (2(N-1)+1) u sum_r |x_r|
    magnitude = sum(rank_vector(r, numel, seed=seed).double().abs() for r in range(n))
    to_ring = costs.reordered_sum_bound(n, 1.0) * magnitude             # 2(N-1) u sum_r |x_r|
    ints = sum(integer_vector(r, numel, seed=seed).double() for r in range(n)).float()
    why_ref = ("float32 sum of N terms in this algorithm's order vs the float64 sum rounded once: at most "
               "(2(N-1)+1) 2^-24 sum_r |x_r| per element; in units of that bound")
    why_ring = "two float32 sums of the same N terms in different orders: at most 2(N-1) 2^-24 sum_r |x_r|"
    checks: list[Check] = []
    exact = []
    for a in ALGORITHMS:
        outs = [res.outputs[a] for res in results]
        checks.append(_worst_rank(f"{a} == single-process sum (in units of the rounding bound)",
                                  [bound_ratio(o, expected, to_reference) for o in outs], 1.0, why_ref))
        if a != "ring":
            checks.append(Check(name=f"{a} == ring (rank 0, in units of the rounding bound)",
                                error=bound_ratio(outs[0], results[0].outputs["ring"], to_ring), tolerance=1.0,
                                reason=why_ring))
        checks.append(exact_check(f"{a}: every rank holds the same result", outs, [outs[0]] * n,
                                  "the last phase copies finished sums; nothing is added after it"))
        checks.append(exact_check(f"{a} on integer-valued inputs == the exact sum", [res.integer_outputs[a]
                                  for res in results], [ints] * n, "every partial sum is an integer below "
                                  "2^24, so no float32 addition rounds, in any order: bit for bit"))
        exact += counts_per_rank("bytes sent", [res.bytes_sent[a] for res in results],
                                 [allreduce.allreduce_bytes(a, numel, n, r) for r in range(n)], case=a)
        exact += counts_per_rank("rounds", [res.rounds[a] for res in results],
                                 [allreduce.allreduce_rounds(a, n, r) for r in range(n)], case=a)
    return Verdict(checks=checks, exact=exact, params={"numel": numel, "dtype": "float32",
                                                       "chunks": costs.ring_chunk_sizes(numel, n)})


ALGORITHMS_DEMO = Experiment(name="allreduce-algorithms", chapter="01", world_sizes=(1, 2, 3, 4, 6, 8),
                             spec=lambda n: AllReduceAlgorithmsSpec(world_size=n), ranks=all_algorithms,
                             compare=compare_algorithms,
                             title="Ring, tree, halving-doubling and direct all-reduce: bytes and rounds per "
                                   "rank exact, sums within rounding")


def algorithms_demo(world_size: int, *, numel: int = DEFAULT_NUMEL, seed: int = 0) -> Report:
    """Run the four algorithms on `world_size` ranks and build the Report."""
    return ALGORITHMS_DEMO.run_spec(AllReduceAlgorithmsSpec(world_size=world_size, numel=numel, seed=seed))


def ledger_table(report: Report) -> str:
    """Bytes sent and rounds per rank, as the ledger counted them, one row per algorithm ('=' the formula's)."""
    rows = [("algorithm", "bytes sent per rank", "rounds per rank", "= formula")]
    for a in ALGORITHMS:
        counts = report.counts(case=a)
        sent = report.measured(quantity="bytes sent", case=a)
        rounds = report.measured(quantity="rounds", case=a)
        rows.append((a, " ".join(f"{b:,}" for b in sent), " ".join(map(str, rounds)),
                     "yes" if counts and all(c.passed for c in counts) else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


DEMOS = [ALGORITHMS_DEMO]
