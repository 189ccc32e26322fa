"""Causal load balance: the contiguous layout gives the last rank most of the work, zigzag gives every rank the same.

Both layouts run the same causal ring forward on the same sequence. Work is
counted exactly on every rank (score tiles and query-key pairs its loop
computed) and compared with wmdist.ring_attention.layout. Time is measured
too, as the CPU seconds of each rank's computing thread (time.thread_time
around its block work, median over repeats): on a shared machine, CPU time
follows the work a rank does, where wall time would also count the minutes
other processes held the cores. Times are reported, not asserted; the exact
work counts and the output's agreement with SDPA are the checks.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wmdist.comm import Context
from wmdist.course.compare import bound_ratio
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, counts_per_rank
from wmdist.ring_attention import layout as lay
from wmdist.ring_attention.spec import Cases
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.ring import positions, ring_forward
from wmdist.ring_attention.spec import RingSpec
from wmdist.ring_attention.tolerance import REASON, exact_attention, attention_tolerance
from wmdist.base.spans import Span

LAYOUTS = lay.LAYOUTS


@dataclass(kw_only=True, frozen=True)
class BalanceRank:
    """One rank's forward under one layout: its rows, output, work and times."""
    rows: list[int]
    out: torch.Tensor            # (B, H, c, D)
    tiles: int
    pairs: int
    cpu_s: list[float]           # compute-thread CPU seconds, one per repeat
    spans: tuple[Span, ...]      # the last repeat's timeline


def layout_balance_rank(ctx: Context, spec: RingSpec, *, layout: Layout, repeats: int) -> BalanceRank:
    """Rank function: the causal ring forward `repeats` times on this rank's rows of one layout."""
    q, k, v, _ = spec.inputs(dtype="float32")
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout=layout)
    q, k, v = (x[:, :, rows].contiguous() for x in (q, k, v))
    cpu = []
    for _ in range(repeats):
        out, _, trace = ring_forward(ctx, q, k, v, seq_len=spec.seq_len, layout=layout, causal=True,
                                     block_size=spec.block_size)
        cpu.append(trace.compute_cpu_s)
    return BalanceRank(rows=rows.tolist(), out=out, tiles=sum(trace.tiles), pairs=sum(trace.pairs), cpu_s=cpu, spans=trace.spans)


@dataclass(frozen=True)
class BalanceData:
    """Per layout: exact work per rank, median compute CPU seconds per rank, and one timeline."""
    pairs: dict[str, list[int]]
    cpu_s: dict[str, list[float]]
    spans: dict[str, tuple[Span, ...]]

    def imbalance(self, *, layout: Layout) -> float:
        """Measured max / min of the ranks' compute CPU time (1 is perfect balance)."""
        times = self.cpu_s[layout]
        return max(times) / min(times) if min(times) > 0 else float("inf")


def balance_seq_len(world_size: int, *, target: int = 1024) -> int:
    """The largest S <= target (at least 2N) that both layouts accept: a multiple of 2N."""
    chunk = 2 * world_size
    return max(chunk, target // chunk * chunk)


@dataclass(frozen=True, kw_only=True)
class BalanceRun:
    """ring-attention-balance's run: one sequence's sizes on N ranks (both layouts must accept them), the forward
    repeated `repeats` times per layout."""
    world_size: int
    ring: RingSpec
    repeats: int = 3

    def __post_init__(self) -> None:
        for layout in LAYOUTS:
            self.ring.check(self.world_size, layout=layout)
        require_int("repeats", self.repeats, 1)


def balance_run(world_size: int, *, seq_len: int | None = None, block_size: int = 64, heads: int = 2,
                head_dim: int = 64, repeats: int = 3, seed: int = 0) -> BalanceRun:
    """The run, by default at the largest S <= 1024 both layouts accept (balance_seq_len)."""
    ring = RingSpec(seq_len=balance_seq_len(world_size) if seq_len is None else seq_len, batch=1, heads=heads,
                    head_dim=head_dim, block_size=block_size, seed=seed)
    return BalanceRun(world_size=world_size, ring=ring, repeats=repeats)


def balance_ranks(ctx: Context, run: BalanceRun) -> Cases[BalanceRank]:
    """Rank function: `layout_balance_rank` under each layout in turn."""
    return Cases(LAYOUTS, tuple(layout_balance_rank(ctx, run.ring, layout=layout, repeats=run.repeats)
                                for layout in LAYOUTS))


def compare_layout_balance(run: BalanceRun, outcomes: list[Cases[BalanceRank]]) -> Verdict:
    """Each layout's output against SDPA (rounding bound), its pairs and tiles per rank against the layout's
    formulas; the CPU times are reported, never checked."""
    spec, world_size = run.ring, run.world_size
    results = {layout: [o[layout] for o in outcomes] for layout in LAYOUTS}
    q, k, v, dout = spec.inputs(dtype="float32")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tol = attention_tolerance(exact_attention(q, k, v, dout, causal=True), torch.float32, spec.tile(world_size),
                    spec.key_blocks(world_size), grads=False)
    checks: list[Check] = []
    exact: list[Count] = []
    tile = spec.tile(world_size)
    for layout, ranks in results.items():
        got = want.new_empty(want.shape)
        for rk in ranks:
            got[:, :, rk.rows] = rk.out
        checks.append(Check(name=f"{layout}: output == SDPA", error=bound_ratio(got, want, tol.out), tolerance=1.0, reason=REASON))
        exact += counts_per_rank("query-key pairs", [rk.pairs for rk in ranks],
                                 lay.rank_work(spec.seq_len, world_size, layout=layout, causal=True), case=layout)
        pairs = lay.tile_pairs(spec.seq_len, world_size, layout=layout, block_size=tile, causal=True)
        exact += counts_per_rank("tiles computed", [rk.tiles for rk in ranks], [sum(row) for row in pairs],
                                 case=layout)
    data = BalanceData({lo: [rk.pairs for rk in rs] for lo, rs in results.items()},
                       {lo: [statistics.median(rk.cpu_s) for rk in rs] for lo, rs in results.items()},
                       {lo: tuple(s for rk in rs for s in rk.spans) for lo, rs in results.items()})
    params = {"seq_len": spec.seq_len, "block_size": spec.block_size, "heads": spec.heads, "head_dim": spec.head_dim,
              "repeats": run.repeats, "time": "compute-thread CPU s, median over repeats (reported, not checked)"}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


BALANCE_DEMO = Experiment(name="ring-attention-balance", chapter="06", world_sizes=(2, 4), spec=balance_run,
                          title="Causal load balance: contiguous blocks give the last rank the most work, zigzag "
                                "equal work; exact pair counts, measured CPU time",
                          ranks=balance_ranks, compare=compare_layout_balance)


def balance_demo(world_size: int, *, seq_len: int | None = None, block_size: int = 64, heads: int = 2,
                 head_dim: int = 64, repeats: int = 3, seed: int = 0) -> Report:
    """Causal ring forward on both layouts: exact per-rank work, measured per-rank compute time, output == SDPA."""
    return BALANCE_DEMO.run_spec(balance_run(world_size, seq_len=seq_len, block_size=block_size, heads=heads,
                                             head_dim=head_dim, repeats=repeats, seed=seed))


DEMOS = [BALANCE_DEMO]
