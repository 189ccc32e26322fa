"""What the chapter's demos sample, checked before any process starts, and the single-device reference.

A `SamplingSpec` names the denoiser, the number of samples, the Euler steps
and the noise seed; every demo takes one. The checks here refuse what cannot
run (a step count below one, noise whose token count is not the model's, more
ranks than tokens to shard) with one line naming the argument, so a bad call
never reaches the ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.course.compare import one_thread
from wmdist.costs.validate import require_int
from wmdist.diffusion.denoiser import Denoiser, DenoiserConfig
from wmdist.diffusion.sampler import initial_noise, sample


@dataclass(frozen=True, kw_only=True)
class SamplingSpec:
    """B samples of a video latent, drawn with K Euler steps of a seeded denoiser from seeded noise."""
    model: DenoiserConfig = field(default_factory=DenoiserConfig)
    batch: int = 2        # B: independent samples
    steps: int = 8        # K: Euler steps from t = 1 (noise) to t = 0
    seed: int = 0         # seed of the initial noise (the weights have their own, model.seed)

    def __post_init__(self) -> None:
        if not isinstance(self.model, DenoiserConfig):
            raise ValueError(f"model must be a DenoiserConfig, got {type(self.model).__name__}")
        require_int("batch", self.batch, 1)
        require_int("steps", self.steps, 1)
        require_int("seed", self.seed, 0)

    @property
    def state_elems(self) -> int:
        """Numbers in one sample's state: S tokens times C channels."""
        return self.model.tokens * self.model.channels

    def noise(self) -> torch.Tensor:                       # -> (B, S, C)
        """The initial noise x_T: sample b depends only on (seed, b)."""
        return initial_noise(self.batch, self.model.tokens, self.model.channels, seed=self.seed)


def check_noise(noise: torch.Tensor | None, spec: SamplingSpec) -> torch.Tensor:
    """The spec's own noise, or `noise` if its shape is (B, S, C) for this spec; else one clear ValueError."""
    if noise is None:
        return spec.noise()
    want = (spec.batch, spec.model.tokens, spec.model.channels)
    if not isinstance(noise, torch.Tensor) or tuple(noise.shape) != want or noise.dtype != torch.float32:
        got = (f"a {str(noise.dtype).removeprefix('torch.')} tensor of shape {tuple(noise.shape)}"
               if isinstance(noise, torch.Tensor) else type(noise).__name__)
        raise ValueError(f"noise must be a float32 tensor of shape {want} (batch, tokens "
                         f"{spec.model.frames}x{spec.model.height}x{spec.model.width}, channels), got {got}")
    return noise


def require_world(world_size: int, most: int, what: str) -> int:
    """world_size as an int from 1 to `most`, else a ValueError saying what there are too few of."""
    n = require_int("world_size", world_size, 1)
    if n > most:
        raise ValueError(f"world_size must be at most {most} ({what}), got {n}")
    return n


def reference_trajectory(spec: SamplingSpec, noise: torch.Tensor) -> torch.Tensor:   # -> (K+1, B, S, C)
    """The single-device sequential sampler's every state, on one thread."""
    with one_thread():
        return sample(Denoiser(spec.model), noise, spec.steps, trajectory=True)
