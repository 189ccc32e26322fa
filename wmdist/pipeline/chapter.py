"""Chapter 05: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.pipeline import demos, exercises, measure, overlap, rollout, versus_torch

DEMOS = demos.DEMOS + versus_torch.DEMOS + measure.DEMOS + overlap.DEMOS + rollout.DEMOS
EXERCISES = list(exercises.EXERCISES)
