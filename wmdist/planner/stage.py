"""What one pipeline stage of a layout computes and moves per step (pure): the work behind the compute and
elementwise terms of the breakdown, per GPU of the stage with the most FLOPs.

* FLOPs: forward 2 x the active weights per token, attention 4 s (a d) per token halved by the causal mask
  (costs.ring_attention.attention_flops); backward twice the forward. Recomputed on top: a whole forward
  (full recompute), the attention core's forward (selective, without FlashAttention), and with FlashAttention
  FLASH_RECOMPUTE of the attention forward in every backward (the kernel recomputes S = Q K^T from Q and K
  instead of keeping it: its backward runs five s x s products to the forward's two, 2.5 x the forward, Dao et
  al. 2022 section 3.1; flash-attention's benchmarks/benchmark_flash_attention.py counts it so).
* HBM bytes of the elementwise work (norms, activations, softmax, dropout, residuals): each layer's saved
  activations (memory.layer_activation_bytes, the s x s scores included when FlashAttention does not fuse them
  away) moved HBM_PASSES times, twice more when full recompute runs the forward again; with sequence
  parallelism every tp rank moves 1 / tp of them.
"""
from __future__ import annotations

from typing import NamedTuple

from wmdist.costs.ring_attention import attention_flops
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.memory import _stage_layers, layer_activation_bytes
from wmdist.planner.model import TrainingJob

HBM_PASSES = 4           # a saved activation: written and read in forward, read and its gradient written in backward
FLASH_RECOMPUTE = 0.5    # FlashAttention's backward recomputes Q K^T: half the attention forward's FLOPs again


class StageWork(NamedTuple):
    """Per GPU per step, on the stage with the most FLOPs: FLOPs, of which recomputed, layers, HBM bytes."""
    flops: float
    recomputed: float
    layers: int
    hbm_bytes: float


def stage_work(job: TrainingJob, layout: ParallelLayout) -> StageWork:
    """The work of `layout`'s stages (module docstring), reported for the one with the most FLOPs."""
    m, s = job.model, job.seq_len
    tokens = -(-job.sequences // layout.dp) * s / layout.cp    # tokens a GPU's stage sees per step (tp shares them)
    attn = attention_flops(s, m.head_dim, heads=m.heads, causal=True) / s     # forward, per token and layer
    dense = 2 * (m.attention_params + m.dense_mlp_params) + attn
    moe = 2 * (m.attention_params + m.top_k * m.expert_params + m.shared_params + m.hidden * m.experts) + attn
    head = 2 * m.vocab * m.hidden
    scores = not job.flash_attention
    moved = [layer_activation_bytes(m, s, elem_bytes=job.elem_bytes, scores=scores, moe=moe_layer)[0]
             for moe_layer in (False, True)]
    passes = HBM_PASSES + (2 if layout.recompute == "full" else 0)
    flash_again = FLASH_RECOMPUTE * attn if job.flash_attention else 0.0
    per_gpu = tokens / layout.tp
    best = StageWork(0.0, 0.0, 0, 0.0)
    stages = _stage_layers(m, layout.pp, layout.padding)
    for i, (nd, nm) in enumerate(stages):
        fwd = nd * dense + nm * moe + (head if i == len(stages) - 1 else 0.0)
        again = {"none": 0.0, "selective": 0.0 if job.flash_attention else (nd + nm) * attn, "full": fwd}[
            layout.recompute] + (nd + nm) * flash_again
        work = (3 * fwd + again) * per_gpu
        if work > best.flops:
            best = StageWork(work, again * per_gpu, nd + nm, passes * (nd * moved[0] + nm * moved[1]) * per_gpu)
    return best
