"""The answer to chapter 08's prompt: how many denoiser evaluations exact Picard iteration spends.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs import diffusion as dcost
from wmdist.diffusion import picard_ranks
from wmdist.diffusion.spec import SamplingSpec
from wmdist.ui.predict import Answer


def picard_total_evaluations() -> Answer:
    """Exact Picard over K = 12 steps on 4 ranks: evaluations on all ranks, counted, and by formula."""
    run = picard_ranks.picard_demo(4, spec=SamplingSpec(steps=12))
    return Answer(measured=run.data.result.total_evaluations, formula=sum(dcost.picard_evaluations(12, 12)),
                  formula_text="K + (K-1) + ... + 1",
                  why="a velocity evaluated at a state that is already exact is final and kept, so each round "
                      "evaluates one step fewer than the one before: see 'Which velocities a round keeps' below")
