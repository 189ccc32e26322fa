"""Chapter 04: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.tensor_parallel import demos, exercises, overlap

DEMOS = [*demos.DEMOS, overlap.TP_OVERLAP]
EXERCISES = list(exercises.EXERCISES)
