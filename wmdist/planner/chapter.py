"""Chapter 11: its registered demos and exercises, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter. The planner is pure: its demos are chapter 09's
mesh step, which the notebook runs beside the planner's prediction of it, so it registers none of its own.
"""
from __future__ import annotations

from wmdist.planner import exercises

DEMOS: list = []
EXERCISES = list(exercises.EXERCISES)
