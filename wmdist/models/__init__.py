"""The world models every technique is run on, above costs/ and below the course's core.

    world.py        the tiny world model (MLP dynamics, chapters 01-03), its data, flat parameter/gradient buffers
    transformer.py  the tiny transformer world model (chapters 04-09): TransformerConfig, blocks, make_transformer

Import the module you need (`from wmdist.models.world import make_model`); this file imports neither,
so reading one model does not load the other. It holds the one way every part is built the same on every
rank: `seeded`.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import torch

Built = TypeVar("Built")


def seeded(build: Callable[[], Built], seed: int) -> Built:
    """`build()` run with torch's CPU generator seeded by `seed`, the caller's random state left as it was:
    weights that depend only on the seed, so every rank and the one-process reference build the same ones."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
