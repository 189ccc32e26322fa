"""What one pipeline stage of a layout computes and moves per step, and the pipeline's fill and drain (pure).

`stage_work` is the work behind the breakdown's compute, elementwise and bubble terms, per GPU of each stage:

* FLOPs: forward 2 x the active weights per token, attention 4 s (a d) per token halved by the causal mask
  (costs.ring_attention.attention_flops); backward twice the forward. Recomputed on top: a whole forward
  (full recompute), the attention core's forward (selective, without FlashAttention), and with FlashAttention
  FLASH_RECOMPUTE of the attention forward in every backward (the kernel recomputes S = Q K^T from Q and K
  instead of keeping it: its backward runs five s x s products to the forward's two, 2.5 x the forward, Dao et
  al. 2022 section 3.1; flash-attention's benchmarks/benchmark_flash_attention.py counts it so).
* HBM bytes of the elementwise work (norms, activations, softmax, dropout, residuals, the loss): each layer's
  saved activations (memory.layer_activation_bytes) moved HBM_PASSES times, twice more when full recompute runs
  the forward again; selective recompute re-runs the attention core, so the s x s scores it saves (kept when
  FlashAttention does not fuse them away) move twice more. The last stage adds the loss: Megatron's
  vocab-parallel cross-entropy moves LOSS_BYTES per logit (V / tp logits per token and tp rank). With sequence
  parallelism every tp rank moves 1 / tp of the rest.

The slowest stage (compute at the GPU type's efficiency plus elementwise at HBM bandwidth) sets the pace of the
steady state; the fill and drain pass through every stage once at its own pace, so the bubble over the ideal
step is costs.pipeline.fill_drain_time(stage times, M) / (M x the slowest) - 1, which is Megatron's (P - 1) / M
(costs.pipeline.bubble_over_ideal) when the stages are equal and less when some stage is lighter (the first and
last of a padded partition, every stage but the one holding the output head). Chapter 05's simulator
(wmdist.pipeline.simulate) runs 1F1B to exactly this when the slowest stage is the last, and a little faster when
it is in the middle. Interleaving passes v chunks of each stage, a v-th of it each: the bubble over v, as
bubble_over_ideal's chunks.
"""
from __future__ import annotations

from typing import NamedTuple

from wmdist.costs.pipeline import fill_drain_time
from wmdist.costs.ring_attention import attention_flops
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.memory import _stage_layers, layer_activation_bytes
from wmdist.planner.model import TrainingJob

HBM_PASSES = 4           # a saved activation: written and read in forward, read and its gradient written in backward
FLASH_RECOMPUTE = 0.5    # FlashAttention's backward recomputes Q K^T: half the attention forward's FLOPs again
# Megatron's vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py), bytes per logit,
# kernel by kernel: forward .float() 2 + 4, max 4, subtract 4 + 4, exp 4 + 4, sum 4, divide 4 + 4 (the softmax
# kept for backward); backward multiply by the incoming gradient 4 + 4, the cast back to bf16 4 + 2.
LOSS_BYTES = 52


class StageWork(NamedTuple):
    """Per GPU per step, on the slowest stage: FLOPs, of which recomputed, layers, HBM bytes; and every stage's
    seconds (compute at the efficiency plus elementwise), which the fill and drain pass through."""
    flops: float
    recomputed: float
    layers: int
    hbm_bytes: float
    stage_seconds: tuple[float, ...]


def stage_work(job: TrainingJob, layout: ParallelLayout) -> StageWork:
    """The work of `layout`'s stages (module docstring), reported for the one whose seconds are the most."""
    m, s, c = job.model, job.seq_len, job.cluster
    tokens = -(-job.sequences // layout.dp) * s / layout.cp    # tokens a GPU's stage sees per step (tp shares them)
    attn = attention_flops(s, m.head_dim, heads=m.heads, causal=True) / s     # forward, per token and layer
    dense = 2 * (m.attention_params + m.dense_mlp_params) + attn
    moe = 2 * (m.attention_params + m.top_k * m.expert_params + m.shared_params + m.hidden * m.experts) + attn
    head = 2 * m.vocab * m.hidden
    scores = not job.flash_attention
    moved = [layer_activation_bytes(m, s, elem_bytes=job.elem_bytes, scores=scores, moe=moe_layer)[0]
             for moe_layer in (False, True)]
    quadratic = moved[0] - layer_activation_bytes(m, s, elem_bytes=job.elem_bytes, scores=False, moe=False)[0]
    passes = HBM_PASSES + (2 if layout.recompute == "full" else 0)
    scores_again = 2 * quadratic if layout.recompute == "selective" else 0.0
    flash_again = FLASH_RECOMPUTE * attn if job.flash_attention else 0.0
    rate, hbm = c.efficiency * c.peak_flops, c.hbm_bytes_per_s
    per_gpu = tokens / layout.tp
    stages = _stage_layers(m, layout.pp, layout.padding)
    rows = []
    for i, (nd, nm) in enumerate(stages):
        last = i == len(stages) - 1
        fwd = nd * dense + nm * moe + (head if last else 0.0)
        again = {"none": 0.0, "selective": 0.0 if job.flash_attention else (nd + nm) * attn, "full": fwd}[
            layout.recompute] + (nd + nm) * flash_again
        moved_here = passes * (nd * moved[0] + nm * moved[1]) + (nd + nm) * scores_again \
            + (LOSS_BYTES * m.vocab if last else 0.0)
        rows.append(((3 * fwd + again) * per_gpu, again * per_gpu, nd + nm, moved_here * per_gpu))
    seconds = tuple(w / rate + b / hbm for w, _, _, b in rows)
    slowest = max(range(len(rows)), key=seconds.__getitem__)
    return StageWork(*rows[slowest], stage_seconds=seconds)


def bubble_ratio(work: StageWork, microbatches: int, virtual: int) -> float:
    """The pipeline's fill and drain over the ideal step (module docstring): fill_drain_time of the stages'
    seconds over M times the slowest, less one, over the v chunks of the interleaved schedule."""
    slowest = max(work.stage_seconds)
    if len(work.stage_seconds) == 1 or slowest == 0:
        return 0.0
    fill = fill_drain_time(work.stage_seconds, microbatches) / (microbatches * slowest) - 1
    return fill / virtual
