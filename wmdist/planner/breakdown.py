"""One training step of a layout, predicted as a sum of terms: compute, each axis's exposed communication, the bubble.

The terms, per GPU of the slowest pipeline stage (stage.stage_work), and what each assumes:

* compute: the stage's FLOPs (stage.stage_work: forward 2 x active weights per token, attention 4 s (a d) per
  token halved by the causal mask, costs.ring_attention.attention_flops; backward twice the forward; recompute
  adds a forward (full) or the attention core's forward (selective, without FlashAttention); FlashAttention's
  backward recomputes Q K^T, half the attention forward again) at `cluster.efficiency` x peak, the one
  efficiency of the GPU type.
* elementwise: norms, activations, softmax, residual adds and the loss run at HBM bandwidth, not on the tensor
  cores: each saved activation (memory.layer_activation_bytes) moved HBM_PASSES times (more with full
  recompute; the s x s scores more with selective recompute, which re-runs the attention core), and on the last
  stage LOSS_BYTES per logit for the cross-entropy (stage.stage_work), in series with the matmuls. It is what
  makes small models slower per FLOP than large ones.
* optimizer: the Adam step reads and writes OPTIMIZER_BYTES per local weight at HBM bandwidth, after the step.
* tp: Megatron with sequence parallelism, 4 reduce-scatters + 4 all-gathers of b (s/cp) h per layer and
  microbatch (costs.tensor_parallel.megatron_layer_bytes), 4 more with full recompute. Not overlapped.
* cp: the ring of costs.ring_attention (K, V forward and backward, dK, dV back: 3 (cp - 1) sends of the
  rank's key-value block per layer and microbatch). Overlapped with that layer's attention compute (forward,
  backward and FlashAttention's recomputed Q K^T): only what exceeds it is exposed.
* ep: per MoE layer and microbatch the counts exchange and 4 all-to-alls (dispatch, combine, both backward) of
  the rank's b s / (cp tp) tokens, uniform routing (costs.experts). Not overlapped.
* pp: a middle stage's sends, one activation forward and one gradient back per microbatch and virtual stage,
  b (s/cp) h / tp elements each (scattered by sequence parallelism). Not overlapped (they are small).
* dp: costs.zero.zero_step_bytes over the dp x cp ranks (context-parallel ranks hold the same weights); the
  routed experts' over dp / ep. The gradient reduction overlaps the backward of the last microbatch and the
  parameter all-gather the forward of the first (sharded gradients, ZeRO-2 and 3, are reduce-scattered every
  microbatch, and ZeRO-3 gathers every microbatch, each behind that microbatch), except one layer's share of
  one collective, the bucket that is ready last (the first to be needed) in the step's last microbatch (every
  earlier microbatch's last bucket runs beside the next one's compute): exposed = max(T - window, T / (layers
  on the stage x the collectives of that kind in the step)).
  ZeRO-3 runs every collective layer by layer (layers x (N - 1) ring latencies), and with full recompute the
  recomputed forward gathers the freed weights once more (DeepSpeed's hooks release them after each forward).
* contention (cp and dp, the overlapped axes): a collective that runs beside the matmuls holds some SMs (one
  thread block per NCCL channel), so the hidden part H still costs comm_sm_share x H: exposed + share x H.
* bubble: the fill and drain over the ideal step, times the slowest stage's busy time (compute, elementwise,
  tp, cp, ep): stage.bubble_ratio, costs.pipeline.fill_drain_time of every stage's seconds over M x the
  slowest's, less one, over v (Megatron's (P - 1) / (v M) when the stages are equal; a stage holding the head
  or fewer layers fills and drains faster than it paces the steady state).

Each axis runs on the link tier its groups get when the ranks are numbered tp fastest, then cp, ep, the
rest of dp, pp (costs.mesh.strides / axis_in_node): inside a node the fast link, else the network per GPU.
Axes are assumed not to contend for a link. MFU = model FLOPs / (step time x GPUs x peak), with model FLOPs
per token 6 N_active + 6 L (s + 1) (a d) (model_flops_per_token: no recompute, only the query-key pairs the
causal mask keeps; PaLM's 12 L s (a d), Chowdhery et al. 2022 appendix B, and Megatron's 72 B s L h^2 (1 + s/6h
+ V/12Lh) per step, Narayanan et al. 2021, count every pair).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from wmdist.costs import experts as ecosts
from wmdist.costs.mesh import Link, Traffic, axis_in_node, strides
from wmdist.costs.ring_attention import attention_flops, ring_backward_bytes_per_rank, ring_kv_bytes_per_rank
from wmdist.costs.tensor_parallel import megatron_layer_bytes
from wmdist.costs.zero import zero_step_bytes, zero_step_rounds
from wmdist.memory.footprint import local_params
from wmdist.planner.layout import ParallelLayout, check_layout
from wmdist.planner.memory import _pieces, _stage_layers, memory_configs
from wmdist.planner.model import ClusterSpec, TrainingJob, TransformerSpec
from wmdist.planner.stage import FLASH_RECOMPUTE, bubble_ratio, stage_work

TERMS = ("compute", "elementwise", "optimizer", "bubble", "tp", "cp", "ep", "pp", "dp")   # the stacked bar
# The chapter whose demo checked each term's formula on real ranks (the notebook labels the bar with them).
TERM_CHAPTERS = {"compute": "01 (matmul FLOP/s, measured)", "elementwise": "00 (saved activations, the calculator)",
                 "optimizer": "03 (ZeRO: what each rank updates)", "bubble": "05 (pipeline schedules)",
                 "tp": "04 (tensor and sequence parallelism)", "cp": "06 (ring attention)", "ep": "10 (experts)",
                 "pp": "05 (boundary transfers)", "dp": "01 and 03 (buckets, ZeRO collectives)"}
OPTIMIZER_BYTES = 30     # Adam per local parameter: read grad, master, m, v (4 each), write master, m, v, bf16 weight
RANK_ORDER = ("tp", "cp", "ep", "edp", "pp")                    # fastest-varying first; dp = ep x edp


@dataclass(frozen=True, kw_only=True)
class AxisTime:
    """One axis on one GPU for one step: what it sends, on which tier, its time there and the part not hidden."""
    traffic: Traffic
    in_node: bool
    seconds: float
    exposed: float


@dataclass(frozen=True, kw_only=True)
class StepBreakdown:
    """A predicted step: the terms (seconds, TERMS), each axis's detail, and the FLOPs MFU is counted from."""
    compute: float
    recompute: float                 # the part of compute spent recomputing (inside compute)
    elementwise: float               # norms, activations, softmax, dropout, residuals: HBM-bound
    optimizer: float                 # the Adam step over the GPU's local weights: HBM-bound
    bubble: float
    axes: dict[str, AxisTime]        # tp, cp, ep, pp, dp
    model_flops: float               # per step, all GPUs: tokens x model_flops_per_token
    gpus: int
    peak_flops: float

    @property
    def terms(self) -> dict[str, float]:
        """Seconds of each stacked term, TERMS order."""
        return {"compute": self.compute, "elementwise": self.elementwise, "optimizer": self.optimizer,
                "bubble": self.bubble, **{a: self.axes[a].exposed for a in TERMS[4:]}}

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (step time x GPUs x peak)."""
        return self.model_flops / (self.total * self.gpus * self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: as mfu, counting the recomputed FLOPs too."""
        return self.mfu * self.compute / (self.compute - self.recompute) if self.compute > self.recompute else 0.0


def model_flops_per_token(model: TransformerSpec, seq_len: int) -> float:
    """6 N_active + 6 L (s + 1) (a d): the forward's 2 FLOPs per active weight (backward twice that) and, three
    times over, attention's QK^T and AV forward on the pairs the causal mask keeps (costs.ring_attention's
    attention_flops, causal), no recompute. PaLM's 6N + 12 L s (a d) counts every pair instead."""
    attention = attention_flops(seq_len, model.head_dim, heads=model.heads, causal=True) / seq_len
    return 6 * model.active_matmul_params + 3 * model.layers * attention


def hidden_after(seconds: float, window: float, *, floor_share: float, contention: float = 0.0) -> float:
    """The overlap rule: time `seconds` runs beside `window` of compute; what is exposed is what exceeds it,
    and at least `floor_share` of it (the piece ready only when the compute ends). `contention`: the share of
    the SMs a running collective takes from the matmuls (ClusterSpec.comm_sm_share), so the compute beside the
    hidden part slows by that share and the step grows by contention x the hidden seconds."""
    exposed = max(seconds - window, seconds * floor_share)
    return exposed + contention * (seconds - exposed)


def tier(cluster: ClusterSpec, size: int, stride: int, world: int) -> tuple[bool, Link]:
    """(in one node, its link) for an axis of `size` ranks `stride` apart."""
    inside = axis_in_node(size, stride, cluster.gpus_per_node, world)
    return inside, cluster.fast if inside else cluster.slow


def _on(traffic: Traffic, placed: tuple[bool, Link]) -> tuple[Traffic, bool, float]:
    return traffic, placed[0], sum(placed[1].terms(traffic)) if traffic.messages else 0.0


def breakdown(job: TrainingJob, layout: ParallelLayout) -> StepBreakdown:
    """The predicted step of `layout` (checked against the job first), term by term (module docstring)."""
    return with_data_parallel(job, layout, partial_breakdown(job, check_layout(job, layout)))


def with_data_parallel(job: TrainingJob, layout: ParallelLayout, partial: StepBreakdown) -> StepBreakdown:
    """`partial` (partial_breakdown of `layout` with any ZeRO stage) completed with `layout`'s dp term."""
    layers = stage_work(job, layout).layers
    at = strides({"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "edp": layout.dp // layout.ep,
                  "pp": layout.pp}, RANK_ORDER)
    micro = layout.microbatches(job)
    dp = _data_parallel(job, layout, at, layout.gpus, per_micro=partial.compute / micro,
                        recompute_per_micro=partial.recompute / micro,
                        layers=layers)
    main, experts = memory_configs(job, layout)
    weights = local_params(main)[layout.zero >= 1] + (local_params(experts)[layout.zero >= 1] if experts else 0)
    optimizer = OPTIMIZER_BYTES * weights / job.cluster.hbm_bytes_per_s
    return replace(partial, axes={**partial.axes, "dp": dp}, optimizer=optimizer)


def partial_breakdown(job: TrainingJob, layout: ParallelLayout) -> StepBreakdown:
    """Every term but dp (left at zero), which alone depends on the ZeRO stage: a lower bound on the step that
    rank.rank_layouts computes once for the four stages. The layout is assumed checked."""
    m, c, e = job.model, job.cluster, job.elem_bytes
    b, s, micro, v = layout.micro_batch, job.seq_len, layout.microbatches(job), layout.virtual
    rate = c.efficiency * c.peak_flops
    work = stage_work(job, layout)
    compute, layers = work.flops / rate, work.layers
    elementwise = work.hbm_bytes / c.hbm_bytes_per_s
    sizes = {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "edp": layout.dp // layout.ep, "pp": layout.pp}
    at = strides(sizes, RANK_ORDER)
    world = layout.gpus
    stages = _stage_layers(m, layout.pp, layout.padding)
    moe_layers = max(nm for _, nm in stages)
    axes: dict[str, AxisTime] = {}

    tp_bytes = megatron_layer_bytes(b, s // layout.cp, m.hidden, layout.tp, sequence_parallel=True, elem_size=e)
    redo = 1.5 if layout.recompute == "full" else 1.0      # the forward's 4 collectives again
    tp = Traffic(redo * tp_bytes * layers * micro, round(redo * 8 * (layout.tp - 1)) * layers * micro)
    t, inside, secs = _on(tp, tier(c, layout.tp, 1, world))
    axes["tp"] = AxisTime(traffic=t, in_node=inside, seconds=secs, exposed=secs)

    kv = 2 * (m.kv_heads // layout.tp) * m.head_dim
    ring = ring_kv_bytes_per_rank(s, layout.cp, kv, batch=b, elem_size=e) + \
        sum(ring_backward_bytes_per_rank(s, layout.cp, kv, batch=b, elem_size=e))
    per = Traffic(ring, 3 * (layout.cp - 1))
    inside, link = tier(c, layout.cp, at["cp"], world)
    ring_s = sum(link.terms(per)) if per.messages else 0.0
    passes = 3 + (FLASH_RECOMPUTE if job.flash_attention else 0.0)    # forward, backward twice, FlashAttention's QK^T
    attn_s = passes * attention_flops(s, m.head_dim, heads=m.heads // layout.tp, batch=b, causal=True) \
        / layout.cp / rate
    axes["cp"] = AxisTime(traffic=Traffic(ring * layers * micro, per.messages * layers * micro), in_node=inside,
                          seconds=ring_s * layers * micro,
                          exposed=hidden_after(ring_s, attn_s, floor_share=0.0, contention=c.comm_sm_share)
                          * layers * micro)

    ep = Traffic(0, 0)
    if layout.ep > 1:
        toks = b * s // (layout.cp * layout.tp)
        one = 4 * ecosts.uniform_dispatch_bytes(toks, m.top_k, layout.ep, m.hidden, e) + \
            ecosts.counts_exchange_bytes(m.experts, layout.ep)
        ep = Traffic(one * moe_layers * micro, 5 * (layout.ep - 1) * moe_layers * micro)
    t, inside, secs = _on(ep, tier(c, layout.ep, at["ep"], world))
    axes["ep"] = AxisTime(traffic=t, in_node=inside, seconds=secs, exposed=secs)

    sends = 2 * micro * v if layout.pp > 1 else 0
    pp = Traffic(sends * b * (s // layout.cp) * m.hidden * e // layout.tp, sends)
    t, inside, secs = _on(pp, tier(c, layout.pp, at["pp"], world))
    axes["pp"] = AxisTime(traffic=t, in_node=inside, seconds=secs, exposed=secs)

    axes["dp"] = AxisTime(traffic=Traffic(0, 0), in_node=True, seconds=0.0, exposed=0.0)
    busy = compute + elementwise + sum(axes[a].exposed for a in ("tp", "cp", "ep"))
    bubble = bubble_ratio(work, micro, v) * busy
    return StepBreakdown(compute=compute, recompute=work.recomputed / rate, elementwise=elementwise, optimizer=0.0,
                         bubble=bubble, axes=axes,
                         model_flops=job.batch_tokens * model_flops_per_token(m, s), gpus=world,
                         peak_flops=c.peak_flops)


def _data_parallel(job: TrainingJob, layout: ParallelLayout, at: dict[str, int], world: int, *, per_micro: float,
                   layers: int, recompute_per_micro: float = 0.0) -> AxisTime:
    """The dp term: the non-routed weights over dp x cp ranks, the routed experts over dp / ep (module docstring).

    Phases are pooled by the compute they hide behind: the gradient's (and ZeRO-3's backward gathers) behind
    backward, the parameter gathers behind forward. Sharded gradients (ZeRO-2, 3) are reduce-scattered every
    microbatch, and ZeRO-3 gathers the weights every microbatch, each behind its own microbatch: windows of M.
    Of those, only the step's last one leaves its last bucket exposed (the floor): every other microbatch's
    runs beside the next microbatch's compute. ZeRO-3 runs each collective layer by layer (a
    ring of N - 1 steps per layer: layers x (N - 1) latencies), and with full recompute the recomputed forward
    gathers the layer's weights a third time (freed after the forward), behind backward.
    """
    c, e, z = job.cluster, job.elem_bytes, layout.zero
    dense, experts = _pieces(job.model, layout)
    micro = layout.microbatches(job)
    forward = (per_micro - recompute_per_micro) / 3         # the recomputed forward runs inside backward
    windows = {"backward": (micro if z >= 2 else 1) * (per_micro - forward),
               "forward": (micro if z == 3 else 1) * forward}
    pooled = {"backward": 0.0, "forward": 0.0}
    total_bytes, messages, inside_all = 0, 0, True
    groups = [(max(dense), layout.dp * layout.cp, layout.tp)]        # dp x cp ranks lie tp apart
    if job.model.experts:
        groups.append((max(experts), layout.dp // layout.ep, at["edp"]))
    for numel, n, stride in groups:
        if n == 1 or numel == 0:
            continue
        inside, link = tier(c, n, stride, world)
        inside_all &= inside
        phases = zero_step_bytes(numel, n, 0, z, elem_size=e)
        rounds = zero_step_rounds(n, z) // len(phases)           # N - 1 per collective
        if z == 3:
            rounds *= max(layers, 1)         # gathered and reduced layer by layer: each layer's own ring
            if layout.recompute == "full":   # the recomputed forward gathers the freed weights again
                phases = {**phases, "recompute all-gather": phases["backward all-gather"]}
        for name, nbytes in phases.items():
            times = micro if (z == 3 and "all-gather" in name) or (z >= 2 and name == "gradient reduce-scatter") else 1
            when = "forward" if name in ("forward all-gather", "parameter all-gather") else "backward"
            pooled[when] += times * sum(link.terms(Traffic(nbytes, rounds)))
            total_bytes += times * nbytes
            messages += times * rounds
    reps = {"backward": micro if z >= 2 else 1, "forward": micro if z == 3 else 1}   # collectives per window
    exposed = sum(hidden_after(pooled[w], windows[w], floor_share=1 / (max(layers, 1) * reps[w]),
                               contention=c.comm_sm_share) for w in pooled)
    return AxisTime(traffic=Traffic(total_bytes, messages), in_node=inside_all, seconds=sum(pooled.values()),
                    exposed=exposed)
