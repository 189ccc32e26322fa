"""The small end of the planner: chapter 09's mesh step on this machine, predicted from what chapter 01 measures.

The same terms as a cluster's step (planner.breakdown's StepBreakdown, its overlap rule and the pipeline bubble),
with this CPU as the "cluster": every rank in one node, one link whose latency is the fitted alpha and whose
bandwidth is 1/beta, and compute at the matmul FLOP/s one process reaches, shared when there are more ranks than
cores (each gets cores / ranks of it). What each rank sends per axis is costs.mesh.axis_traffic, exact for the
transformer world model the mesh runs (chapter 09 checks it against the ledger). What overlaps:

* tp, pp: nothing (each send waits for the one before it);
* cp: the ring hides under the rank's attention compute, as on a GPU;
* dp: nothing either, since mesh.step syncs the gradient buckets after the whole schedule: hidden_after with
  no window (the rule a cluster step uses with the last microbatch's backward);
* the bubble: costs.pipeline.bubble_over_ideal(pp, M) of the busy time (GPipe and 1F1B alike).

Compute counts the blocks' matmuls (2 FLOPs per weight per token forward: QKV, output, the two MLP layers),
causal attention (costs.ring_attention.attention_flops), the embedding on the first stage and the head on the
last, backward twice the forward. No elementwise or optimizer term: at these sizes they are inside the measured
per-call overheads that alpha already carries. The notebook runs the step and shows this beside it; a timing is
never a checked output.
"""
from __future__ import annotations

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.mesh import Link, StepShape, Traffic, axis_traffic, microbatch_rows, stage_layers
from wmdist.costs.pipeline import bubble_over_ideal
from wmdist.costs.ring_attention import attention_flops
from wmdist.costs.validate import require_int, require_positive
from wmdist.planner.breakdown import AxisTime, StepBreakdown, hidden_after


def stage_flops(shape: StepShape, coords: dict[str, int]) -> tuple[float, float]:
    """(FLOPs of the whole step, of which attention) on the rank at `coords`: forward and backward."""
    h, f = shape.width, shape.hidden
    heads = ring_chunk_sizes(shape.heads, shape.tp)[coords["tp"]]
    units = ring_chunk_sizes(f, shape.tp)[coords["tp"]]
    layers = stage_layers(shape, coords["pp"])
    matmul = 2 * (4 * h * heads * shape.head_dim + 2 * h * units)          # per token and layer, forward
    ends = 0
    if coords["pp"] == 0:
        ends += 2 * (shape.obs_dim + shape.action_dim) * h
    if coords["pp"] == shape.pp - 1:
        ends += 2 * h * shape.obs_dim
    total = attention = 0.0
    for rows in microbatch_rows(shape, coords["dp"]):
        tokens = rows * shape.tokens
        attn = attention_flops(shape.seq_len, shape.head_dim, heads=heads, batch=rows, causal=True) / shape.cp
        total += 3 * (layers * (matmul * tokens + attn) + ends * tokens)
        attention += 3 * layers * attn
    return total, attention


def mesh_step_prediction(shape: StepShape, *, alpha_s: float, beta_s_per_byte: float, flops_per_s: float,
                         cores: int, coords: dict[str, int] | None = None) -> StepBreakdown:
    """The predicted step of the rank at `coords` (default: the first, which holds the embedding) of chapter 09's
    mesh, from chapter 01's alpha (s per message), beta (s per byte) and one process's matmul FLOP/s."""
    require_positive("alpha_s", alpha_s)
    require_positive("beta_s_per_byte", beta_s_per_byte)
    require_positive("flops_per_s", flops_per_s)
    require_int("cores", cores, 1)
    where = coords or {"dp": 0, "tp": 0, "pp": 0, "cp": 0}
    traffic = axis_traffic(shape, where)
    link = Link(alpha_s, 1 / beta_s_per_byte)
    rate = flops_per_s * min(1.0, cores / shape.world_size)
    work, attention = stage_flops(shape, where)
    compute = work / rate
    axes = {}
    for axis in ("tp", "pp", "cp", "dp"):
        seconds = sum(link.terms(traffic[axis])) if traffic[axis].messages else 0.0
        window = attention / rate if axis == "cp" else 0.0
        axes[axis] = AxisTime(traffic=traffic[axis], in_node=True, seconds=seconds,
                              exposed=hidden_after(seconds, window, floor_share=0.0) if axis in ("cp", "dp")
                              else seconds)
    axes["ep"] = AxisTime(traffic=Traffic(0, 0), in_node=True, seconds=0.0, exposed=0.0)
    busy = compute + axes["tp"].exposed + axes["cp"].exposed
    bubble = bubble_over_ideal(shape.pp, shape.microbatches) * busy
    model = sum(stage_flops(shape, {"dp": d, "tp": t, "pp": p, "cp": 0})[0] * shape.cp
                for d in range(shape.dp) for t in range(shape.tp) for p in range(shape.pp))
    return StepBreakdown(compute=compute, recompute=0.0, elementwise=0.0, optimizer=0.0, bubble=bubble,
                         axes={a: axes[a] for a in ("tp", "cp", "ep", "pp", "dp")}, model_flops=model,
                         gpus=shape.world_size, peak_flops=flops_per_s)
