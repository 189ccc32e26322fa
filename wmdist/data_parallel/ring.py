"""Ring all-reduce, checked three ways: against gloo's own all_reduce, against the
single-process sum, and its ledger against 2(N-1)G/N bytes per rank. Also the
course's first exercise (chapter 00): pass a tensor one step around the ring.

Each rank draws its vector from a generator seeded by its rank, so the
single-process reference can draw the very same vectors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.comm import Context, all_reduce, exchange, ring_all_reduce
from wmdist.course.compare import bound_ratio
from wmdist.course.exercises import Exercise
from wmdist.course.experiment import Experiment, RankSpec, Verdict
from wmdist.course.report import Check, Report, close_check, counts_per_rank

DEFAULT_NUMEL = 100_003   # prime: no world size divides it, so chunk sizes differ


def rank_vector(rank: int, numel: int, *, seed: int = 0) -> torch.Tensor:
    """The vector rank `rank` contributes; the reference draws it identically."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(numel, generator=g)          # (numel,)


@dataclass(frozen=True, kw_only=True)
class RingAllReduceSpec(RankSpec):
    """The comparison, decided before any process starts: N ranks, each reducing a `numel` vector seeded by rank."""
    numel: int = DEFAULT_NUMEL
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        costs.require_int("numel", self.numel, 1)
        costs.require_int("seed", self.seed, 0)


@dataclass(frozen=True)
class RingRank:
    """One rank's vector reduced by our ring and by gloo, and what its ledger shows."""
    ours: torch.Tensor        # (numel,)
    theirs: torch.Tensor      # (numel,)
    bytes_sent: int           # both phases together
    rounds: int


def ring_vs_builtin(ctx: Context, spec: RingAllReduceSpec) -> RingRank:
    """Rank function: the same vector reduced by our ring and by gloo."""
    x = rank_vector(ctx.rank, spec.numel, seed=spec.seed)
    ours = ring_all_reduce(ctx, x, phase="ring")
    theirs = all_reduce(ctx, x.clone(), phase="gloo")
    totals = ctx.ledger.totals()
    return RingRank(ours, theirs, totals["bytes_sent"], totals["rounds"])


def reference_sum(world_size: int, numel: int, *, seed: int = 0) -> torch.Tensor:
    """Single-process sum in float64 (then rounded once), the closest thing to the true sum."""
    total = sum(rank_vector(r, numel, seed=seed).double() for r in range(world_size))
    return torch.as_tensor(total).float()


def sum_bound(world_size: int, numel: int, *, seed: int = 0) -> torch.Tensor:
    """Elementwise bound on |float32 ring sum - true sum| between two orders of the N vectors: (numel,), float64.

    Each float32 addition rounds by at most 2^-24 times the partial sum it
    produces, and every partial sum is at most sum_r |x_r| at that element.
    A sum of N terms rounds N-1 times; two such sums in different orders (or
    one and the float64 reference, rounded to float32 once) can differ by
    twice that plus one: `costs.reordered_sum_bound(N, sum_r |x_r|, extra_roundings=1)`.
    World size 1 has nothing to add: the result is exact (bound 0).
    """
    total = sum(rank_vector(r, numel, seed=seed).double().abs() for r in range(world_size))
    return costs.reordered_sum_bound(world_size, 1.0, extra_roundings=1 if world_size > 1 else 0) * total


def compare_ring(spec: RingAllReduceSpec, results: list[RingRank]) -> Verdict:
    """Every rank's ring result against the float64 sum and gloo's, in units of the rounding bound; bytes and rounds
    against 2(N-1)G/N and 2(N-1)."""
    n, numel, seed = spec.world_size, spec.numel, spec.seed
    expected, bound = reference_sum(n, numel, seed=seed), sum_bound(n, numel, seed=seed)
    why = "float32 sums in a different order: at most (2(N-1)+1) 2^-24 sum_r |x_r| per element; in units of that bound"
    checks = [Check(name=f"ring == single-process sum (rank {r}, in units of the rounding bound)",
                    error=bound_ratio(out.ours, expected, bound), tolerance=1.0, reason=why) for r, out in enumerate(results)]
    checks += [Check(name="ring == gloo all_reduce (rank 0, in units of the rounding bound)",
                     error=bound_ratio(results[0].ours, results[0].theirs, bound), tolerance=1.0, reason=why),
               close_check("every rank holds the same ring result", [o.ours for o in results],
                           [results[0].ours] * n, 0.0, "the all-gather copies one reduced chunk to all")]
    exact = counts_per_rank("bytes sent", [o.bytes_sent for o in results],
                            [costs.ring_allreduce_bytes(numel, n, r) for r in range(n)])
    exact += counts_per_rank("rounds", [o.rounds for o in results], [costs.ring_allreduce_rounds(n)] * n)
    return Verdict(checks=checks, exact=exact, params={"numel": numel, "dtype": "float32"})


RING_DEMO = Experiment(name="ring-allreduce", chapter="01", world_sizes=tuple(range(1, 9)),
                       spec=lambda n: RingAllReduceSpec(world_size=n), ranks=ring_vs_builtin, compare=compare_ring,
                       title="Ring all-reduce vs gloo's all_reduce vs the single-process sum")


def ring_allreduce_demo(world_size: int, *, numel: int = DEFAULT_NUMEL, seed: int = 0) -> Report:
    """Run the comparison on `world_size` ranks and build its Report."""
    return RING_DEMO.run_spec(RingAllReduceSpec(world_size=world_size, numel=numel, seed=seed))


DEMOS = [RING_DEMO]


# --- exercise (chapter 00): pass a value one step around the ring ---------------------

def ring_pass_inputs(rank: int, world_size: int) -> tuple[torch.Tensor]:
    """Rank r holds [r, 10r, 100r]."""
    return (torch.tensor([1.0, 10.0, 100.0]) * rank,)


def ring_pass_solution(ctx: Context, x: torch.Tensor) -> torch.Tensor:
    """Send x to the right neighbour, return what the left neighbour sent."""
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    received = torch.empty_like(x)
    return exchange(ctx, x, right, received, left, phase="ring pass")   # isend right, recv left, wait


RING_PASS = Exercise(
    name="ring pass",
    task="Return the tensor held by your left neighbour (rank - 1, wrapping around): "
         "every rank sends its x to rank + 1 and receives from rank - 1.",
    reference=ring_pass_solution,
    make_inputs=ring_pass_inputs,
    world_sizes=(2, 3, 4),
    hint="if every rank calls a blocking send first, all ranks wait for a receive that never "
         "starts. Post the send with dist.isend (or use wmdist.comm.exchange), then receive.",
)
EXERCISES = [RING_PASS]
