"""Memory per GPU for a layout, from the memory calculator (memory.footprint): what the planner asks it, and why.

The calculator counts; this module only says what to count for a transformer on a layout:

* Dtypes: bf16 weights, fp32 gradients (Megatron's main_grad buffer), Adam with fp32 master weights and
  moments: 2 + 4 + 4 + 8 = 18 bytes per parameter before ZeRO (over the data-parallel ranks).
* Pieces: each (pp, tp) rank's exact share (`param_pieces`): its stage's layers (tensor_split over pp, as
  the calculator splits activations) with attention and the dense or shared-expert MLP divided by tp and the
  norms whole; the embedding on the first stage and the head and final norm on the last, divided by tp.
* Routed experts are a second calculator call: E/ep experts per MoE layer on the stage, not tensor-split
  (each tp rank holds its expert-parallel share whole), ZeRO over dp/ep (the expert-data-parallel group).
* Activations per token and layer (`layer_activation_bytes`, below) with the schedule's peak microbatches in
  flight (costs.pipeline.peak_activations_in_flight on the stage's rank), sequence parallelism on with tp.

Why the activation formula lives here and not in memory/presets.py: the presets describe GPT-3-era blocks
with Korthikanti et al.'s formula, which costs.tensor_parallel.korthikanti_layer_bytes also holds; the
published runs add gated MLPs, grouped-query attention, FlashAttention and experts, whose saved tensors are
listed below. For a GPT-3 block (GELU, g = a, dropout) it gives Korthikanti's 34 h + 5 a s bytes per token
(tests/test_planner_memory.py holds the two equal).
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.pipeline import peak_activations_in_flight
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.model import TrainingJob, TransformerSpec

DTYPES = {"param_dtype": "bf16", "grad_dtype": "fp32", "optimizer": "adam", "master_weights": True}


def layer_activation_bytes(model: TransformerSpec, seq_len: int, *, elem_bytes: int = 2, scores: bool,
                           moe: bool) -> tuple[float, float]:
    """(A, R): bytes one layer saves for backward per token, and the part TP without SP keeps whole.

    Saved per token, in elements: the two norms' inputs 2h, the QKV input h, Q h, K and V 2gd, the attention
    output h, the MLP input h; a gated MLP 3F (the fused SwiGLU's gate and up input, 2F, and its output F, which
    the down projection reads: Megatron's fused kernel recomputes the activation), a GELU one 2F (its input and
    output); an MoE MLP k(h + cF_e) for the k routed copies plus S cF_e for the shared experts (c = 3 or 2).
    Dropout adds two 1-byte masks of h. With `scores` (no FlashAttention and no recompute), the a x s softmax
    output (and, with dropout, its mask and dropped output): 2as bytes, or 5as. R = the norm inputs, QKV and
    MLP inputs (4h elements) plus the dropout masks.
    """
    h, e, c = model.hidden, elem_bytes, 3 if model.gated else 2
    attention = 6 * h + 2 * model.kv_heads * model.head_dim
    shared = model.shared_experts * c * (model.shared_ffn or model.expert_ffn)
    mlp = model.top_k * (h + c * model.expert_ffn) + shared if moe else c * model.ffn
    masks = 2 * h if model.dropout else 0
    quadratic = (5 if model.dropout else 2) * model.heads * seq_len if scores else 0
    return float((attention + mlp) * e + masks + quadratic), float(4 * h * e + masks)


@functools.lru_cache(maxsize=4096)
def _stage_layers(model: TransformerSpec, pp: int, padding: int = 0) -> tuple[tuple[int, int], ...]:
    """(dense-MLP layers, MoE layers) on each stage: layers tensor_split over pp, the dense ones first. With
    `padding` slots (ParallelLayout.padding), layers + padding are split and the first stage gives up
    ceil(padding / 2) blocks, the last floor(padding / 2): the room the embedding and the head take."""
    sizes = list(ring_chunk_sizes(model.layers + padding, pp))
    sizes[0] -= padding - padding // 2
    sizes[-1] -= padding // 2
    out, start = [], 0
    for n in sizes:
        dense = max(0, min(start + n, model.layers - model.moe_layers) - start)
        out.append((dense, n - dense))
        start += n
    return tuple(out)


def _pieces(model: TransformerSpec, layout: ParallelLayout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Elements per (pp, tp) piece, index pp_rank * tp + tp_rank: (non-routed weights, routed experts)."""
    tp, h = layout.tp, model.hidden
    shared = model.shared_params
    head = math.ceil(model.vocab * h / tp)
    dense_part, expert_part = [], []
    stages = _stage_layers(model, layout.pp, layout.padding)
    for s, (dense, moe) in enumerate(stages):
        n = dense * (math.ceil((model.attention_params + model.dense_mlp_params) / tp) + 2 * h)
        n += moe * (math.ceil((model.attention_params + shared) / tp) + 2 * h + h * model.experts)
        if s == 0:
            n += head
        if s == len(stages) - 1:
            n += (0 if model.tied_embeddings and s == 0 else head) + h
        dense_part += [n] * tp
        expert_part += [moe * (model.experts // layout.ep) * model.expert_params] * tp
    return tuple(dense_part), tuple(expert_part)


def in_flight(layout: ParallelLayout, micro: int, *, stage: int) -> Fraction:
    """Plain-stage microbatch sets stage `stage` holds at its peak: 1F1B min(P - r, M); interleaved, the virtual
    stages' count over v (each holds 1/v of the stage's layers)."""
    if layout.virtual == 1:
        return Fraction(peak_activations_in_flight("1f1b", layout.pp, micro, rank=stage))
    return Fraction(peak_activations_in_flight("interleaved", layout.pp, micro, chunks=layout.virtual, rank=stage),
                    layout.virtual)


def memory_configs(job: TrainingJob, layout: ParallelLayout) -> tuple[MemoryConfig, MemoryConfig | None]:
    """The calculator's two configs: (non-routed weights with the activations, routed experts or None)."""
    m = job.model
    dense_pieces, expert_pieces = _pieces(m, layout)
    scores = not job.flash_attention and layout.recompute == "none"
    a_dense, r = layer_activation_bytes(m, job.seq_len, elem_bytes=job.elem_bytes, scores=scores, moe=False)
    a_moe, _ = layer_activation_bytes(m, job.seq_len, elem_bytes=job.elem_bytes, scores=scores, moe=True)
    act = (a_dense * (m.layers - m.moe_layers) + a_moe * m.moe_layers) / m.layers     # per-layer mean
    main = MemoryConfig(params=sum(dense_pieces), param_pieces=dense_pieces, dp=layout.dp, tp=layout.tp,
                        pp=layout.pp, cp=layout.cp, zero_stage=layout.zero, layers=m.layers, seq_len=job.seq_len,
                        micro_batch=layout.micro_batch, act_bytes_per_token_per_layer=act,
                        act_replicated_bytes_per_token_per_layer=r, sequence_parallel=layout.tp > 1,
                        checkpointing=layout.recompute == "full", input_bytes_per_token=m.hidden * job.elem_bytes,
                        **DTYPES)
    if not m.experts:
        return main, None
    experts = MemoryConfig(params=sum(expert_pieces), param_pieces=expert_pieces, dp=layout.dp // layout.ep,
                           tp=layout.tp, pp=layout.pp, zero_stage=layout.zero, layers=m.layers, **DTYPES)
    return main, experts


def gpu_memory(job: TrainingJob, layout: ParallelLayout) -> dict[str, int]:
    """Bytes by kind (the calculator's KINDS and "total") on the fullest GPU: the first or the last stage, at
    data-parallel coordinate 0 (ZeRO's largest shard), with the schedule's peak in flight."""
    main, experts = memory_configs(job, layout)
    micro = layout.microbatches(job)
    best: dict[str, int] = {}
    stages = _stage_layers(m := job.model, layout.pp, layout.padding)
    for stage in sorted({0, layout.pp - 1}):
        # the calculator splits the layers evenly over pp; a padded partition's end stages hold fewer, so
        # their sets in flight are scaled by (layers here / the calculator's layers on that stage)
        even = ring_chunk_sizes(m.layers, layout.pp)[stage]
        scale = Fraction(sum(stages[stage]), even) if even else Fraction(1)
        got = per_rank_bytes(main, rank=stage * layout.tp * layout.cp * layout.dp,
                             in_flight=in_flight(layout, micro, stage=stage) * scale)
        if experts is not None:
            more = per_rank_bytes(experts, rank=stage * layout.tp * (layout.dp // layout.ep))
            got = {k: got[k] + (more[k] if k not in ("activations", "batch") else 0) for k in got}
            got["total"] = sum(v for k, v in got.items() if k != "total")
        if got["total"] > best.get("total", -1):
            best = got
    return best
