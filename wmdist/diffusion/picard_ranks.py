"""Parallel-in-time sampling on N ranks: Picard iteration over the steps, each round's evaluations spread out.

Each round of `sampler.picard_sample` evaluates the velocity at every
unsettled step of the current guess, and those evaluations are independent.
Here step j's evaluation runs on rank j mod N (any run of consecutive steps
is then shared within one evaluation per rank). The running sum that
rebuilds the trajectory needs every velocity, so after its evaluations each
rank all-gathers the round's new velocities (a counted ring over uneven
chunks) and every rank rebuilds the same trajectory in the sequential
sampler's order. The bookkeeping is `picard_sample` itself, so the result is
bitwise the one-process Picard iterate, which after K rounds is bitwise the
sequential sample.

What it costs, measured against the sequential sampler's K evaluations in K
sequential slots: more evaluations in total (up to K(K+1)/2 for K rounds),
in sum_i ceil(e_i / N) slots on the busiest rank. It pays only when the
iterate is good enough after few rounds and N is close to the evaluations
per round.

The demo is an `Experiment`: `PicardSpec` holds the sampling spec, the run's
options, the noise and the sequential reference, all decided (and refused)
before any process starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.comm import Context, ring_all_gather
from wmdist.costs import diffusion as dcost
from wmdist.costs.validate import require_int, require_real
from wmdist.diffusion.denoiser import Denoiser
from wmdist.diffusion.results import PicardRun
from wmdist.diffusion.sampler import PicardResult, RoundEvaluator, picard_sample, running_sum_tolerance
from wmdist.diffusion.spec import SamplingSpec, check_noise, one_thread, reference_trajectory, require_world
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, exact_check


def spread_evaluations(ctx: Context, model: Denoiser, counts: list[int]) -> RoundEvaluator:
    """A Picard round evaluator for this rank: evaluate steps j with j mod N == rank, all-gather the rest.

    Appends the number of evaluations this rank ran to `counts`, one entry per round.
    """
    n, me = ctx.world_size, ctx.rank

    def evaluate(states: list[torch.Tensor], ts: list[float], steps: range) -> list[torch.Tensor]:
        mine = [j for j in steps if j % n == me]
        local = [model(states[j], ts[j]) for j in mine]                     # each (B, S, C)
        shape, per_step = states[0].shape, states[0].numel()
        owned = dcost.cyclic_step_counts(steps.start, steps.stop, n)
        chunk = torch.cat([v.reshape(-1) for v in local]) if local else states[0].new_empty(0)
        every = ring_all_gather(ctx, chunk, [c * per_step for c in owned], phase=f"round {len(counts)}")
        pieces = [p.view(c, *shape) for p, c in zip(every.split([c * per_step for c in owned]), owned)]
        counts.append(len(mine))
        # Rank r's piece holds its steps in increasing order: step j is entry (j - first_r) // N of piece j mod N.
        return [pieces[j % n][(j - steps.start - (j - steps.start) % n) // n] for j in steps]

    return evaluate


@dataclass(frozen=True)
class PicardRank:
    """One rank's Picard run: the result (the same trajectory on every rank), its evaluations and bytes per round."""
    result: PicardResult
    evaluations: tuple[int, ...]
    sent: tuple[int, ...]
    recv: tuple[int, ...]


def picard_on_ranks(ctx: Context, spec: SamplingSpec, noise: torch.Tensor, reference: torch.Tensor,
                    iterations: int, *, window: int | None, tol: float | None) -> PicardRank:
    """Rank function: Picard iteration with each round's evaluations spread over the ranks."""
    model, counts = Denoiser(spec.model), []
    result = picard_sample(model, noise, spec.steps, iterations, window=window, tol=tol, reference=reference,
                           evaluate=spread_evaluations(ctx, model, counts))
    rounds = [ctx.ledger.totals(phase=f"round {i}") for i in range(result.rounds)]
    return PicardRank(result, tuple(counts), tuple(r["bytes_sent"] for r in rounds),
                      tuple(r["bytes_recv"] for r in rounds))


def _check_run(iterations: int, window: int | None, tol: float | None) -> None:
    require_int("iterations", iterations, 1)
    if window is not None:
        require_int("window", window, 1)
    if tol is not None:
        require_real("tol", tol)


@dataclass(frozen=True, kw_only=True)
class PicardSpec:
    """diffusion-picard's run: what is sampled, Picard's options (iterations, window, tol), the noise, and the
    sequential reference trajectory (K+1, B, S, C) the rounds are measured against."""
    world_size: int
    sampling: SamplingSpec
    iterations: int
    window: int | None = None
    tol: float | None = None
    noise: torch.Tensor | None = None                          # None: the sampling spec's own noise
    reference: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        k_total = self.sampling.steps
        require_world(self.world_size, k_total, f"each rank needs a step to evaluate: there are {k_total} steps")
        _check_run(self.iterations, self.window, self.tol)
        object.__setattr__(self, "noise", check_noise(self.noise, self.sampling))
        object.__setattr__(self, "reference", reference_trajectory(self.sampling, self.noise))


def picard_spec(world_size: int, *, sampling: SamplingSpec | None = None, iterations: int | None = None,
                window: int | None = None, tol: float | None = None, noise: torch.Tensor | None = None) -> PicardSpec:
    """The spec, by default with 16 steps (or N when there are more ranks) and K iterations (every step exact)."""
    sampling = sampling or SamplingSpec(steps=max(16, require_int("world_size", world_size, 1)))
    return PicardSpec(world_size=world_size, sampling=sampling,
                      iterations=sampling.steps if iterations is None else iterations, window=window, tol=tol,
                      noise=noise)


def round_ranks(ctx: Context, spec: PicardSpec) -> PicardRank:
    """Rank function of diffusion-picard: `picard_on_ranks` on the spec."""
    return picard_on_ranks(ctx, spec.sampling, spec.noise, spec.reference, spec.iterations, window=spec.window,
                           tol=spec.tol)


def compare_picard(spec: PicardSpec, results: list[PicardRank]) -> Verdict:
    """Every rank's trajectory against rank 0's and the one-process Picard iterate (exact), the sequential sampler
    after K rounds; evaluations, bytes and rounds against the formulas."""
    k_total, n, x_T, ref = spec.sampling.steps, spec.world_size, spec.noise, spec.reference
    iterations, window, tol = spec.iterations, spec.window, spec.tol
    with one_thread():
        alone = picard_sample(Denoiser(spec.sampling.model), x_T, k_total, iterations, window=window, tol=tol,
                              reference=ref)
    outs = results
    result = outs[0].result
    level = running_sum_tolerance(ref)
    first = next((i for i, e in enumerate(result.errors, start=1) if e <= level), None)
    same = "same velocity calls on the same shapes; the gather copies bits; the sum runs in the same order"
    checks = [exact_check("every rank holds the same trajectory", [o.result.trajectory for o in outs],
                          [result.trajectory] * n, "each rebuilds it from the same gathered velocities, in order"),
              exact_check("N ranks == Picard in one process, every round's error", result.errors, alone.errors, same),
              exact_check("N ranks == Picard in one process, final trajectory", result.trajectory, alone.trajectory,
                          same)]
    if result.rounds >= k_total and tol in (None, 0.0):
        checks.append(exact_check("after K rounds: trajectory == sequential sampler", result.trajectory, ref,
                                  "round i makes state i exact, and no float operation differs from the sequential one"))
    if k_total > 1:
        checks.append(Check(name="stopped after 1 round: sample differs from the sequential one", error=result.sample_errors[0],
                            tolerance=1000 * level, reason="1000x the rounding level of the running sum: not converged", must_differ=True))
    exact = counts_per_rank("denoiser evaluations", [sum(o.evaluations) for o in outs],
                            [sum(_owned(lo, hi, n)[r] for lo, hi in _schedule(result)) for r in range(n)])
    exact += counts_per_rank("velocity bytes sent, all rounds", [sum(o.sent) for o in outs],
                             [sum(dcost.picard_gather_bytes(lo, hi, n, r, x_T.numel())["sent"]
                                  for lo, hi in _schedule(result)) for r in range(n)])
    exact += counts_per_rank("velocity bytes received, round 1", [o.recv[0] for o in outs],
                             [dcost.picard_gather_bytes(*_schedule(result)[0], n, r, x_T.numel())["recv"]
                              for r in range(n)], step=1)
    if tol is None:
        total = sum(dcost.picard_evaluations(k_total, iterations, window=window))
        exact += counts_per_rank("evaluations, all ranks together", [o.result.total_evaluations for o in outs],
                                 [total] * n)
        exact += counts_per_rank("rounds", [o.result.rounds for o in outs],
                                 [dcost.picard_rounds(k_total, iterations)] * n)
    data = PicardRun(result=result, steps=k_total, world_size=n, rounding_level=level, first_at_rounding=first)
    params = {"steps": k_total, "batch": spec.sampling.batch, "iterations": iterations, "window": window, "tol": tol,
              "sequential_evaluations": dcost.sequential_evaluations(k_total)}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


PICARD_DEMO = Experiment(name="diffusion-picard", chapter="08", world_sizes=(2, 4), spec=picard_spec,
                         title="Picard iteration over the steps on N ranks: error per round, extra work",
                         ranks=round_ranks, compare=compare_picard)


def picard_demo(world_size: int, *, spec: SamplingSpec | None = None, iterations: int | None = None,
                window: int | None = None, tol: float | None = None, noise: torch.Tensor | None = None) -> Report:
    """Picard over the steps on N ranks (default: every step, K rounds) against the sequential sampler.

    Default spec: 16 steps, or N when there are more ranks.
    """
    return PICARD_DEMO.run_spec(picard_spec(world_size, sampling=spec, iterations=iterations, window=window, tol=tol,
                                            noise=noise))


def _schedule(result: PicardResult) -> list[tuple[int, int]]:
    """(lo, hi) of the steps each round evaluated, read back from the settled counts and evaluations."""
    starts = [0] + [s - 1 for s in result.settled[:-1]]
    return [(lo, lo + e) for lo, e in zip(starts, result.evaluations)]


def _owned(lo: int, hi: int, n: int) -> list[int]:
    return dcost.cyclic_step_counts(lo, hi, n)


DEMOS = [PICARD_DEMO]
