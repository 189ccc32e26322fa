"""Chapter 07: its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.scan import affine_demos, affine_ranks, cell_demos, one_process, picard_ranks

DEMOS = affine_demos.DEMOS + one_process.DEMOS + cell_demos.DEMOS + picard_ranks.DEMOS
EXERCISES = list(affine_ranks.EXERCISES)
