"""Chapter 10: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.experts import balance, demos, ep_dp, exercises

DEMOS = demos.DEMOS + balance.DEMOS + ep_dp.DEMOS
EXERCISES = list(exercises.EXERCISES)
