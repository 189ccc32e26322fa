"""Chapter 04: tensor parallelism (Megatron's column/row split) and sequence vs context parallelism.

The algorithm is in layers.py (column- and row-parallel linear layers as autograd Functions, and the ring
collectives on activations they call) and block.py (the transformer block split by heads and hidden units,
the Megatron pairing, with or without sequence parallelism); neither imports the harness. The rest checks it:

    layouts.py        one MLP split four ways: the collectives follow the layout
    sequence.py       Megatron SP vs context parallelism on the same block; bytes kept for backward, measured
    versus_dtensor.py ours vs torch's DTensor ColwiseParallel / RowwiseParallel
    overlap.py        tp-overlap: the MLP's all-reduce blocking vs async behind the next matmuls (same bytes)
    compare.py        tolerances and Report rows (gradients, collectives against their formulas)
    demos.py          the chapter's DEMOS
    tables.py         the notebook's tables: measured integers next to the formulas
    exercises.py      the row-parallel forward exercise

The formulas (collectives per layout, exact bytes, activation bytes with and
without SP) live in wmdist.costs.tensor_parallel.
"""
