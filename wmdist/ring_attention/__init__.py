"""Chapter 06, long context: ring attention, built from attention one block at a time.

blockwise.py: single-process attention over (query block, key/value block)
pairs with online softmax: `attend_block` scores one pair and returns its
partial output with the log-sum-exp of its scores, `merge` combines two
partials exactly, `attend_block_backward` gives one pair's share of the
gradients by recomputation, and `blockwise_attention` strings them together
into full attention (equal to scaled_dot_product_attention) whose temporary
score memory is bounded by the block size, measured by `peak_score_bytes`.
A rank of the ring calls the same block functions on the key/value block it
holds at each step.
layout.py (pure, no torch): which global token positions each rank holds
(contiguous or zigzag), which key/value block a rank holds at each ring step,
how much causal work each (rank, step) pair does and which pairs are skipped.
The bytes, FLOPs and memory these imply live in wmdist.costs.ring_attention.
"""
