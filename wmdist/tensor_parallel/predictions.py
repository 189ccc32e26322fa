"""The answer to chapter 04's prompt: the bytes rank 0 sends in one forward and backward of the block.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist import costs
from wmdist.tensor_parallel import demos
from wmdist.ui.predict import Answer


def block_bytes(n: int, g_block: int) -> Answer:
    """Run the block on `n` ranks: rank 0's bytes from the ledger, against 4 ring all-reduces of the
    `g_block`-byte activation."""
    run = demos.tp_block_demo(n)
    if not run.passed:
        raise RuntimeError(f"the tensor-parallel block demo failed its checks:\n{run}")
    return Answer(measured=run.data.bytes_sent["tp"][0], formula=4 * costs.ring_allreduce_ideal_bytes(g_block, n),
                  formula_text="4 x 2(N-1)G/N",
                  why="two column-then-row pairs, each summed once in forward and once in backward: see "
                      "'Megatron-LM's pairing' at the top, and the table below for N = 4")
