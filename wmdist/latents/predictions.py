"""The answer to chapter 02's prompt: what the straight-through estimate of dJ/dlogit averages to.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.latents import demos, estimators as E
from wmdist.ui.predict import Answer


def straight_through_mean() -> Answer:
    """Run the estimators on 4 ranks: straight-through's mean over all 80,000 draws, and its expectation."""
    run = demos.estimators_demo(4)
    if not run.passed:
        raise RuntimeError(f"the estimators demo failed its checks:\n{run}")
    return Answer(measured=run.data["straight-through"].mean, formula=E.straight_through_expectation(E.LOGIT),
                  formula_text=f"2(p - t) p(1 - p), t = {E.TARGET}",
                  why="straight-through replaces the cost difference between the two outcomes, (1 - t)^2 - t^2 = "
                      "1 - 2t, by the cost's slope at the draw, 2(b - t), which averages to 2(p - t): a different "
                      "number unless p = 1/2 (see 'Pitfall: straight-through is biased' below)")
