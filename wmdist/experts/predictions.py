"""The answer to chapter 10's prompt: the bytes rank 3 receives in the one-expert router's dispatch.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.experts.demos import EP_DEMO
from wmdist.experts.spec import layer_spec
from wmdist.ui.predict import Answer


def dispatch_bytes() -> Answer:
    """Run the one-expert layer on 4 ranks; rank 3's dispatch bytes, measured and by formula."""
    one = EP_DEMO.renamed("moe-ep (one expert)").run_spec(layer_spec(4, routers=("one expert",), ks=(1,)))
    where = dict(quantity="bytes received", phase="dispatch", case="one expert, k=1")
    return Answer(measured=one.measured(**where)[3], formula=one.predicted(**where)[3],
                  formula_text="(N-1)(T/N) d x 4 B",
                  why="each of the 3 other ranks sends its 8 tokens' rows; rank 3's own 8 stay home "
                      "(see 'Reading the bytes' below)")
