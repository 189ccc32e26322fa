"""Chapter 08: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.diffusion import exercises, picard_ranks, step_parallel, token_parallel

DEMOS = token_parallel.DEMOS + step_parallel.DEMOS + picard_ranks.DEMOS
EXERCISES = list(exercises.EXERCISES)
