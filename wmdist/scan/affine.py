"""The affine recurrence h_t = A_t h_{t-1} + b_t, batched, and every way this chapter computes it.

A step is the map h -> A h + b. Two maps compose into one of the same form,
(A1, b1) then (A2, b2) = (A2 A1, A2 b1 + b2), and composing is associative,
so a time chunk folds into one summary map and a scan can group the steps
in any order. Shapes: dense A is (B, T, n, n); diagonal A (SSM-like) is
(B, T, n) and acts elementwise; b is (B, T, n); h0 is (B, n). A summary or
any single map drops the T axis. Dense composes cost n^3 (vs n^2 for an
apply), which is why the text says the scan's efficiency depends on A's
structure.

Everything here runs in one process and never communicates: a rank of the
multi-process version calls chunk_summary / apply_incoming on its own chunk
and incoming_for_rank or handoff on what it received. An optional `Tally`
counts the operations so they can be checked against wmdist.costs.scan.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from wmdist.costs.scan import COMBINES, Combine, time_chunk_sizes
from wmdist.costs.validate import require_choice, require_int, require_real

Map = tuple[torch.Tensor, torch.Tensor]   # (A, b): A (..., n, n) dense or (..., n) diagonal; b (..., n)


@dataclass
class Tally:
    """Running count of the operations a call performed, per sequence (a batch repeats them side by side).

    `calls` counts compose/apply calls; the operations inside one call are
    independent of each other, so for the loop and the scan calls == depth.
    """
    composes: int = 0
    applies: int = 0
    calls: int = 0

    def record(self, *, composes: int = 0, applies: int = 0) -> None:
        """Note one call that performed `composes` composes and `applies` applies."""
        self.composes, self.applies, self.calls = self.composes + composes, self.applies + applies, self.calls + 1


def _is_diagonal(A: torch.Tensor, b: torch.Tensor) -> bool:
    if A.dim() == b.dim():
        return True
    if A.dim() == b.dim() + 1:
        return False
    raise ValueError(f"A must have b's dims (diagonal) or one more (dense); got A {tuple(A.shape)}, b {tuple(b.shape)}")


def check_system(A: torch.Tensor, b: torch.Tensor, *, h0: torch.Tensor | None = None, finite_h0: bool = True) -> bool:
    """Validate shapes (B, T, n, n) or (B, T, n), (B, T, n), h0 (B, n) if given, finite values; True for diagonal A.

    Non-finite inputs are refused rather than scanned: with an inf in A the
    loop gives +-inf where a regrouped scan meets inf * 0 = NaN (a composed
    A2 A1 times a zero), so no grouping could promise the loop's answer.
    `finite_h0=False` is for a state a rank computed (it may have overflowed).
    """
    if b.dim() != 3:
        raise ValueError(f"b must be (B, T, n), got shape {tuple(b.shape)}")
    batch, steps, n = b.shape
    if steps < 1:
        raise ValueError(f"T (b.shape[1]) must be >= 1, got {steps}")
    diagonal = _is_diagonal(A, b)
    expected = (batch, steps, n) if diagonal else (batch, steps, n, n)
    if tuple(A.shape) != expected:
        raise ValueError(f"A must be {expected} to match b {tuple(b.shape)} (state size n={n}), got {tuple(A.shape)}")
    if h0 is not None and tuple(h0.shape) != (batch, n):
        raise ValueError(f"h0 must be (B, n) = {(batch, n)}, got {tuple(h0.shape)}")
    dtypes = {A.dtype, b.dtype} | ({h0.dtype} if h0 is not None else set())
    if len(dtypes) != 1:
        raise ValueError(f"A, b and h0 must share one dtype, got {sorted(map(str, dtypes))}")
    for name, t in (("A", A), ("b", b), ("h0", h0 if finite_h0 else None)):
        if t is not None and not bool(torch.isfinite(t).all()):
            where = tuple((~torch.isfinite(t)).nonzero()[0].tolist())
            raise ValueError(f"{name} must be finite (no inf or NaN), got {t[where].item()} at index {where}: a scan "
                             f"regroups the steps, and inf * 0 = NaN would appear where the loop has +-inf")
    return diagonal


def compose(first: Map, second: Map, *, tally: Tally | None = None) -> Map:
    """The map "apply `first`, then `second`": (A2 A1, A2 b1 + b2); dims before the map broadcast.

    Dim 0 is the batch; any dims between it and the map (e.g. T) are that
    many independent composes, which is what `tally` counts.
    """
    (A1, b1), (A2, b2) = first, second
    if _is_diagonal(A2, b2):
        A, b = A2 * A1, A2 * b1 + b2                           # (..., n)
    else:
        A, b = A2 @ A1, (A2 @ b1.unsqueeze(-1)).squeeze(-1) + b2  # (..., n, n), (..., n)
    if tally is not None:
        tally.record(composes=math.prod(b.shape[1:-1]))
    return A, b


def apply_map(m: Map, h: torch.Tensor, *, tally: Tally | None = None) -> torch.Tensor:
    """A h + b: one map applied to a state (B, n); dims between batch and state broadcast."""
    A, b = m
    out = A * h + b if _is_diagonal(A, b) else (A @ h.unsqueeze(-1)).squeeze(-1) + b
    if tally is not None:
        tally.record(applies=math.prod(out.shape[1:-1]))
    return out


def sequential(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, *, tally: Tally | None = None) -> torch.Tensor:
    """The reference loop: every state h_1 .. h_T, one step after another (T dependent applies)."""
    check_system(A, b, h0=h0)
    return _loop(A, b, h0, tally)


def _loop(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, tally: Tally | None) -> torch.Tensor:
    states, h = [], h0
    for t in range(b.shape[1]):
        h = apply_map((A[:, t], b[:, t]), h, tally=tally)          # (B, n)
        states.append(h)
    return torch.stack(states, dim=1)                          # (B, T, n)


def apply_incoming(A: torch.Tensor, b: torch.Tensor, h_in: torch.Tensor, *,
                   tally: Tally | None = None) -> torch.Tensor:
    """A chunk's states (B, L, n) given the state entering it, h_in (B, n).

    The same operations in the same order as `sequential`: given the true
    incoming state bit for bit, the chunk's states equal the reference's bit for bit.
    """
    check_system(A, b, h0=h_in, finite_h0=False)                  # h_in was computed: it may have overflowed
    return _loop(A, b, h_in, tally)


def chunk_summary(A: torch.Tensor, b: torch.Tensor, *, tally: Tally | None = None) -> Map:
    """A chunk's L steps composed into one map (A (B, n, n) or (B, n), b (B, n)): L-1 composes."""
    check_system(A, b)
    summary = (A[:, 0].clone(), b[:, 0].clone())
    for t in range(1, b.shape[1]):
        summary = compose(summary, (A[:, t], b[:, t]), tally=tally)
    return summary


def split_chunks(A: torch.Tensor, b: torch.Tensor, chunks: int) -> list[Map]:
    """Cut the time axis into `chunks` consecutive pieces (views), the first T % N one step longer."""
    check_system(A, b)
    sizes = time_chunk_sizes(b.shape[1], chunks)               # ValueError if chunks > T
    return list(zip(torch.split(A, sizes, dim=1), torch.split(b, sizes, dim=1)))


def incoming_for_rank(summaries: list[Map], h0: torch.Tensor, rank: int, *,
                      tally: Tally | None = None) -> torch.Tensor:
    """The state entering chunk `rank`, from the all-gathered list: summaries 0 .. rank-1 applied to h0.

    Applying them one by one (rank applies of n^2) is cheaper than composing
    them first (n^3 each) and does the same arithmetic as the hand-off.
    """
    require_int("rank", rank, 0, high=len(summaries) - 1)
    h = h0
    for summary in summaries[:rank]:
        h = apply_map(summary, h, tally=tally)
    return h


def incoming_from_gathered(summaries: list[Map], h0: torch.Tensor, *,
                           tally: Tally | None = None) -> list[torch.Tensor]:
    """Every chunk's incoming state as each rank computes it from the all-gathered summaries."""
    return [incoming_for_rank(summaries, h0, r, tally=tally) for r in range(len(summaries))]


def handoff(summary: Map, h_in: torch.Tensor, *, tally: Tally | None = None) -> torch.Tensor:
    """What rank r does on receiving the state entering its chunk: the state leaving it, to send on."""
    return apply_map(summary, h_in, tally=tally)


def incoming_by_handoff(summaries: list[Map], h0: torch.Tensor, *,
                        tally: Tally | None = None) -> list[torch.Tensor]:
    """Every chunk's incoming state by the hand-off chain rank 0 -> 1 -> ... -> N-1 (N-1 hops).

    Bit for bit the same as incoming_from_gathered: the same applies in the
    same order; the two differ in what travels (states vs summaries) and in
    how many transfers wait for each other.
    """
    incoming = [h0]
    for summary in summaries[:-1]:
        incoming.append(handoff(summary, incoming[-1], tally=tally))
    return incoming


def chunked(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunks: int, *, combine: Combine = "handoff",
            tally: Tally | None = None) -> torch.Tensor:
    """All states (B, T, n) the way N ranks get them: summarise chunks, combine, replay each chunk.

    Equal to `sequential` up to rounding: a summary regroups the products
    (wmdist.costs.scan.reassociation_bound says by how much).
    """
    check_system(A, b, h0=h0)
    require_choice("combine", combine, COMBINES)
    pieces = split_chunks(A, b, chunks)
    summaries = [chunk_summary(Ac, bc, tally=tally) for Ac, bc in pieces]
    combine_fn = incoming_from_gathered if combine == "gathered" else incoming_by_handoff
    incoming = combine_fn(summaries, h0, tally=tally)
    return torch.cat([apply_incoming(Ac, bc, h, tally=tally) for (Ac, bc), h in zip(pieces, incoming)], dim=1)


def associative_scan(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, *,
                     tally: Tally | None = None) -> torch.Tensor:
    """All states (B, T, n) by a Hillis-Steele inclusive scan of the maps, then one apply to h0 each.

    Hillis-Steele rather than Blelloch: in one process each level is a single
    batched compose over all prefixes, so wall time follows the number of
    levels, and Hillis-Steele has the fewest (ceil(log2 T), vs about
    2 log2 T for Blelloch), in one short loop. The price is work: about
    T log2 T composes instead of Blelloch's under 2T, each n^3 for dense A;
    torch_associative_scan runs the work-efficient one for comparison.
    Level d composes every prefix with the prefix 2^d steps earlier.
    """
    check_system(A, b, h0=h0)
    steps, pa, pb = b.shape[1], A, b                           # prefix maps (B, T, n, n) / (B, T, n), (B, T, n)
    shift = 1
    while shift < steps:
        na, nb = compose((pa[:, :-shift], pb[:, :-shift]), (pa[:, shift:], pb[:, shift:]), tally=tally)
        pa, pb = torch.cat([pa[:, :shift], na], dim=1), torch.cat([pb[:, :shift], nb], dim=1)
        shift *= 2
    return apply_map((pa, pb), h0.unsqueeze(1), tally=tally)      # (B, T, n)


def torch_associative_scan(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """All states (B, T, n) by torch's prototype associative_scan (combine_mode="generic"), eager on CPU.

    torch 2.13 runs the generic mode eagerly: a recursive odd/even
    (work-efficient) scan that vmaps `compose` over the scan axis
    (costs.scan.blelloch_ops counts it). The "pointwise" mode needs CUDA.
    Private API, so imported here only.
    """
    from torch._higher_order_ops.associative_scan import associative_scan as scan_op

    check_system(A, b, h0=h0)
    pa, pb = scan_op(compose, (A, b), dim=1, combine_mode="generic")
    return apply_map((pa, pb), h0.unsqueeze(1))


def random_system(batch: int, steps: int, state_size: int, *, diagonal: bool, radius: float = 0.9, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded A (every row's absolute sum <= radius < 1), b and h0 uniform in [-1, 1].

    Row sums below 1 make every A_t a contraction in the max norm (so its
    spectral radius is < 1 too): states stay below max(|h0|, 1/(1 - radius)).
    """
    require_int("batch", batch, 1)
    require_int("steps", steps, 1)
    n = require_int("state_size", state_size, 1)
    rho = require_real("radius", radius, low=0.0, high=0.999)
    g = torch.Generator().manual_seed(require_int("seed", seed, 0))
    if diagonal:
        A = (torch.rand(batch, steps, n, generator=g, dtype=torch.float64) * 2 - 1) * rho
    else:
        raw = torch.randn(batch, steps, n, n, generator=g, dtype=torch.float64)
        A = raw * (rho / raw.abs().sum(-1, keepdim=True))       # each row's |.|-sum is exactly rho
    b = torch.rand(batch, steps, n, generator=g, dtype=torch.float64) * 2 - 1
    h0 = torch.rand(batch, n, generator=g, dtype=torch.float64) * 2 - 1
    return A.to(dtype), b.to(dtype), h0.to(dtype)


def time_scans(*, steps: tuple[int, ...] = (16, 64, 256, 1024), state_size: int = 8, batch: int = 4,
               diagonal: bool = True, repeats: int = 3) -> list[dict[str, float]]:
    """Wall seconds (best of `repeats`) of the loop, the Hillis-Steele scan and torch's scan at each T.

    For a notebook's table or plot; timings vary by machine and load, so
    nothing asserts them.
    """
    rows = []
    for t in steps:
        A, b, h0 = random_system(batch, t, state_size, diagonal=diagonal, seed=t, dtype=torch.float32)
        row: dict[str, float] = {"steps": t}
        for name, fn in (("sequential_s", sequential), ("hillis_steele_s", associative_scan),
                         ("torch_scan_s", torch_associative_scan)):
            best = math.inf
            for _ in range(require_int("repeats", repeats, 1)):
                start = time.perf_counter()
                fn(A, b, h0)
                best = min(best, time.perf_counter() - start)
            row[name] = best
        rows.append(row)
    return rows
