"""Demo scan-cell: a Dreamer-style GRU core on N ranks, time split three ways, checked against one process.

The chunks-from-zero pitfall must miss the loop by more than rounding can
explain; the boundary hand-off must equal the loop bit for bit; the episode
split must equal it within a bound derived along the trajectory (bounds.py).
Cell calls and bytes per rank are counted and compared with their formulas.
The demo is an `Experiment`: its spec, spec.EpisodeSpec (shared with
scan-picard), seeds the cell and inputs and refuses a bad size (fewer than 2
ranks, more than T or B) before any process.
"""
from __future__ import annotations

from wmdist.course.compare import ROUNDOFF
from wmdist.costs.scan import handoff_bytes, time_chunk_sizes
from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Count, Report, close_check, counts_per_rank, differ_check, exact_check
from wmdist.scan.boundaries import SCHEMES, BoundaryRank, boundaries_rank, stitch, timeline, waits
from wmdist.scan.bounds import propagated_bound
from wmdist.scan.cell import rollout, step_errors
from wmdist.scan.results import CellSplit
from wmdist.scan.spec import EpisodeSpec, episodes

__all__ = ["episodes", "cell_spec", "cell_ranks", "compare_cell", "CELL_DEMO", "cell_demo", "DEMOS"]


def cell_spec(world_size: int, *, steps: int = 37, batch: int = 8, step_seconds: float = 1e-4,
              seed: int = 0) -> EpisodeSpec:
    """scan-cell's inputs: seeded episodes on at least 2 ranks (one rank has nothing to split)."""
    return EpisodeSpec(world_size=world_size, steps=steps, batch=batch, step_seconds=step_seconds, seed=seed,
                       min_world_size=2)


def cell_ranks(ctx: Context, spec: EpisodeSpec) -> BoundaryRank:
    """Rank function: the three schemes (boundaries.boundaries_rank) on the spec's inputs."""
    return boundaries_rank(ctx, spec.inputs)


def compare_cell(spec: EpisodeSpec, results: list[BoundaryRank]) -> Verdict:
    """Each scheme against the loop in one process (the pitfall must miss it), calls and bytes vs formulas."""
    cell, x, h0, n, step_seconds = (spec.inputs.cell, spec.inputs.x, spec.inputs.h0, spec.world_size,
                                    spec.step_seconds)
    exact = rollout(cell, x, h0)                                           # (B, T, n), one process
    bound = propagated_bound(cell, x, h0, exact, ROUNDOFF[x.dtype])
    sizes = time_chunk_sizes(x.shape[1], n)
    why_bound = "rounding alone, propagated along the trajectory's Jacobians (bounds.propagated_bound)"
    from_zero = stitch(results, "from zero")
    checks = [differ_check("chunks started from zero are WRONG", from_zero, exact, bound, "more than " + why_bound),
              exact_check("rank 0's chunk (started from h0) == loop", from_zero[:, :sizes[0]], exact[:, :sizes[0]],
                          "the same start and the same operations as the loop"),
              exact_check("boundary states handed rank to rank == loop", stitch(results, "hand-off"), exact,
                          "every chunk starts from the true state bit for bit and repeats the loop's operations"),
              close_check("episodes split over ranks == loop", stitch(results, "episodes"), exact, bound,
                          "fewer rows per matrix product sum in another order: " + why_bound)]
    counts: list[Count] = []
    per_rank_calls = {"from zero": sizes, "hand-off": sizes, "episodes": [x.shape[1]] * n}
    elem = h0.element_size()
    traffic = [handoff_bytes(cell.state_size, x.shape[0], n, r, elem_size=elem) for r in range(n)]
    for name in SCHEMES:
        counts += counts_per_rank("cell calls", [r[name].calls for r in results], per_rank_calls[name], case=name)
        sent = [t["bytes_sent"] for t in traffic] if name == "hand-off" else [0] * n
        recvd = [t["bytes_recv"] for t in traffic] if name == "hand-off" else [0] * n
        counts += counts_per_rank("bytes sent", [r[name].bytes_sent for r in results], sent, case=name)
        counts += counts_per_rank("bytes received", [r[name].bytes_recv for r in results], recvd, case=name)
    least = tuple(step_seconds * x.shape[0] * sum(sizes[:r]) for r in range(n))
    data = CellSplit(chunk_sizes=tuple(sizes), from_zero_errors=tuple(step_errors(from_zero, exact).tolist()), bound=bound,
                     timelines={name: timeline(results, name) for name in SCHEMES}, waits=tuple(waits(results)), least_waits=least, step_seconds=step_seconds)
    return Verdict(checks=checks, exact=counts, data=data,
                   params={"steps": x.shape[1], "batch": x.shape[0], "state_size": cell.state_size,
                           "dtype": "float32", "step_seconds": step_seconds})


CELL_DEMO = Experiment(name="scan-cell", chapter="07", world_sizes=(2, 4, 8),
                       title="GRU core over N ranks: chunks from zero (wrong), boundary hand-off, episodes split",
                       spec=cell_spec, ranks=cell_ranks, compare=compare_cell)


def cell_demo(world_size: int, *, steps: int = 37, batch: int = 8, step_seconds: float = 1e-4,
              seed: int = 0) -> Report:
    """Chunks from zero (wrong), boundary hand-off (exact, sequential), episodes split (exact, parallel)."""
    return CELL_DEMO.run_spec(cell_spec(world_size, steps=steps, batch=batch, step_seconds=step_seconds, seed=seed))


DEMOS = [CELL_DEMO]
