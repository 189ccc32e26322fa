"""The small end of the planner: chapter 09's mesh step on this machine, predicted from what it measures.

The same terms as a cluster's step (planner.breakdown's StepBreakdown, its overlap rule, the pipeline bubble),
with this CPU as the "cluster". What each rank does per step is counted exactly: its sends and bytes per axis
(costs.mesh.axis_traffic, matched by chapter 09's ledger), its FLOPs (`stage_flops`) and its operators (aten
ops, counted once by mesh/calibrate.py over one step of each stage). What each costs is measured apart from
the step, as chapter 01 fits alpha and beta:

* an operator: `op_s` fixed (Python, dispatch, autograd) plus its FLOPs at `flops_per_s`;
* a message: `message_s` of CPU (every thread of the rank's process: the ring's Python, gloo's loop thread, the
  sleep and wake-up and the cold caches after it), plus `beta_s_per_byte` per byte (a copy through loopback);
* on a rank's own core, a message also waits: `alpha_s` per message (chapter 01's fit, latency included).

Two bounds; the step is the larger (`mesh_step_prediction`):

* own cores (`own_cores_step`), the cluster's rule: the rank at `coords` runs on a core of its own. tp and pp
  sends each wait for the one before (exposed); cp's ring hides under its attention; dp syncs after the whole
  schedule (hidden_after with no window); the bubble is bubble_over_ideal(pp, M) of the busy time. Binding
  when cores >= ranks.
* shared cores (`shared_cores_step`): when ranks outnumber cores, all ranks' CPU work queues for the cores, so
  the step is at least the sum over every rank of its CPU seconds / cores, each term its own sum. Nothing
  hides: a message's CPU is CPU. No bubble: while a stage waits, the other stages' ranks use its cores, and
  one stage alone has ranks / pp >= cores ranks to keep them busy (assumed, and true of chapter 09's mesh:
  8 ranks, 2 stages, 2 cores). Where that fails the bound is optimistic.

Assumptions, and what is left out:
* an operator costs op_s whatever it is, plus its FLOPs at the rate: views and elementwise ops pay op_s like
  matmuls (so `elementwise` is 0: it is inside the count), and an operator of the mesh's stage costs what one
  of the calibration's plain blocks does (the stage's tp layers are autograd Functions written in Python:
  alone in one process, measured about 5 us per operator against a plain block's 4);
* a message costs message_s whatever its axis: a pp message (a send and, on the same rank, a receive) what a
  ring round does (a send and a receive), dp's gradient buckets what tp's activations do beyond beta's bytes;
* an optimizer step is its counted operators;
* the cores are all ours: another program's load lengthens the step and not the prediction;
* left out: the moments fewer ranks than cores can run (wake-ups; 1.8-1.9 of 2 cores busy, measured), the
  gradient buckets' flatten and copy back (2 ops per parameter tensor), the schedule's own Python.
The notebook runs the step and shows this beside it; a timing is never a checked output.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Sequence

import numpy as np

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.mesh import TRAFFIC_AXES, StepShape, Traffic, axis_traffic, microbatch_rows, stage_layers
from wmdist.costs.pipeline import bubble_over_ideal
from wmdist.costs.ring_attention import attention_flops
from wmdist.costs.validate import require_int, require_positive, require_real
from wmdist.planner.breakdown import AxisTime, StepBreakdown, hidden_after

AXES = ("tp", "cp", "ep", "pp", "dp")                    # StepBreakdown.axes' order


@dataclass(frozen=True, kw_only=True)
class LocalCosts:
    """What an operator and a message cost this machine's ranks (measured), and how many cores they share."""
    op_s: float                  # CPU seconds per operator, its fixed part (fit_local_costs)
    flops_per_s: float           # the rate of its FLOPs (fit_local_costs)
    message_s: float             # CPU seconds per message sent, with its receive (fit_local_costs)
    alpha_s: float               # seconds per message on a rank's own core (chapter 01's fit)
    beta_s_per_byte: float       # seconds per byte (chapter 01's fit; 0 when its timings did not resolve it)
    cores: int

    def __post_init__(self) -> None:
        for name in ("op_s", "flops_per_s", "message_s", "alpha_s"):
            require_positive(name, getattr(self, name))
        require_real("beta_s_per_byte", self.beta_s_per_byte)
        require_int("cores", self.cores, 1)


@dataclass(frozen=True)
class CalibrationPoint:
    """One calibration case (mesh/calibrate.py): its operators, FLOPs and messages, and the CPU seconds it took."""
    ops: int
    flops: float
    messages: int
    cpu_s: float


def fit_local_costs(points: Sequence[CalibrationPoint]) -> tuple[float, float, float]:
    """(op_s, flops_per_s, message_s) from calibration points: cpu = ops op_s + flops / rate + messages message_s,
    by least squares in relative error (chapter 01 fits alpha and beta the same way). All three must come out
    > 0: a cost the points put at 0 or below is not resolved by them, and is refused, not clipped."""
    if len(points) < 3:
        raise ValueError(f"points must hold at least 3 calibration cases (three unknowns), got {len(points)}")
    for p in points:
        require_int("points' ops", p.ops, 0)
        require_int("points' messages", p.messages, 0)
        require_real("points' flops", p.flops)
        require_positive("points' cpu_s", p.cpu_s)
    cpu = np.array([p.cpu_s for p in points])
    design = np.array([[p.ops, p.flops, p.messages] for p in points], dtype=float) / cpu[:, None]
    coef = np.linalg.lstsq(design, np.ones(len(points)), rcond=None)[0]
    if np.any(coef <= 0):
        raise ValueError(f"points do not resolve all three costs (fitted {coef.tolist()}): vary the operators, "
                         "FLOPs and messages across the cases, or time more repeats")
    return float(coef[0]), float(1 / coef[1]), float(coef[2])


def stage_flops(shape: StepShape, coords: dict[str, int]) -> tuple[float, float]:
    """(FLOPs of the whole step, of which attention) on the rank at `coords`: forward and backward.

    The blocks' matmuls (2 FLOPs per weight per token forward: QKV, output, the two MLP layers), causal
    attention (costs.ring_attention.attention_flops), the embedding on the first stage and the head on the
    last, backward twice the forward."""
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


def _per_stage(name: str, counts: Sequence[int], shape: StepShape) -> list[int]:
    if len(counts) != shape.pp:
        raise ValueError(f"{name} must give one count per pipeline stage ({shape.pp}), got {len(counts)}")
    return [require_int(f"{name} entry", n, 0) for n in counts]


def rank_cpu(shape: StepShape, costs: LocalCosts, coords: dict[str, int], *, stage_ops: Sequence[int],
             optimizer_ops: Sequence[int]) -> dict[str, float]:
    """CPU seconds of one step of the rank at `coords`, by term: compute, optimizer and each of TRAFFIC_AXES.

    `stage_ops[p]`: operators of one step's forwards and backwards on stage p (all its microbatches);
    `optimizer_ops[p]`: those of one optimizer step there (both from mesh/calibrate.py)."""
    ops, opt = _per_stage("stage_ops", stage_ops, shape), _per_stage("optimizer_ops", optimizer_ops, shape)
    traffic = axis_traffic(shape, coords)
    out = {"compute": ops[coords["pp"]] * costs.op_s + stage_flops(shape, coords)[0] / costs.flops_per_s,
           "optimizer": opt[coords["pp"]] * costs.op_s}
    for axis in TRAFFIC_AXES:
        out[axis] = traffic[axis].messages * costs.message_s + traffic[axis].bytes_sent * costs.beta_s_per_byte
    return out


def _every_rank(shape: StepShape) -> list[dict[str, int]]:
    return [dict(zip(("dp", "tp", "pp", "cp"), c))
            for c in product(range(shape.dp), range(shape.tp), range(shape.pp), range(shape.cp))]


def _breakdown(shape: StepShape, costs: LocalCosts, terms: dict[str, float],
               axes: dict[str, AxisTime]) -> StepBreakdown:
    model = sum(stage_flops(shape, c)[0] for c in _every_rank(shape))
    axes["ep"] = AxisTime(traffic=Traffic(0, 0), in_node=True, seconds=0.0, exposed=0.0)
    return StepBreakdown(compute=terms["compute"], recompute=0.0, elementwise=0.0, optimizer=terms["optimizer"],
                         bubble=terms["bubble"], axes={a: axes[a] for a in AXES}, model_flops=model,
                         gpus=shape.world_size, peak_flops=costs.flops_per_s)


def shared_cores_step(shape: StepShape, costs: LocalCosts, *, stage_ops: Sequence[int],
                      optimizer_ops: Sequence[int]) -> StepBreakdown:
    """Every rank's CPU seconds (rank_cpu), each term summed over the ranks and divided by the cores; no bubble.
    An axis's `traffic` is the first rank's, for reference; its seconds are the whole machine's."""
    work = [rank_cpu(shape, costs, c, stage_ops=stage_ops, optimizer_ops=optimizer_ops) for c in _every_rank(shape)]
    share = {term: sum(w[term] for w in work) / costs.cores for term in work[0]}
    first = axis_traffic(shape, {"dp": 0, "tp": 0, "pp": 0, "cp": 0})
    axes = {a: AxisTime(traffic=first[a], in_node=True, seconds=share[a], exposed=share[a]) for a in TRAFFIC_AXES}
    return _breakdown(shape, costs, {**share, "bubble": 0.0}, axes)


def own_cores_step(shape: StepShape, costs: LocalCosts, *, stage_ops: Sequence[int], optimizer_ops: Sequence[int],
                   coords: dict[str, int] | None = None) -> StepBreakdown:
    """The step of the rank at `coords` (default: the first) on a core of its own: the cluster's rule, with
    messages at alpha and beta (module docstring)."""
    where = coords or {"dp": 0, "tp": 0, "pp": 0, "cp": 0}
    cpu = rank_cpu(shape, costs, where, stage_ops=stage_ops, optimizer_ops=optimizer_ops)
    traffic = axis_traffic(shape, where)
    _, attention = stage_flops(shape, where)
    axes = {}
    for axis in TRAFFIC_AXES:
        seconds = traffic[axis].messages * costs.alpha_s + traffic[axis].bytes_sent * costs.beta_s_per_byte
        window = attention / costs.flops_per_s if axis == "cp" else 0.0
        exposed = hidden_after(seconds, window, floor_share=0.0) if axis in ("cp", "dp") else seconds
        axes[axis] = AxisTime(traffic=traffic[axis], in_node=True, seconds=seconds, exposed=exposed)
    busy = cpu["compute"] + axes["tp"].exposed + axes["cp"].exposed
    terms = {"compute": cpu["compute"], "optimizer": cpu["optimizer"],
             "bubble": bubble_over_ideal(shape.pp, shape.microbatches) * busy}
    return _breakdown(shape, costs, terms, axes)


def mesh_step_prediction(shape: StepShape, costs: LocalCosts, *, stage_ops: Sequence[int],
                         optimizer_ops: Sequence[int], coords: dict[str, int] | None = None) -> StepBreakdown:
    """The predicted step of chapter 09's mesh on this machine: the larger of own_cores_step (the rank at
    `coords`) and shared_cores_step, each a bound the step cannot beat (module docstring)."""
    own = own_cores_step(shape, costs, stage_ops=stage_ops, optimizer_ops=optimizer_ops, coords=coords)
    shared = shared_cores_step(shape, costs, stage_ops=stage_ops, optimizer_ops=optimizer_ops)
    return max(own, shared, key=lambda step: step.total)
