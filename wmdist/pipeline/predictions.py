"""The answer to chapter 05's prompt: the idle fraction of the forward pipeline at P = 4, M = 6.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs import pipeline as pcosts
from wmdist.pipeline import measure
from wmdist.ui.predict import Answer


def bubble_idle_fraction() -> Answer:
    """Time the forward pipeline at P = 4, M = 6 on four ranks: the median idle fraction, and the formula's."""
    run = measure.bubble_demo(4, microbatches=6)
    return Answer(measured=run.data.median_idle, formula=pcosts.bubble_fraction(4, 6),
                  formula_text="(P-1)/(M+P-1) at P = 4, M = 6",
                  why="every stage waits P-1 of the M+P-1 slots (see 'Where each stage waits'), and each hop adds a "
                      "little latency on top: see 'Why the measurement sits above the formula' below")
