"""The answer to chapter 03's prompt: the bytes rank 0 sends in one ZeRO-3 training step.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs.zero import zero_step_bytes
from wmdist.memory import zero_demos
from wmdist.ui.predict import Answer


def zero3_step_bytes(params: int) -> Answer:
    """Train under ZeRO-3 on 4 ranks (a model of `params` parameters): rank 0's bytes per step from the ledger,
    and the collectives' ring formulas."""
    run = zero_demos.zero_memory_report(4, 3)
    if not run.passed:
        raise RuntimeError(f"the ZeRO-3 demo failed its checks:\n{run}")
    phases = zero_step_bytes(params, 4, 0, 3)           # {collective: bytes rank 0 sends in it}
    return Answer(measured=sum(run.measured(quantity="bytes sent per step", phase=phase)[0] for phase in phases),
                  formula=sum(phases.values()), formula_text="(two all-gathers + one reduce-scatter)",
                  why="stage 3 gathers the weights twice, before forward and again before backward, then "
                      "reduce-scatters the gradient; each sends (N-1)/N of the model, half an all-reduce; "
                      "see the stage 3 bullet above")
