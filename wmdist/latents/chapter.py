"""Chapter 02: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.latents import demos, training

DEMOS = training.DEMOS + demos.DEMOS
EXERCISES = list(demos.EXERCISES)
