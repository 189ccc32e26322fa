"""Picard sweeps on N ranks: every chunk in parallel from guessed boundary states, repeated until nothing moves.

Sweep 0 starts chunk r from zeros (chunk 0 from h0): the wrong guess of the
chunks-from-zero pitfall. After each sweep rank r sends its last state to
rank r + 1 (counted point to point), which becomes that rank's start for the
next sweep, and the ranks all-gather how far their start moved (one float
each, counted). After sweep k the first k + 1 chunks are exact, so after at
most N sweeps every chunk is, bit for bit: then no start moves and the ranks
stop. Stopping earlier, once every start moves by less than `stop_below`,
is the explicitly approximate scheme the text mentions: its error is measured,
not assumed. Either way each sweep reruns all T steps: N sweeps spend N
times the loop's work to reach, at best, the loop's own depth.

`SweepPlan` is what the ranks run (checked before any process starts); the
demo scan-picard is an `Experiment` on one, built by `sweep_plan` from the
same seeded episodes as scan-cell (spec.EpisodeSpec).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wmdist.comm import Context, all_gather, barrier, isend, recv
from wmdist.costs.scan import handoff_bytes, picard_depth, picard_work, time_chunk_sizes
from wmdist.costs.validate import require_int, require_real
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, exact_check, max_abs_error
from wmdist.runtime import run
from wmdist.scan.boundaries import CellInputs, CountingStep, relative, time_chunk
from wmdist.scan.cell import GRUCell, picard, rollout
from wmdist.scan.results import PicardSweeps
from wmdist.scan.spec import EpisodeSpec
from wmdist.base.spans import Span

BOUNDARIES, CONVERGENCE = "picard boundaries", "picard convergence"


@dataclass(kw_only=True, frozen=True)
class PicardRankRun:
    """One rank's sweeps: its chunk's states after each, the global start change after each, spans, counts."""
    sweep_states: tuple[torch.Tensor, ...]   # each (B, L_r, n)
    changes: tuple[float, ...]               # max over ranks of |new start - old start|, per sweep
    spans: tuple[Span, ...]
    calls: int
    boundary_sent: int
    boundary_recv: int
    convergence_sent: int


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """The sweeps N ranks run: the cell and inputs, at most `max_sweeps` sweeps, stopping once no start moves
    by more than `stop_below`. Validated when built."""
    inputs: CellInputs
    max_sweeps: int
    stop_below: float = 0.0

    def __post_init__(self) -> None:
        require_int("max_sweeps", self.max_sweeps, 1)
        require_real("stop_below", self.stop_below, low=0.0)

    @property
    def world_size(self) -> int:
        return self.inputs.world_size


def picard_rank(ctx: Context, plan: SweepPlan) -> PicardRankRun:
    """Rank function: sweep my chunk from my current start, pass my last state on, stop when no start moves."""
    cell, x, h0, step_seconds = plan.inputs.cell, plan.inputs.x, plan.inputs.h0, plan.inputs.step_seconds
    max_sweeps, stop_below = plan.max_sweeps, plan.stop_below
    r, n = ctx.rank, ctx.world_size
    xs, step = time_chunk(x, r, n), CountingStep(cell, step_seconds)
    start = h0 if r == 0 else torch.zeros_like(h0)                          # (B, n): sweep 0's guess
    sweeps, changes, spans = [], [], []
    barrier(ctx, phase="picard: start together")
    for k in range(max_sweeps):
        t0 = time.perf_counter()
        states = rollout(step, xs, start)                                   # (B, L_r, n)
        t1 = time.perf_counter()
        pending = isend(ctx, states[:, -1], r + 1, phase=BOUNDARIES) if r < n - 1 else None
        new_start = recv(ctx, torch.empty_like(h0), r - 1, phase=BOUNDARIES) if r > 0 else start
        if pending is not None:
            pending.wait()
        moved = (new_start - start).abs().max().reshape(1)                  # (1,)
        everyone = all_gather(ctx, moved, phase=CONVERGENCE)                # (N,)
        spans += [Span(row=r, start=t0, end=t1, kind="compute", label=f"sweep {k}"), Span(row=r, start=t1, end=time.perf_counter(), kind="comm", label=f"sweep {k}")]
        sweeps.append(states)
        changes.append(float(everyone.max()))
        start = new_start
        if changes[-1] <= stop_below:
            break
    b, c = ctx.ledger.totals(phase=BOUNDARIES), ctx.ledger.totals(phase=CONVERGENCE, kind="collective")
    return PicardRankRun(sweep_states=tuple(sweeps), changes=tuple(changes), spans=tuple(spans), calls=step.calls, boundary_sent=b["bytes_sent"], boundary_recv=b["bytes_recv"],
                         convergence_sent=c["bytes_sent"])


def run_picard(world_size: int, cell: GRUCell, x: torch.Tensor, h0: torch.Tensor, *, max_sweeps: int | None = None,
               stop_below: float = 0.0, step_seconds: float = 0.0) -> list[PicardRankRun]:
    """Validate, then sweep on N ranks (at most `max_sweeps`, default N: enough for exactness).

    A helper for tests: it calls `runtime.run` itself; the demo is PICARD_DEMO (`sweeps_demo`).
    """
    inputs = CellInputs(world_size=world_size, cell=cell, x=x, h0=h0, step_seconds=step_seconds)
    plan = SweepPlan(inputs=inputs, max_sweeps=inputs.world_size if max_sweeps is None else max_sweeps,
                     stop_below=stop_below)
    return run(picard_rank, plan.world_size, plan)


def sweep_states(results: list[PicardRankRun]) -> list[torch.Tensor]:
    """The whole trajectory (B, T, n) after each sweep, chunks joined along time."""
    return [torch.cat([r.sweep_states[k] for r in results], dim=1) for k in range(len(results[0].sweep_states))]


def sweeps_needed(changes: list[float], stop_below: float) -> int:
    """How many sweeps the stopping rule runs, given every sweep's start change: up to the first <= stop_below."""
    for k, change in enumerate(changes):
        if change <= stop_below:
            return k + 1
    return len(changes)


def sweep_plan(world_size: int, *, steps: int = 37, batch: int = 8, stop_below: float = 0.0,
                step_seconds: float = 1e-4, seed: int = 0) -> SweepPlan:
    """scan-picard's plan: the seeded episodes (spec.EpisodeSpec, as scan-cell's) swept N times at most."""
    inputs = EpisodeSpec(world_size=world_size, steps=steps, batch=batch, step_seconds=step_seconds,
                         seed=seed).inputs
    return SweepPlan(inputs=inputs, max_sweeps=world_size, stop_below=stop_below)


def compare_sweeps(plan: SweepPlan, results: list[PicardRankRun]) -> Verdict:
    """The ranks' sweeps against the single-process sweeps (exact) and the loop; sweeps, calls, bytes vs formulas."""
    gru, x, h0, n, stop_below = plan.inputs.cell, plan.inputs.x, plan.inputs.h0, plan.world_size, plan.stop_below
    exact = rollout(gru, x, h0)
    reference = picard(gru, x, h0, n)                                      # all N sweeps, one process
    k = sweeps_needed(reference.changes, stop_below)
    states = sweep_states(results)
    errors = [max_abs_error(s, exact) for s in states]
    same = "the ranks run the same chunks from the same starts as the single-process sweeps"
    checks: list[Check] = [
        exact_check("error after each sweep == single-process Picard", errors, reference.errors[:k], same),
        exact_check("start changes seen by the ranks == single-process Picard", list(results[0].changes),
                    reference.changes[:k], same)]
    if stop_below == 0:
        checks.append(exact_check("after the last sweep (at most N) == loop", states[-1], exact,
                                  "every chunk started from the true state, bit for bit"))
    sizes = time_chunk_sizes(x.shape[1], n)
    hop = [handoff_bytes(gru.state_size, x.shape[0], n, r, elem_size=h0.element_size()) for r in range(n)]
    exact_counts = counts_per_rank("sweeps", [len(r.sweep_states) for r in results], [k] * n)
    exact_counts += counts_per_rank("cell calls", [r.calls for r in results], [k * s for s in sizes])
    exact_counts += counts_per_rank("boundary bytes sent", [r.boundary_sent for r in results],
                                    [k * h["bytes_sent"] for h in hop])
    exact_counts += counts_per_rank("boundary bytes received", [r.boundary_recv for r in results],
                                    [k * h["bytes_recv"] for h in hop])
    exact_counts += counts_per_rank("convergence bytes sent", [r.convergence_sent for r in results],
                                    [k * h0.element_size()] * n)
    t = x.shape[1]
    data = PicardSweeps(chunk_sizes=tuple(sizes), errors=tuple(errors), changes=tuple(results[0].changes),
                        work=tuple(picard_work(t, j) for j in range(1, k + 1)),
                        depth=tuple(picard_depth(t, n, j) for j in range(1, k + 1)), loop_steps=t, stop_below=stop_below,
                        spans=tuple(relative([s for r in results for s in r.spans])))
    return Verdict(checks=checks, exact=exact_counts, data=data,
                   params={"steps": t, "batch": x.shape[0], "stop_below": stop_below,
                           "step_seconds": plan.inputs.step_seconds})


PICARD_DEMO = Experiment(name="scan-picard", chapter="07", world_sizes=(1, 2, 4, 8),
                         title="Picard sweeps over N ranks: exact after at most N sweeps, at N times the work",
                         spec=sweep_plan, ranks=picard_rank, compare=compare_sweeps)


def sweeps_demo(world_size: int, *, steps: int = 37, batch: int = 8, stop_below: float = 0.0,
                step_seconds: float = 1e-4, seed: int = 0) -> Report:
    """Picard sweeps on N ranks against the single-process sweeps and the loop; exact when stop_below = 0."""
    return PICARD_DEMO.run_spec(sweep_plan(world_size, steps=steps, batch=batch, stop_below=stop_below,
                                            step_seconds=step_seconds, seed=seed))


DEMOS = [PICARD_DEMO]
