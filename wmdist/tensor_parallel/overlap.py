"""Tensor parallelism's overlap, run: the MLP's all-reduce waited on at once, or hidden behind the next matmuls.

The Megatron MLP on N ranks (fc1 split by columns, GELU, fc2 split by rows) ends in an all-reduce of
each rank's partial output. Cut the tokens into M microbatches and there are two schedules for the
same work:

    blocking     for each microbatch: its matmuls, then its all-reduce, waited on before going on;
    overlapped   launch microbatch m's all-reduce with async_op=True, run microbatch m+1's matmuls
                 (they do not read m's sum), then wait for m; the last one is waited on at the end.

Both hand the very same tensors to the same gloo all-reduce, so the outputs must be bitwise equal,
and the payload per rank is M all-reduces of (T/M) H float32 entries in both: the schedule moves no
byte. Both are checked against the MLP on one process (within the first-order allowance of
tensor_parallel.compare: the row layer's sum over F hidden units regrouped by rank). Whether the
overlapped schedule is *faster* is another matter: it depends on who carries the all-reduce while
the matmul runs. Here gloo's threads and the matmuls share this machine's cores, so the times are
reported (medians of alternating repetitions, and compute alone) and never checked.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wmdist.comm import Context, all_reduce, barrier
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, RankSpec, Verdict
from wmdist.course.report import Count, close_check, counts_per_rank, exact_check
from wmdist.tensor_parallel.compare import WHY, reordered_tolerance

SCHEDULES = ("blocking", "overlapped")


@dataclass(frozen=True, kw_only=True)
class TPOverlapSpec(RankSpec):
    """The MLP (width H, hidden F) on `tokens` tokens in M microbatches, over `world_size` tensor-parallel ranks."""
    tokens: int = 512
    width: int = 128
    hidden: int = 2048
    microbatches: int = 4
    repeats: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("width", self.width, 1)
        require_int("repeats", self.repeats, 1, high=50)
        if require_int("hidden", self.hidden, 1) < self.world_size:
            raise ValueError(f"hidden={self.hidden} must be at least world_size={self.world_size} (a unit per rank)")
        if require_int("tokens", self.tokens, 1) % require_int("microbatches", self.microbatches, 1):
            raise ValueError(f"tokens={self.tokens} must divide into microbatches={self.microbatches} equal parts")

    def payload_bytes(self) -> int:
        """What each rank hands to the all-reduces in one pass, either schedule: M x (T/M) H float32."""
        return self.tokens * self.width * 4


def overlap_inputs(spec: TPOverlapSpec) -> dict[str, torch.Tensor]:
    """The input tokens and the full MLP's weights, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(spec.seed)
    h, f = spec.width, spec.hidden
    return {"x": torch.randn(spec.tokens, h, generator=g), "w1": torch.randn(f, h, generator=g) / h ** 0.5,
            "b1": torch.randn(f, generator=g) * 0.1, "w2": torch.randn(h, f, generator=g) / f ** 0.5,
            "b2": torch.randn(h, generator=g) * 0.1}


def overlap_reference(spec: TPOverlapSpec) -> torch.Tensor:
    """The whole MLP on one process: fc2(gelu(fc1(x)))."""
    t = overlap_inputs(spec)
    return F.linear(F.gelu(F.linear(t["x"], t["w1"], t["b1"])), t["w2"], t["b2"])


@dataclass(frozen=True, kw_only=True)
class TPOverlapRank:
    """One rank: each schedule's output, its ledger (payload, all-reduces) and its timed repetitions."""
    outputs: dict[str, torch.Tensor]
    payload: dict[str, int]
    all_reduces: dict[str, int]
    seconds: dict[str, list[float]]        # "blocking", "overlapped", "compute alone"


def _shard(spec: TPOverlapSpec, rank: int) -> tuple[torch.Tensor, ...]:
    """This rank's fc1 rows (its hidden units, torch.tensor_split's layout) and the fc2 columns that read them."""
    t = overlap_inputs(spec)
    units = torch.tensor_split(torch.arange(spec.hidden), spec.world_size)[rank]
    return t["x"], t["w1"][units], t["b1"][units], t["w2"][:, units], t["b2"]


def tp_overlap_rank(ctx: Context, spec: TPOverlapSpec) -> TPOverlapRank:
    """Rank function: both schedules once counted, then timed alternately `repeats` times each."""
    torch.set_num_threads(1)
    x, w1, b1, w2, b2 = _shard(spec, ctx.rank)
    micro = torch.tensor_split(x, spec.microbatches)

    def partial(xm: torch.Tensor) -> torch.Tensor:           # this rank's share of fc2's output, before the sum
        return F.linear(F.gelu(F.linear(xm, w1, b1)), w2)

    def blocking() -> torch.Tensor:
        return torch.cat([all_reduce(ctx, partial(xm), phase="blocking") + b2 for xm in micro])

    def overlapped() -> torch.Tensor:
        outs, pending = [], None
        for xm in micro:
            y = partial(xm)                                  # runs while the previous all-reduce is in flight
            if pending is not None:
                outs.append(pending.wait() + b2)
            pending = all_reduce(ctx, y, phase="overlapped", async_op=True)
        outs.append(pending.wait() + b2)
        return torch.cat(outs)

    def compute_alone() -> torch.Tensor:
        return torch.cat([partial(xm) for xm in micro])

    runs = {"blocking": blocking, "overlapped": overlapped}
    ctx.ledger.reset()
    outputs = {name: fn() for name, fn in runs.items()}
    by_phase = ctx.ledger.by_phase(kind=None)
    payload = {name: by_phase.get(name, {}).get("bytes_sent", 0) for name in SCHEDULES}
    counted = {name: by_phase.get(name, {}).get("rounds", 0) for name in SCHEDULES}
    seconds: dict[str, list[float]] = {name: [] for name in (*SCHEDULES, "compute alone")}
    for _ in range(spec.repeats):                            # alternate, so a load change hits both alike
        for name, fn in (*runs.items(), ("compute alone", compute_alone)):
            barrier(ctx, phase="timing")
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return TPOverlapRank(outputs=outputs, payload=payload, all_reduces=counted, seconds=seconds)


@dataclass(frozen=True, kw_only=True)
class TPOverlapTimes:
    """Reported, never checked: each schedule's median seconds per rank, and compute alone."""
    median: dict[str, list[float]]

    def ratio(self, *, rank: int = 0) -> float:
        """Overlapped over blocking on `rank` (below 1: the overlap paid)."""
        return self.median["overlapped"][rank] / self.median["blocking"][rank]


def compare_tp_overlap(spec: TPOverlapSpec, results: list[TPOverlapRank]) -> Verdict:
    """Outputs against each other (bitwise) and one process; payload and all-reduce counts against the formula."""
    ref = overlap_reference(spec)
    tol = reordered_tolerance(ref, spec.hidden)
    checks = [exact_check(f"overlapped == blocking on rank {r}", res.outputs["overlapped"], res.outputs["blocking"],
                          "the same tensors through the same all-reduce, only launched earlier: bitwise equal")
              for r, res in enumerate(results)]
    checks += [close_check(f"blocking == one process on rank {r}", res.outputs["blocking"], ref, tol,
                           f"{WHY}; K = F = {spec.hidden}") for r, res in enumerate(results)]
    n = spec.world_size
    exact: list[Count] = []
    for name in SCHEDULES:
        exact += counts_per_rank("payload bytes", [r.payload[name] for r in results], [spec.payload_bytes()] * n,
                                 case=name)
        exact += counts_per_rank("all-reduces", [r.all_reduces[name] for r in results], [spec.microbatches] * n,
                                 case=name)
    times = TPOverlapTimes(median={name: [statistics.median(r.seconds[name]) for r in results]
                                 for name in results[0].seconds})
    params = {"tokens": spec.tokens, "width": spec.width, "hidden": spec.hidden, "microbatches": spec.microbatches}
    return Verdict(checks=checks, exact=exact, params=params, data=times)


def tp_overlap_spec(world_size: int) -> TPOverlapSpec:
    return TPOverlapSpec(world_size=world_size)


TP_OVERLAP = Experiment(name="tp-overlap", chapter="04", world_sizes=(2, 4), spec=tp_overlap_spec,
                        ranks=tp_overlap_rank, compare=compare_tp_overlap,
                        title="TP MLP: all-reduce overlapped with the next microbatch's matmuls vs blocking; "
                              "same bytes, same output")
