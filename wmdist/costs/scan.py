"""Scans over time: operation counts of each schedule and bytes to combine chunk summaries.

Pure counting (no torch), so a widget answers at once and the single-process
code in wmdist.scan can be checked against it with ==. Work counts are per
sequence: a batch of B independent sequences does every operation B times,
side by side, without changing the depth.

Two kinds of operation on affine maps h -> A h + b:
  compose: (A1, b1) then (A2, b2) -> (A2 A1, A2 b1 + b2): a matrix-matrix
           product for dense A (n^3 multiply-adds), elementwise for diagonal A;
  apply:   a map to a state, A h + b: a matrix-vector product (n^2).
Depth is the longest chain of compose/apply steps that depend on each other:
the number of parallel steps with unlimited workers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from wmdist.costs.collectives import nonempty_split, ring_all_gather_bytes
from wmdist.costs.validate import require_bool, require_choice, require_fields, require_int, require_real

Combine = Literal["gathered", "handoff"]   # how a rank learns the state entering its chunk (affine_ranks)
COMBINES: tuple[Combine, ...] = get_args(Combine)


@dataclass(frozen=True)
class OpCount:
    """Operations one schedule performs on one sequence: total work and parallel depth."""
    composes: int   # map compositions (A2 A1, A2 b1 + b2)
    applies: int    # maps applied to a state, A h + b
    depth: int      # longest chain of dependent compose/apply steps

    def __post_init__(self) -> None:
        require_fields(self, ("composes", "applies", "depth"), 0)


def time_chunk_sizes(steps: int, chunks: int) -> list[int]:
    """Lengths of `chunks` consecutive time chunks of `steps` steps; the first steps % chunks get one more."""
    return nonempty_split(steps, chunks, total_name="steps", parts_name="chunks", what="time step")


def fold_ops(steps: int) -> OpCount:
    """Composing T maps one after another into one map: T-1 composes, each waiting for the last."""
    t = require_int("steps", steps, 1)
    return OpCount(composes=t - 1, applies=0, depth=t - 1)


def sequential_ops(steps: int) -> OpCount:
    """The reference loop h_t = A_t h_{t-1} + b_t: T applies, each waiting for the last."""
    t = require_int("steps", steps, 1)
    return OpCount(composes=0, applies=t, depth=t)


def hillis_steele_ops(steps: int) -> OpCount:
    """Hillis-Steele inclusive scan of T maps, then every prefix map applied to h0 in one parallel step.

    Level d (shift 2^d, d = 0 .. L-1, L = ceil(log2 T)) composes every prefix
    with the one 2^d earlier: T - 2^d composes. Work L*T - (2^L - 1), about
    T log2 T; depth L + 1 (the applies are independent of each other).
    """
    t = require_int("steps", steps, 1)
    levels = (t - 1).bit_length()                       # ceil(log2 T); 0 for T = 1
    return OpCount(composes=levels * t - (2 ** levels - 1), applies=t, depth=levels + 1)


def blelloch_ops(steps: int) -> OpCount:
    """Work-efficient (Blelloch-style) inclusive scan in its recursive odd/even form, then T applies.

    On T elements: compose neighbouring pairs (floor(T/2) composes), scan
    those recursively, then fill in the remaining elements from the scanned
    pairs (ceil(T/2) - 1 composes). Work W(T) = T - 1 + W(floor(T/2)), which
    is 2T - 2 - log2 T for a power of two; two compose levels per halving
    (one when nothing is left to fill), 2 log2 T - 1 for a power of two,
    plus the step of applies.
    This is the schedule torch's generic associative_scan runs.
    """
    total = require_int("steps", steps, 1)
    t, composes, depth = total, 0, 0
    while t >= 2:
        composes += t - 1                               # t // 2 pairs + (t + 1) // 2 - 1 fills
        depth += 1 + (1 if t >= 3 else 0)
        t //= 2
    return OpCount(composes=composes, applies=total, depth=depth + 1)


def brent_steps(ops: OpCount, workers: int) -> float:
    """Parallel steps a schedule needs on P workers, at most: depth + (work - depth) / P (Brent's bound).

    Work counts composes and applies alike, one step each (fair for diagonal
    A; for dense A a compose is a matrix product, n times an apply). One
    worker does all the work; unlimited workers need only the depth. A scan
    beats the T steps of the loop only once P is large enough to absorb its
    extra work (workers_to_pay): about log2 T + 1 for Hillis-Steele, 4 or 5
    for Blelloch, counting the T applies at the end.
    """
    p = require_int("workers", workers, 1)
    work = ops.composes + ops.applies
    return ops.depth + max(0, work - ops.depth) / p


def workers_to_pay(ops: OpCount, steps: int) -> int:
    """Fewest workers P with brent_steps(ops, P) < T, the loop's steps: from there on the schedule pays.

    (W - D) / P < T - D, so P > (W - D) / (T - D). A schedule as deep as the loop never pays.
    """
    t = require_int("steps", steps, 1)
    if ops.depth >= t:
        raise ValueError(f"a schedule of depth {ops.depth} never beats the loop's {t} steps")
    return (ops.composes + ops.applies - ops.depth) // (t - ops.depth) + 1


def _incoming_ready(sizes: list[int]) -> list[int]:
    """Parallel step at which each chunk's incoming state exists (chunk 0: h0, at step 0).

    Chunk r's summary needs L_r - 1 composes; the state entering chunk r+1 is
    that summary applied to the state entering chunk r, one step after both
    exist. An all-gather waits for every summary instead, but the first chunk
    is the longest, so both combines give the same times.
    """
    ready = [0]
    for length in sizes[:-1]:
        ready.append(max(ready[-1], length - 1) + 1)
    return ready


def chunked_rank_ops(steps: int, chunks: int, rank: int, *, combine: Combine = "handoff") -> OpCount:
    """What rank `rank` does in the chunked scheme: fold its chunk, combine, replay its chunk.

    Every rank composes its L_r maps into one summary (L_r - 1 composes). To
    find the state entering its chunk, with "handoff" it receives the previous
    rank's outgoing state and, unless it is last, applies its own summary to
    pass it on (1 apply); with "gathered" it holds all N summaries and applies
    the first r of them to h0 itself (r applies). Then L_r applies replay its
    chunk. `depth` is the step at which this rank's last state is ready.
    """
    sizes = time_chunk_sizes(steps, chunks)
    r = require_int("rank", rank, 0, high=len(sizes) - 1)
    require_choice("combine", combine, COMBINES)
    combine_applies = (1 if r < len(sizes) - 1 else 0) if combine == "handoff" else r
    return OpCount(composes=sizes[r] - 1, applies=combine_applies + sizes[r],
                   depth=_incoming_ready(sizes)[r] + sizes[r])


def chunked_ops(steps: int, chunks: int, *, combine: Combine = "handoff") -> OpCount:
    """The chunked scheme summed over ranks; depth is the slowest rank's.

    Composes T - N, applies T + N - 1 (handoff) or T + N(N-1)/2 (gathered: each
    rank repeats the applies before it). For N >= 2 the depth is
    (L_0 - 1) + (N - 1) + L_{N-1}: fold the longest chunk, pass the state down
    N - 1 chunks, replay the last one. With N = 1 it is the sequential T.
    """
    per_rank = [chunked_rank_ops(steps, chunks, r, combine=combine) for r in range(chunks)]
    return OpCount(composes=sum(o.composes for o in per_rank), applies=sum(o.applies for o in per_rank),
                   depth=max(o.depth for o in per_rank))


def picard_work(steps: int, sweeps: int) -> int:
    """Cell evaluations of `sweeps` Picard sweeps: every sweep reruns all T steps, so sweeps * T."""
    return require_int("sweeps", sweeps, 1) * require_int("steps", steps, 1)


def picard_depth(steps: int, chunks: int, sweeps: int) -> int:
    """Dependent cell evaluations of `sweeps` sweeps with chunks in parallel: sweeps * longest chunk.

    After N sweeps this is N * ceil(T/N) >= T: sweeping to exactness never
    beats the sequential loop; sweeps pay off only if far fewer are enough.
    """
    return require_int("sweeps", sweeps, 1) * max(time_chunk_sizes(steps, chunks))


def summary_elements(state_size: int, batch: int, *, diagonal: bool) -> int:
    """Elements of one chunk summary (A, b) for a batch: B(n^2 + n) dense, B(2n) diagonal."""
    n = require_int("state_size", state_size, 1)
    b = require_int("batch", batch, 1)
    return b * ((n if require_bool("diagonal", diagonal) else n * n) + n)


def allgather_summary_bytes(state_size: int, batch: int, world_size: int, *, diagonal: bool,
                            elem_size: int = 4) -> dict[str, int]:
    """Wire bytes per rank of a ring all-gather of the N chunk summaries, and its messages.

    Each rank forwards the N-1 summaries that are not its own and receives as
    many: (N-1) * B * (n^2 + n) elements dense, (N-1) * B * 2n diagonal.
    Independent of T (a summary is the same size for any chunk length); grows
    with N, with B, and quadratically with n for dense A. A built-in
    dist.all_gather records its local payloads instead: one summary in, N out.
    """
    s = summary_elements(state_size, batch, diagonal=diagonal)
    n = require_int("world_size", world_size, 1)
    sent = ring_all_gather_bytes(n * s, n, 0, elem_size=require_int("elem_size", elem_size, 1))
    return {"bytes_sent": sent, "bytes_recv": sent, "messages": n - 1}


def handoff_bytes(state_size: int, batch: int, world_size: int, rank: int, *,
                  elem_size: int = 4) -> dict[str, int]:
    """Bytes rank `rank` sends and receives in the sequential hand-off of boundary states.

    Rank r receives the state entering its chunk from rank r-1 and sends the
    state leaving it to rank r+1: one state of B * n elements per hop, N-1
    hops in all, each waiting for the one before. Independent of T and of
    A's structure (only states travel, never matrices).
    """
    msg = require_int("batch", batch, 1) * require_int("state_size", state_size, 1) * require_int(
        "elem_size", elem_size, 1)
    n = require_int("world_size", world_size, 1)
    r = require_int("rank", rank, 0, high=n - 1)
    sends = 1 if r < n - 1 else 0
    return {"bytes_sent": sends * msg, "bytes_recv": (1 if r > 0 else 0) * msg, "messages": sends}


def handoff_hops(world_size: int) -> int:
    """Dependent point-to-point transfers in the hand-off: N-1, one after another."""
    return require_int("world_size", world_size, 1) - 1


def reassociation_bound(depth_a: int, depth_b: int, state_size: int, *, diagonal: bool,
                        unit_roundoff: float) -> float:
    """Relative bound on |x_a - x_b| between two groupings of the same affine scan.

    Both results are sums of products of the same A, b and h0 entries. Along
    any path from an input to a result a compose or apply rounds at most
    c = n + 1 times (a length-n dot product and one addition; c = 2 for
    diagonal A), so a schedule of depth D perturbs every term by at most
    gamma(cD) = cDu / (1 - cDu) relative (Higham's gamma). Hence
    |x_a - x_b| <= (gamma(c D_a) + gamma(c D_b)) * |x|_abs, where |x|_abs is
    the same recurrence run on |A|, |b|, |h0|. A shallower schedule (a scan)
    rounds less along each path than the loop does.
    """
    c = 2 if require_bool("diagonal", diagonal) else require_int("state_size", state_size, 1) + 1
    u = require_real("unit_roundoff", unit_roundoff)

    def gamma(depth: int) -> float:
        k = c * depth * u
        if k >= 1:
            raise ValueError(f"depth {depth} is too deep for unit roundoff {u}: c*D*u = {k} >= 1")
        return k / (1 - k)

    return gamma(require_int("depth_a", depth_a, 0)) + gamma(require_int("depth_b", depth_b, 0))
