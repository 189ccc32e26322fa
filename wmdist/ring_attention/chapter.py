"""Chapter 06: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.ring_attention import balance, demos, exercises, generation, long_context, pruned_demo, versus_torch

DEMOS = (demos.DEMOS + pruned_demo.DEMOS + versus_torch.DEMOS + balance.DEMOS + long_context.DEMOS
         + generation.DEMOS)
EXERCISES = list(exercises.EXERCISES)
