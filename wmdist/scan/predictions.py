"""The answer to chapter 07's prompt: the bytes rank 1 sends all-gathering the chunk summaries.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs import scan as costs
from wmdist.scan import affine_demos
from wmdist.ui.predict import Answer


def summary_bytes() -> Answer:
    """The n = 12 systems on 4 ranks: rank 1's all-gather bytes from the ledger, and from the formula."""
    run = affine_demos.affine_demo(4, state_sizes=(12,))
    sent = run.measured(quantity="bytes sent", case="dense n=12 T=37, gathered")[1]
    formula = costs.allgather_summary_bytes(12, 2, 4, diagonal=False, elem_size=4)["bytes_sent"]
    return Answer(measured=sent, formula=formula, formula_text="(N-1) B (n^2 + n) x 4",
                  why="a summary is n^2 + n numbers per sequence, whatever the chunk length, and a ring all-gather "
                      "passes on the N - 1 summaries that are not the rank's own: see 'The all-gather moves' after "
                      "the byte counts below")
