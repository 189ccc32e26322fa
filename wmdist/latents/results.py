"""What chapter 02's demos measured, as plain records: the data figures and notebooks read.

Kept apart from the demos that fill them, so a figure imports these and never a runner.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.latents.estimators import SeedMode


@dataclass(kw_only=True, frozen=True)
class EstimatorStats:
    """One estimator over all draws: its exact expectation, sample mean, bias, variance per draw, standard error."""
    name: str
    exact: float
    mean: float
    bias: float
    variance: float
    se: float

    @property
    def bias_in_se(self) -> float:
        return self.bias / self.se


@dataclass(kw_only=True, frozen=True)
class SeedStats:
    """One seeding mode: correlation of ranks 0 and 1, variances of one rank and of the rank average."""
    mode: SeedMode
    corr_rank0_rank1: float
    var_one_rank: float
    var_average: float
    var_ratio: float          # N var(average) / var(one rank): 1 for independent ranks
    rse: float                # relative standard error of that ratio
