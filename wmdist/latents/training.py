"""Data-parallel training with stochastic latents: every rank draws its own latent noise.

The gradient all-reduce still gives every rank the same update, so the
parameters stay identical (bitwise) on every rank, and they equal one process
that drew every rank's noise itself, in rank order (up to float32 rounding:
the means are taken in another order). Independent streams need no
synchronization of the random numbers.

The model and both runs are in noisy_dp.py (re-exported here); this file is
the demo, an `Experiment` ("latent-dp"): `LatentDPSpec` is checked before
any process starts, each rank returns a `NoisyDPRun`.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist import costs
from wmdist.comm import Context
from wmdist.costs.validate import require_fields
from wmdist.course.experiment import Experiment, RankSpec, Verdict
from wmdist.latents.noisy_dp import NoisyDPRun, StochasticLatentModel, noisy_dp_train, noisy_single_process
from wmdist.course.report import Report, close_check, counts_per_rank, exact_check

__all__ = ["NoisyDPRun", "StochasticLatentModel", "noisy_dp_train", "noisy_single_process", "LatentDPSpec",
           "latent_dp_rank", "compare_latent_dp", "LATENT_DP_DEMO", "dp_latents_demo", "DEMOS"]


@dataclass(frozen=True, kw_only=True)
class LatentDPSpec(RankSpec):
    """The run, decided before any process starts: N ranks, `steps` SGD steps on `rows_per_rank` rows each."""
    steps: int = 3
    rows_per_rank: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_fields(self, ("steps", "rows_per_rank"), 1)


def latent_dp_rank(ctx: Context, spec: LatentDPSpec) -> NoisyDPRun:
    """Rank function: `noisy_dp_train` with the spec's sizes, each rank on its own noise stream."""
    return noisy_dp_train(ctx, spec.steps, spec.rows_per_rank, seed=spec.seed)


def compare_latent_dp(spec: LatentDPSpec, results: list[NoisyDPRun]) -> Verdict:
    """Parameters bitwise equal over ranks, close to one process drawing every rank's noise; bytes vs the ring."""
    n, steps = spec.world_size, spec.steps
    expected = noisy_single_process(n, steps, spec.rows_per_rank, seed=spec.seed)
    numel = expected.numel()
    checks = [exact_check("parameters identical on every rank", [r.params for r in results],
                          [results[0].params] * n, "every rank applies the same all-reduced gradient"),
              close_check("rank 0 == one process drawing every rank's noise", results[0].params, expected, 1e-5,
                          "float32 means taken in another order (shard means then ring sum vs one batch "
                          "mean): ~1e-7 relative per step on O(1) weights, 3 steps of lr 0.1")]
    exact = counts_per_rank("bytes sent", [r.bytes_sent for r in results],
                            [steps * costs.ring_allreduce_bytes(numel, n, r) for r in range(n)])
    return Verdict(checks=checks, exact=exact, params={"steps": steps, "rows_per_rank": spec.rows_per_rank,
                                                       "parameters": numel, "mode": "independent"})


LATENT_DP_DEMO = Experiment(name="latent-dp", chapter="02", world_sizes=(1, 2, 4),
                            title="Independent latent noise per rank: identical parameters after all-reduced steps",
                            spec=lambda n: LatentDPSpec(world_size=n), ranks=latent_dp_rank,
                            compare=compare_latent_dp)


def dp_latents_demo(world_size: int, *, steps: int = 3, rows_per_rank: int = 2, seed: int = 0) -> Report:
    """Independent latent streams per rank, identical parameters after every all-reduced step."""
    return LATENT_DP_DEMO.run_spec(LatentDPSpec(world_size=world_size, steps=steps, rows_per_rank=rows_per_rank,
                                                seed=seed))


DEMOS = [LATENT_DP_DEMO]
