"""The affine recurrence with its time axis split over N ranks: summaries travel, never the chunks.

Rank r holds steps [t_r, t_r + L_r) of h_t = A_t h_{t-1} + b_t. It folds them
into one summary map (L_r - 1 composes), learns the state entering its chunk
from the others, and replays its chunk from that state. Two ways to learn it:

  gathered: a ring all-gather of all N summaries (exact wire bytes); rank r
            then applies summaries 0 .. r-1 to h0 itself. One collective of
            N - 1 rounds that every rank enters at once.
  handoff:  rank r receives the state entering its chunk from rank r - 1,
            applies its own summary and sends the result to rank r + 1. Only
            one state travels per hop, but the N - 1 hops wait for each other.

Either way what travels is a summary (B(n^2 + n) elements, B*2n for diagonal
A) or a state (B*n): the chunk length never appears, so the bytes depend on
n and N and not on T. A `ScanSpec` (checked before any process starts) is
what `scan_rank` runs; `scan_cases` runs any list of systems on N ranks, and
the Experiments in affine_demos.py build their specs on it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from wmdist.comm import Context, recv, ring_all_gather, send
from wmdist.costs.rounding import FLOAT64_ROUNDOFF
from wmdist.costs.scan import COMBINES, Combine, reassociation_bound, time_chunk_sizes
from wmdist.costs.validate import require_choice, require_int
from wmdist.course.exercises import Exercise
from wmdist.runtime import run
from wmdist.scan.affine import (
    Map,
    Tally,
    apply_incoming,
    check_system,
    chunk_summary,
    handoff,
    incoming_for_rank,
    random_system,
)


@dataclass(frozen=True)
class AffineCase:
    """One system for the ranks to scan: A (B, T, n, n) or (B, T, n), b (B, T, n), h0 (B, n), and a label."""
    label: str
    A: torch.Tensor
    b: torch.Tensor
    h0: torch.Tensor

    def __post_init__(self) -> None:
        check_system(self.A, self.b, h0=self.h0)

    @property
    def steps(self) -> int:
        return self.b.shape[1]

    @property
    def state_size(self) -> int:
        return self.b.shape[2]

    @property
    def batch(self) -> int:
        return self.b.shape[0]

    @property
    def diagonal(self) -> bool:
        return self.A.dim() == 3

    @classmethod
    def random(cls, batch: int, steps: int, state_size: int, *, diagonal: bool, seed: int = 0,
               dtype: torch.dtype = torch.float32) -> AffineCase:
        """A seeded contracting system (affine.random_system), labelled by its shape."""
        A, b, h0 = random_system(batch, steps, state_size, diagonal=diagonal, seed=seed, dtype=dtype)
        kind = "diagonal" if diagonal else "dense"
        return cls(f"{kind} n={state_size} T={steps}", A, b, h0)


@dataclass(kw_only=True, frozen=True)
class RankOutcome:
    """What one rank produced for one case and one combine: its chunk's states and what it counted."""
    states: torch.Tensor     # (B, L_r, n)
    composes: int
    applies: int
    bytes_sent: int
    bytes_recv: int
    messages: int


def chunk_of(A: torch.Tensor, b: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s time chunk of (A, b): the layout of costs.scan.time_chunk_sizes (views)."""
    sizes = time_chunk_sizes(b.shape[1], world_size)
    start = sum(sizes[:rank])
    return A[:, start:start + sizes[rank]], b[:, start:start + sizes[rank]]


def _flatten(summary: Map) -> torch.Tensor:
    return torch.cat([summary[0].reshape(-1), summary[1].reshape(-1)])        # (B(n^2 + n),) or (B*2n,)


def _unflatten(flat: torch.Tensor, like: Map) -> Map:
    a_numel = like[0].numel()
    return flat[:a_numel].view_as(like[0]), flat[a_numel:].view_as(like[1])


def incoming_gathered(ctx: Context, summary: Map, h0: torch.Tensor, *, phase: str,
                      tally: Tally | None = None) -> torch.Tensor:
    """The state entering this rank's chunk, from a ring all-gather of every rank's summary."""
    flat = _flatten(summary)
    gathered = ring_all_gather(ctx, flat, [flat.numel()] * ctx.world_size, phase=phase)   # (N * s,)
    summaries = [_unflatten(piece, summary) for piece in gathered.split(flat.numel())]
    return incoming_for_rank(summaries, h0, ctx.rank, tally=tally)


def incoming_handoff(ctx: Context, summary: Map, h0: torch.Tensor, *, phase: str,
                     tally: Tally | None = None) -> torch.Tensor:
    """The state entering this rank's chunk, received from rank r - 1; the state leaving it goes on to r + 1."""
    r, n = ctx.rank, ctx.world_size
    h_in = h0 if r == 0 else recv(ctx, torch.empty_like(h0), r - 1, phase=phase)          # (B, n)
    if r < n - 1:
        send(ctx, handoff(summary, h_in, tally=tally), r + 1, phase=phase)
    return h_in


@dataclass(frozen=True, kw_only=True)
class ScanSpec:
    """Systems and combines for N ranks, validated on construction (before any process starts)."""
    world_size: int
    cases: tuple[AffineCase, ...]
    combines: tuple[Combine, ...] = COMBINES

    def __post_init__(self) -> None:
        validate(self.world_size, list(self.cases), combines=self.combines)


@dataclass(frozen=True)
class ScanRank:
    """What one rank produced: outcomes[case][combine] in the spec's order."""
    outcomes: tuple[tuple[RankOutcome, ...], ...]


def scan_rank(ctx: Context, spec: ScanSpec) -> ScanRank:
    """Rank function: for every case and combine, fold my chunk, learn my incoming state, replay my chunk."""
    out = []
    for i, case in enumerate(spec.cases):
        row = []
        for combine in spec.combines:
            phase, tally = f"case {i} {combine}", Tally()
            A, b = chunk_of(case.A, case.b, ctx.rank, ctx.world_size)
            summary = chunk_summary(A, b, tally=tally)
            incoming = incoming_gathered if combine == "gathered" else incoming_handoff
            h_in = incoming(ctx, summary, case.h0, phase=phase, tally=tally)
            states = apply_incoming(A, b, h_in, tally=tally)                                # (B, L_r, n)
            sent = ctx.ledger.totals(phase=phase)
            row.append(RankOutcome(states=states, composes=tally.composes, applies=tally.applies, bytes_sent=sent["bytes_sent"], bytes_recv=sent["bytes_recv"],
                                   messages=sent["messages"]))
        out.append(tuple(row))
    return ScanRank(tuple(out))


def validate(world_size: int, cases: Sequence[AffineCase], *, combines: tuple[Combine, ...] = COMBINES) -> int:
    """Refuse a bad world size, an empty case list or a case with fewer steps than ranks, before any process starts."""
    n = require_int("world_size", world_size, 1)
    if not cases:
        raise ValueError("cases must hold at least one AffineCase")
    for case in cases:
        if not isinstance(case, AffineCase):
            raise TypeError(f"cases must be AffineCase values, got {type(case).__name__}")
        if case.steps < n:
            raise ValueError(f"world_size must be <= T (every rank needs at least one time step): "
                             f"case {case.label!r} has T={case.steps}, world_size={n}")
    for c in combines:
        require_choice("combine", c, COMBINES)
    return n


def scan_cases(world_size: int, cases: Sequence[AffineCase], *,
               combines: tuple[Combine, ...] = COMBINES) -> list[ScanRank]:
    """Run every case with every combine on N ranks: result[rank].outcomes[case][combine].

    A helper for tests of any list of systems: it calls `runtime.run` itself; the demo is affine_demos.AFFINE_DEMO.
    """
    spec = ScanSpec(world_size=world_size, cases=tuple(cases), combines=tuple(combines))
    return run(scan_rank, spec.world_size, spec)


def gather_states(results: Sequence[ScanRank], case: int, combine: int) -> torch.Tensor:
    """The whole trajectory (B, T, n) of one case and combine, concatenated from every rank's chunk."""
    return torch.cat([r.outcomes[case][combine].states for r in results], dim=1)


# --- exercise: one rank's incoming state, by hand-off -------------------------------------------

EXERCISE_STEPS, EXERCISE_STATE = 11, 3


def incoming_state_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank r: its time chunk of one dense system, A (L_r, n, n) and b (L_r, n), and the initial state h0 (n,)."""
    A, b, h0 = random_system(1, EXERCISE_STEPS, EXERCISE_STATE, diagonal=False, seed=11, dtype=torch.float64)
    A_r, b_r = chunk_of(A, b, rank, world_size)
    return A_r[0].clone(), b_r[0].clone(), h0[0].clone()


def incoming_state_solution(ctx: Context, A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """The state entering this rank's chunk: fold the chunk into one map, then hand states down the ranks."""
    fold_A, fold_b = A[0], b[0]
    for t in range(1, len(b)):                          # step t after the fold so far: (A_t F, A_t f + b_t)
        fold_A, fold_b = A[t] @ fold_A, A[t] @ fold_b + b[t]
    h_in = h0 if ctx.rank == 0 else recv(ctx, torch.empty_like(h0), ctx.rank - 1, phase="hand-off")
    if ctx.rank < ctx.world_size - 1:
        send(ctx, fold_A @ h_in + fold_b, ctx.rank + 1, phase="hand-off")
    return h_in


def _exercise_tolerance() -> float:
    """Folding then applying vs stepping through: the same products grouped differently (float64).

    affine.random_system makes every |A_t| row sum 0.9 and |b|, |h0| <= 1, so
    every state and every |.|-recurrence term stays below 1 / (1 - 0.9) = 10;
    any grouping of depth <= T rounds each term at most (n + 1) T times.
    """
    return 10 * reassociation_bound(EXERCISE_STEPS, EXERCISE_STEPS, EXERCISE_STATE, diagonal=False,
                                    unit_roundoff=FLOAT64_ROUNDOFF)


INCOMING_STATE = Exercise(
    name="incoming state",
    task=f"Rank r holds its time chunk of h_t = A_t h_(t-1) + b_t (A (L_r, n, n), b (L_r, n)) and the initial "
         f"state h0 (n,). Return the state entering your chunk: h0 on rank 0, h_(t_r - 1) on rank r. "
         f"(T = {EXERCISE_STEPS}, n = {EXERCISE_STATE}.)",
    reference=incoming_state_solution,
    make_inputs=incoming_state_inputs,
    world_sizes=(2, 3, 4),
    tolerance=_exercise_tolerance(),
    reason="the same products grouped differently in float64: costs.scan.reassociation_bound, states below 10",
    hint="fold your chunk into one map with (A2 A1, A2 b1 + b2), the later step on the left; rank 0 starts "
         "from h0; receive from rank - 1, and send your map applied to what you received to rank + 1.",
)
EXERCISES = [INCOMING_STATE]
