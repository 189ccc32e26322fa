"""The answers to chapters 00's and 01's "predict before you measure" prompts: each runs the ring and
returns the measured bytes, the formula's and why they agree or differ.

They live here, not in the notebook, so the cell above a prompt's buttons names a function and
states neither the formula nor the reasoning: those belong to the reveal (issue 33). Each runs
only when the learner presses a button (`Prediction.answer_with`).
"""
from __future__ import annotations

from wmdist import costs
from wmdist.data_parallel import ring
from wmdist.ui.predict import Answer


def _passed(run, what: str):
    if not run.passed:
        raise RuntimeError(f"the {what} failed its checks:\n{run}")
    return run


def ring8_bytes() -> Answer:
    """Chapter 00: sum 1,000 floats with the ring on 8 ranks; rank 0's bytes from the ledger, and 2(N-1)G/N."""
    run = _passed(ring.ring_allreduce_demo(8, numel=1000), "ring demo")
    return Answer(measured=run.measured(quantity="bytes sent")[0], formula=costs.ring_allreduce_ideal_bytes(4000, 8),
                  formula_text="2(N-1)G/N at N = 8, G = 4,000 B",
                  why="more ranks mean more rounds, 2(N-1), but each round moves a smaller chunk, G/N: the bytes "
                      "per rank grow towards 2G and never past it, however many ranks join")


def ring_bytes(g_ring: int) -> Answer:
    """Chapter 01: the ring on 4 ranks over ring.DEFAULT_NUMEL floats (`g_ring` bytes); rank 2's bytes from the
    ledger, against the 2(N-1)G/N rule and the exact count with uneven chunks."""
    run = _passed(ring.ring_allreduce_demo(4), "ring demo")
    sent = run.measured(quantity="bytes sent")
    exact = [costs.ring_allreduce_bytes(ring.DEFAULT_NUMEL, 4, r) for r in range(4)]
    return Answer(measured=sent[2], formula=costs.ring_allreduce_ideal_bytes(g_ring, 4),
                  formula_text=f"2(N-1)G/N at N = 4, G = {g_ring:,} B",
                  why=f"the rule assumes N divides the payload; the chunks are "
                      f"{costs.ring_chunk_sizes(ring.DEFAULT_NUMEL, 4)} floats, and the ledger's bytes per rank, "
                      f"{sent}, equal costs.ring_allreduce_bytes with those chunks, {exact} (see 'Uneven chunks' "
                      "below)")
