"""Chapter 07's registered demos and exercise, gathered from the modules that define them (in course order)."""
from __future__ import annotations

from wmdist.scan import affine_demos, affine_ranks, cell_demos, one_process, picard_ranks

DEMOS = affine_demos.DEMOS + one_process.DEMOS + cell_demos.DEMOS + picard_ranks.DEMOS
EXERCISES = list(affine_ranks.EXERCISES)
