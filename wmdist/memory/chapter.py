"""Chapter 03: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.memory import activation_recompute, exercises, sharded_checkpoint, zero_demos

DEMOS = zero_demos.DEMOS + activation_recompute.DEMOS + sharded_checkpoint.DEMOS
EXERCISES = list(exercises.EXERCISES)
