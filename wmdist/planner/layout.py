"""A layout (dp x tp x pp x cp x ep, ZeRO stage, micro-batch, virtual stages, recompute) and every one a job allows.

A layout is checked against a job in one place (`check_layout`), with the rule that failed named, so the
CLI's `--layout` and the enumeration refuse the same things:

* dp * tp * pp * cp = the GPU count (ep is carved out of dp: expert-parallel groups are subsets of the
  data-parallel ranks, as in Megatron-Core and DeepSeek-V3, so ep | dp and ep | experts);
* tp divides the heads, the key-value heads and the dense FFN width (each rank a whole share; routed experts
  are not tensor-split: expert parallelism spreads them instead);
* pp * v <= layers (stages need not hold equal numbers of layers: the slowest one sets the pace); padding
  (slots for the embedding and head, first and last stages one block fewer each per two) needs pp > 1;
* v > 1 only with pp > 1, and then M a multiple of pp (Megatron's interleaved schedule);
* cp divides the sequence length; dp b <= the sequences of a step, and M = sequences / (dp b) microbatches
  (rounded up) go through the pipeline per step. The enumeration keeps to dp b dividing the sequences.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Literal, get_args

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.validate import require_choice, require_fields, require_int
from wmdist.planner.model import TrainingJob

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
AXES = ("dp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """How one step is spread: the five degrees, ZeRO stage (over dp), sequences per microbatch, virtual stages
    per pipeline rank, and what the backward recomputes."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    micro_batch: int = 1
    virtual: int = 1
    recompute: Recompute = "none"
    padding: int = 0        # layer slots the embedding and head take: the first and last stages hold fewer blocks

    def __post_init__(self) -> None:
        require_fields(self, (*AXES, "micro_batch", "virtual"), 1)
        require_int("padding", self.padding, 0)
        require_choice("zero", self.zero, (0, 1, 2, 3))
        require_choice("recompute", self.recompute, RECOMPUTE)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def microbatches(self, job: TrainingJob) -> int:
        """M: microbatches per data-parallel rank and step, ceil(ceil(sequences / dp) / b): where dp does not
        divide the sequences, the ranks with one more set the pace (and a last microbatch may be short)."""
        per_rank = (job.sequences + self.dp - 1) // self.dp
        return (per_rank + self.micro_batch - 1) // self.micro_batch

    def describe(self) -> str:
        """'dp=64,tp=8,pp=16,cp=1,ep=1,zero=1,micro_batch=1,virtual=4,recompute=none': what --layout reads."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if f.name != "padding" or self.padding)


def parse_layout(text: str) -> ParallelLayout:
    """'dp=64,tp=8,pp=16' -> ParallelLayout (fields left out keep their defaults); ValueError naming a bad part."""
    values: dict[str, int | str] = {}
    names = [f.name for f in fields(ParallelLayout)]
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(f"layout part {part!r} must be name=value with a name in {', '.join(names)}")
        if key in values:
            raise ValueError(f"layout names {key} twice")
        if key == "recompute":
            values[key] = value.strip()
        else:
            try:
                values[key] = int(value)
            except ValueError:
                raise ValueError(f"layout {key} must be an integer, got {value.strip()!r}") from None
    return ParallelLayout(**values)  # type: ignore[arg-type]


def check_layout(job: TrainingJob, layout: ParallelLayout) -> ParallelLayout:
    """`layout` if the job can run it; else a ValueError naming the rule it breaks and what is allowed."""
    m, n = job.model, job.gpus
    if layout.gpus != n:
        raise ValueError(f"dp*tp*pp*cp = {layout.dp}*{layout.tp}*{layout.pp}*{layout.cp} = {layout.gpus} must equal "
                         f"the GPU count {n}")
    for what, size in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn", m.ffn)):
        if size % layout.tp:
            raise ValueError(f"tp={layout.tp} must divide {what}={size} (allowed tp: {_divisors(size)})")
    if layout.pp * layout.virtual > m.layers:
        raise ValueError(f"pp*virtual = {layout.pp * layout.virtual} is more than the {m.layers} layers")
    sizes = ring_chunk_sizes(m.layers + layout.padding, layout.pp)
    if layout.padding and (layout.pp == 1 or min(sizes[0] - (layout.padding + 1) // 2,
                                                  sizes[-1] - layout.padding // 2) < 1):
        raise ValueError(f"padding={layout.padding} needs pp > 1 and a block left on the first and last stages "
                         f"of {m.layers} layers over pp={layout.pp}")
    if job.seq_len % layout.cp:
        raise ValueError(f"cp={layout.cp} must divide seq_len={job.seq_len}")
    if layout.ep > 1 and not m.experts:
        raise ValueError(f"ep={layout.ep} needs an MoE model; {m.name} has no experts (ep must be 1)")
    if m.experts and (m.experts % layout.ep or layout.dp % layout.ep):
        raise ValueError(f"ep={layout.ep} must divide experts={m.experts} and dp={layout.dp}")
    if layout.dp * layout.micro_batch > job.sequences:
        raise ValueError(f"dp*micro_batch = {layout.dp * layout.micro_batch} is more than the {job.sequences} "
                         f"sequences of a step (every microbatch needs one)")
    micro = layout.microbatches(job)
    if layout.virtual > 1 and (layout.pp == 1 or micro % layout.pp):
        raise ValueError(f"virtual={layout.virtual} needs pp > 1 and the {micro} microbatches a multiple of "
                         f"pp={layout.pp} (the interleaved schedule)")
    return layout


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(job: TrainingJob, *, max_tp: int | None = None, max_virtual: int = 8,
                      max_micro_batch: int = 8, zero_stages: tuple[int, ...] = (0, 1, 2, 3),
                      recompute: tuple[str, ...] = RECOMPUTE) -> Iterator[ParallelLayout]:
    """Every layout `check_layout` accepts, within the bounds: tp <= max_tp (default: a node, since a tensor-parallel
    group that leaves the node puts its exposed all-reduces on the slow link), v <= max_virtual, b <= max_micro_batch.
    Memory is not judged here (see rank.plans)."""
    m, n = job.model, job.gpus
    top_tp = require_int("max_tp", max_tp if max_tp is not None else job.cluster.gpus_per_node, 1)
    require_int("max_virtual", max_virtual, 1)
    require_int("max_micro_batch", max_micro_batch, 1)
    for z in zero_stages:
        require_choice("zero_stages", z, (0, 1, 2, 3))
    for r in recompute:
        require_choice("recompute", r, RECOMPUTE)
    for tp in (t for t in _divisors(n) if t <= top_tp and not (m.heads % t or m.kv_heads % t or m.ffn % t)):
        for pp in (p for p in _divisors(n // tp) if p <= m.layers):
            for cp in (c for c in _divisors(n // (tp * pp)) if job.seq_len % c == 0):
                dp = n // (tp * pp * cp)
                if job.sequences % dp:
                    continue
                eps = [e for e in _divisors(dp) if m.experts % e == 0] if m.experts else [1]
                for b in (b for b in _divisors(job.sequences // dp) if b <= max_micro_batch):
                    micro = job.sequences // (dp * b)
                    vs = [v for v in range(1, max_virtual + 1) if pp * v <= m.layers
                          and (v == 1 or (pp > 1 and micro % pp == 0))]
                    for ep in eps:
                        for v in vs:
                            for z in zero_stages:
                                for r in recompute:
                                    yield ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=z, micro_batch=b,
                                                 virtual=v, recompute=r)  # type: ignore[arg-type]
