"""The planner's small end: chapter 09's mesh step on this machine's CPU ranks, predicted from chapter 01's numbers.

The same terms as the cluster breakdown (breakdown.py), at the sizes of costs.mesh's StepShape, on one link
tier (every rank is on this machine), from three measured numbers: α (seconds per message) and β (seconds
per byte) of chapter 01's all-reduce fit, with its contention g for more ranks than cores, and one rank's
matmul FLOP/s (ring_attention.measure.measure_matmul_flops, as chapter 06 measures it). Per rank:

* compute: 6 x the rank's parameters (costs.mesh.rank_params) x the tokens of its dp share, plus attention
  (costs.ring_attention.attention_flops, forward and twice for backward), at the FLOP/s; ranks beyond the
  cores share them, so the compute is stretched by ranks / cores;
* each axis (costs.mesh.axis_traffic's bytes and messages): α messages + β bytes, times the contention
  factor 1 + g max(0, N / cores - 1) of the fit. On CPU ranks nothing overlaps: gloo's collectives block;
* bubble: (P - 1) / M of the stage's busy time (compute, tp and cp), costs.pipeline.bubble_over_ideal.

The step is the slowest rank's sum. What it leaves out, here more than on a cluster: Python's and torch's
per-operation overhead (at width 32 an operation's fixed cost exceeds its arithmetic), the optimizer, and
the processes' scheduling on shared cores.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs.mesh import TRAFFIC_AXES, StepShape, axis_traffic, rank_params, stage_layers
from wmdist.costs.pipeline import bubble_over_ideal
from wmdist.costs.ring_attention import attention_flops
from wmdist.costs.validate import require_int, require_positive, require_real

LOCAL_TERMS = ("compute", "bubble", *TRAFFIC_AXES)


@dataclass(frozen=True, kw_only=True)
class LocalMachine:
    """What chapters 01 and 06 measure here: α (s per message), β (s per byte), the fit's contention g on
    `cores` cores, and one rank's matmul FLOP/s."""
    alpha: float
    beta: float
    flops_per_s: float
    cores: int
    contention: float = 0.0

    def __post_init__(self) -> None:
        require_real("alpha", self.alpha)
        require_real("beta", self.beta)
        require_positive("flops_per_s", self.flops_per_s)
        require_int("cores", self.cores, 1)
        require_real("contention", self.contention)

    def slowdown(self, ranks: int) -> float:
        """Chapter 01's contention factor for `ranks` processes on the cores: 1 + g max(0, N / cores - 1)."""
        return 1.0 + self.contention * max(0.0, ranks / self.cores - 1.0)


@dataclass(frozen=True, kw_only=True)
class LocalStep:
    """The predicted step of the slowest rank: its terms (LOCAL_TERMS, seconds) and which rank it is."""
    terms: dict[str, float]
    rank: int

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def rank_flops(shape: StepShape, coords: dict[str, int]) -> float:
    """Training FLOPs of the rank at `coords` for one step: 6 per parameter and token of its dp share, plus its
    stage's attention (QK^T and AV, causal, its heads, its context share) forward once and backward twice."""
    tokens = shape.batch * shape.seq_len / shape.dp / shape.cp
    dense = 6 * rank_params(shape, coords["tp"], coords["pp"]) * tokens
    heads = shape.heads // shape.tp
    attn = attention_flops(shape.seq_len, shape.head_dim, heads=heads, batch=shape.batch // shape.dp, causal=True)
    return dense + 3 * stage_layers(shape, coords["pp"]) * attn / shape.cp


def local_step(shape: StepShape, all_coords: list[dict[str, int]], machine: LocalMachine) -> LocalStep:
    """The predicted step: every rank's terms (module docstring), the slowest rank's returned."""
    ranks = len(all_coords)
    if ranks != shape.dp * shape.tp * shape.pp * shape.cp:
        raise ValueError(f"all_coords must list the mesh's {shape.dp * shape.tp * shape.pp * shape.cp} ranks, "
                         f"got {ranks}")
    share = max(1.0, ranks / machine.cores)
    slow = machine.slowdown(ranks)
    best: LocalStep | None = None
    for rank, coords in enumerate(all_coords):
        traffic = axis_traffic(shape, coords)
        terms = {"compute": share * rank_flops(shape, coords) / machine.flops_per_s}
        comm = {a: slow * (machine.alpha * t.messages + machine.beta * t.bytes_sent) for a, t in traffic.items()}
        busy = terms["compute"] + comm["tp"] + comm["cp"]
        terms["bubble"] = bubble_over_ideal(shape.pp, shape.microbatches) * busy
        terms.update(comm)
        step = LocalStep(terms={t: terms[t] for t in LOCAL_TERMS}, rank=rank)
        if best is None or step.total > best.total:
            best = step
    assert best is not None
    return best
