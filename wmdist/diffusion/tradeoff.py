"""When does Picard sampling pay? Work and sequential slots against the number of ranks, in one process.

The sequential sampler spends K evaluations in K slots (one evaluation time
each). Picard iteration spends more evaluations; with N ranks a round of e
evaluations takes ceil(e / N) slots. Two ways to run it:

- exact: every unsettled step each round, K rounds (the guarantee). Its
  slots never drop below K, whatever N: round i still has to happen.
- ParaDiGMS-style: a window of N steps (one per rank) and a tolerance on how
  far a state moved in the last round, settling states early. Fewer rounds,
  approximate.

The evaluation counts come from real `picard_sample` runs (the tolerance
makes them data-dependent); the slots are `costs.diffusion.picard_critical_path`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist.costs import diffusion as dcost
from wmdist.costs.validate import require_int, require_positive
from wmdist.diffusion.denoiser import Denoiser
from wmdist.diffusion.sampler import picard_sample
from wmdist.diffusion.spec import SamplingSpec, one_thread, reference_trajectory


@dataclass(kw_only=True, frozen=True)
class TradeoffRow:
    """One way of sampling with N ranks: how much work, how many slots, how far from the sequential sample."""
    method: str            # "sequential", "exact Picard" or "window N, tol"
    world_size: int        # N
    rounds: int            # sequential rounds (iterations; K for the sequential sampler)
    evaluations: int       # denoiser evaluations, all ranks together
    slots: int             # evaluation slots on the busiest rank, summed over rounds
    sample_error: float    # max |sample - sequential sample|



def tradeoff(spec: SamplingSpec, world_sizes: list[int], *, tol: float = 1e-4,
             noise: torch.Tensor | None = None) -> list[TradeoffRow]:
    """Sequential, exact Picard and windowed Picard (window N, settling at `tol`) for each N."""
    sizes = [require_int("world_sizes", n, 1) for n in world_sizes]
    tol = require_positive("tol", tol)
    k_total = spec.steps
    x_T = spec.noise() if noise is None else noise
    ref = reference_trajectory(spec, x_T)
    exact_evals = dcost.picard_evaluations(k_total, k_total)
    rows = [TradeoffRow(method="sequential", world_size=1, rounds=k_total, evaluations=k_total, slots=k_total, sample_error=0.0)]
    model = Denoiser(spec.model)
    for n in sizes:
        rows.append(TradeoffRow(method="exact Picard", world_size=n, rounds=k_total, evaluations=sum(exact_evals),
                                slots=dcost.picard_critical_path(exact_evals, n), sample_error=0.0))
        with one_thread():
            fast = picard_sample(model, x_T, k_total, k_total, window=n, tol=tol, reference=ref)
        rows.append(TradeoffRow(method=f"window N, tol {tol:g}", world_size=n, rounds=fast.rounds, evaluations=fast.total_evaluations,
                                slots=dcost.picard_critical_path(fast.evaluations, n), sample_error=fast.sample_errors[-1]))
    return rows
