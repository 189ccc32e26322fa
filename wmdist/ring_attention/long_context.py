"""A context whose S x S scores do not fit one process's budget runs on N ranks, each holding about 1/N of it.

The budget is a stated number of bytes of working memory for attention in
one process. The long S is chosen so that the full score matrix alone
exceeds it; unblocked attention there is out of the question. The ring runs
it anyway: every rank measures the bytes it holds during its forward (its
rows of q, k, v, which it had before, plus the allocator's peak during the
call, from profiling.measure_allocations). That peak is its S/N tokens'
tensors (q, k, v, two K, V blocks in flight, output, lse) plus a few score
tiles whose size depends on the block size only. At a shorter S that does
fit, the same ring is compared with single-process full attention (SDPA's
MATH backend, which materializes the scores): the measured per-rank / single
ratio is reported.
Shapes: q, k, v (B, H, S, D); a rank holds (B, H, S/N, D).
The demo is an `Experiment` on `LongRun` (both lengths and the budget, refused
before any process starts); every rank measures the long S, then the short.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wmdist.comm import Context
from wmdist.costs import ring_attention as costs
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report
from wmdist.ring_attention.profiling import measure_allocations
from wmdist.ring_attention.ring import positions, ring_forward
from wmdist.ring_attention.spec import RingSpec

MIB = 2 ** 20
BUDGET = 32 * MIB                     # working memory one process may use for attention (stated, not measured)
SHAPE = {"batch": 1, "heads": 4, "head_dim": 32, "block_size": 128}


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds during its ring forward at one S, measured, and the parts the model names."""
    inputs: int          # its rows of q, k, v, held before the call
    peak: int            # allocator peak during the call (measured)
    kv_blocks: int       # model: the two packed K, V blocks it keeps (one in use, one arriving)
    rows: int            # model: output and lse of its S/N query rows

    @property
    def held(self) -> int:
        return self.inputs + self.peak

    @property
    def scores(self) -> int:
        """What the peak holds beyond the S/N-token tensors: the block-bounded score temporaries."""
        return self.peak - self.kv_blocks - self.rows


def ring_memory(ctx: Context, spec: RingSpec) -> RankMemory:
    """Rank function: this rank's causal ring forward under allocation tracking."""
    q, k, v, _ = spec.inputs(dtype="float32")
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout="contiguous")
    q, k, v = (x[:, :, rows].contiguous() for x in (q, k, v))
    (out, lse, _), alloc = measure_allocations(
        lambda: ring_forward(ctx, q, k, v, seq_len=spec.seq_len, layout="contiguous", causal=True,
                             block_size=spec.block_size))
    elem = q.element_size()
    return RankMemory(3 * q.numel() * elem, alloc.peak, 2 * (k.numel() + v.numel()) * elem,
                      (out.numel() + lse.numel()) * elem)


def single_memory(spec: RingSpec) -> int:
    """Bytes one process holds for full attention: q, k, v plus the MATH backend's peak (it materializes S x S)."""
    q, k, v, _ = spec.inputs(dtype="float32")
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        _, alloc = measure_allocations(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return 3 * q.numel() * q.element_size() + alloc.peak


@dataclass(kw_only=True, frozen=True)
class LongContextData:
    """Per S: each rank's memory; at the S that fits, single-process full attention's too."""
    budget: int
    long_seq: int
    fit_seq: int
    ranks: dict[int, list[RankMemory]]
    single_fit: int
    full_scores: dict[int, int]      # bytes of the S x S float32 scores (all heads) at each S

    @property
    def fit_ratio(self) -> float:
        """Largest per-rank bytes held / single-process bytes held, at the S that fits (measured)."""
        return max(m.held for m in self.ranks[self.fit_seq]) / self.single_fit


def _sizes(world_size: int, long_target: int, fit_target: int, budget: int) -> tuple[int, int]:
    """Both lengths rounded down to multiples of N (the contiguous layout); ValueError if that leaves nothing."""
    n = require_int("world_size", world_size, 1)
    for name, s in (("long_seq", long_target), ("fit_seq", fit_target)):
        if require_int(name, s, 1) < n:
            raise ValueError(f"world_size must be <= {name} (each rank needs a token), got world_size={n}, {name}={s}")
    long_seq, fit_seq = n * (long_target // n), n * (fit_target // n)
    full = costs.full_scores_bytes(long_seq, heads=SHAPE["heads"], batch=SHAPE["batch"], elem_size=4)
    if full <= budget:
        raise ValueError(f"long_seq={long_seq}: its S x S scores ({full} B) fit the {budget} B budget; "
                         "choose a longer S")
    return long_seq, fit_seq


@dataclass(frozen=True, kw_only=True)
class LongRun:
    """ring-attention-long-context's run: the asked-for lengths (rounded down to multiples of N by `_sizes`, which
    refuses a long S whose scores fit the budget) and the budget in bytes."""
    world_size: int
    long_target: int = 2048
    fit_target: int = 512
    budget: int = BUDGET
    long_seq: int = field(init=False)
    fit_seq: int = field(init=False)

    def __post_init__(self) -> None:
        budget = require_int("budget", self.budget, 1)
        long_seq, fit_seq = _sizes(self.world_size, self.long_target, self.fit_target, budget)
        object.__setattr__(self, "long_seq", long_seq)
        object.__setattr__(self, "fit_seq", fit_seq)

    def spec(self, seq_len: int) -> RingSpec:
        """The sizes at one of the two lengths."""
        return RingSpec(seq_len=seq_len, **SHAPE)


@dataclass(frozen=True)
class MemoryRanks:
    """One rank's measured memory at the long S and at the S that fits."""
    long: RankMemory
    fit: RankMemory


def memory_ranks(ctx: Context, run: LongRun) -> MemoryRanks:
    """Rank function: `ring_memory` at the long S, then at the short one."""
    return MemoryRanks(ring_memory(ctx, run.spec(run.long_seq)), ring_memory(ctx, run.spec(run.fit_seq)))


def compare_long(run: LongRun, results: list[MemoryRanks]) -> Verdict:
    """The premise (scores over budget), each rank within the budget, the short S within it in one process, and
    every rank's score temporaries within the block-size bound."""
    budget, long_seq, fit_seq = run.budget, run.long_seq, run.fit_seq
    specs = {s: run.spec(s) for s in (long_seq, fit_seq)}
    ranks = {long_seq: [m.long for m in results], fit_seq: [m.fit for m in results]}
    data = LongContextData(budget=budget, long_seq=long_seq, fit_seq=fit_seq, ranks=ranks, single_fit=single_memory(specs[fit_seq]),
                           full_scores={s: costs.full_scores_bytes(s, heads=SHAPE["heads"], batch=SHAPE["batch"], elem_size=4)
                            for s in specs})
    b, h, d = SHAPE["block_size"], SHAPE["heads"], SHAPE["head_dim"]
    tile = costs.score_tile_bytes(b, b, heads=h, batch=SHAPE["batch"], elem_size=4)
    block_rows = SHAPE["batch"] * h * b * d * 4
    # What blockwise attention holds at once beyond its S/N-token tensors (as in the chapter's single-process test):
    # two score tiles, the boolean causal mask, five (B, H, block, D) tensors, eight (B, H, block) row vectors.
    score_bound = 2 * tile + b * b + 5 * block_rows + 8 * block_rows // d
    longest = max(m.held for m in ranks[long_seq])
    checks = [
        Check(name=f"S={long_seq}: full S x S scores / budget", error=data.full_scores[long_seq] / budget, tolerance=1.0,
              reason="the premise: unblocked attention's scores alone exceed the budget", must_differ=True),
        Check(name=f"S={long_seq}: largest per-rank bytes held / budget", error=longest / budget, tolerance=1.0,
              reason="ring attention must fit the budget where full attention cannot"),
        Check(name=f"S={fit_seq}: single-process full attention / budget", error=data.single_fit / budget, tolerance=1.0,
              reason="the shorter S is one that still fits a single process"),
    ]
    checks += [Check(name=f"S={s}, rank {r}: score temporaries / block-size bound", error=m.scores / score_bound, tolerance=1.0,
                     reason="beyond its S/N tokens a rank holds only a few block x block tiles, whatever S is")
               for s in specs for r, m in enumerate(ranks[s])]
    return Verdict(checks=checks, data=data,
                   params={"budget_bytes": budget, "long_seq": long_seq, "fit_seq": fit_seq, **SHAPE,
                           "single": "SDPA MATH backend (materializes the scores)",
                           "fit_ratio": round(data.fit_ratio, 4)})


LONG_DEMO = Experiment(name="ring-attention-long-context", chapter="06", world_sizes=(2, 4),
                       title="A context whose S x S scores exceed a 32 MiB budget runs on N ranks; per-rank memory "
                             "~ 1/N of the tokens plus block-bounded scores",
                       spec=lambda n: LongRun(world_size=n), ranks=memory_ranks, compare=compare_long)


def long_context_demo(world_size: int, *, long_seq: int = 2048, fit_seq: int = 512, budget: int = BUDGET) -> Report:
    """Run S = long_seq (scores over budget) and S = fit_seq on N ranks; measure per-rank and single-process memory."""
    return LONG_DEMO.run_spec(LongRun(world_size=world_size, long_target=long_seq, fit_target=fit_seq, budget=budget))


DEMOS = [LONG_DEMO]
