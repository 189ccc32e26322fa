"""The answer to chapter 06's prompt: how many K, V blocks rank 0 sends in one causal forward pass.

Here, not in the notebook, so nothing above the prompt's buttons states the formula or the
reasoning before the learner presses one (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs import ring_attention as costs
from wmdist.ring_attention import demos
from wmdist.ui.predict import Answer


def kv_sends() -> Answer:
    """Ring attention on 3 ranks: rank 0's forward K, V bytes in blocks, measured by the ledger and by formula."""
    ring3 = demos.ring_attention_demo(3)
    p = ring3.params
    one_block = costs.kv_block_bytes(p["seq_len"], 3, p["kv_width"], batch=p["batch"], elem_size=4)   # float32
    sent = ring3.measured(quantity="bytes sent", phase="ring kv", case="float32 causal contiguous")[0]
    if sent % one_block:
        raise ValueError(f"rank 0 sent {sent} bytes, not a whole number of {one_block}-byte blocks")
    return Answer(measured=sent // one_block, formula=costs.ring_kv_sends(3), formula_text="ring_kv_sends(N) = N - 1",
                  why="after N - 1 passes every query has met every key, so the ring stops there, and the uniform "
                      "ring passes a block on even to a rank that skips it; the paper's loop sends one block more: "
                      "see 'The forward sends N - 1 blocks per rank and stops' after the byte counts below")
