"""Which tokens each rank holds, which K, V block it sees at each ring step, and the causal work that implies.

Pure Python (no torch): the ring ranks take their positions from here, the
widget draws the same tables, and tests check them against explicit masks.

Layouts of S tokens over N ranks:
  contiguous: rank r holds block r, positions [r S/N, (r+1) S/N).
  zigzag (head-tail): the sequence is cut into 2N chunks of S/(2N); rank r
    holds chunks r and 2N-1-r, one early and one late, so under a causal mask
    every rank has the same amount of work.
Ring order: queries stay; at step t = 0..N-1 rank r holds the K, V block that
started on rank (r - t) mod N, having received it from rank r-1.
Work is counted exactly, in query-key element pairs (per sequence and head):
a pair (i, j) is computed when j <= i under a causal mask, always otherwise.
A (rank, step) with zero pairs is skipped under a causal mask. In the uniform
ring its block still travels on to r+1; `block_reach` says how far each block
must go at least, which is what the pruned ring (pruned.py) sends.
"""
from __future__ import annotations

from bisect import bisect_right

from wmdist.costs.ring_attention import LAYOUTS, Layout
from wmdist.costs.validate import require_bool, require_choice, require_int


def check_layout(seq_len: int, world_size: int, *, layout: Layout) -> tuple[int, int, Layout]:
    """Validate (S, N, layout) and return them; ValueError says which requirement failed.

    Every rank needs at least one token (N <= S), contiguous needs N | S,
    zigzag needs 2N | S (two equal chunks per rank).
    """
    s = require_int("seq_len", seq_len, 1)
    n = require_int("world_size", world_size, 1)
    layout = require_choice("layout", layout, LAYOUTS)
    if n > s:
        raise ValueError(f"world_size must be <= seq_len (each rank needs a token), got world_size={n}, seq_len={s}")
    parts = n if layout == "contiguous" else 2 * n
    if s % parts:
        raise ValueError(f"seq_len must be divisible by {parts} for the {layout} layout on {n} ranks "
                         f"({'one block' if layout == 'contiguous' else 'two chunks'} per rank), got seq_len={s}")
    return s, n, layout


def rank_positions(seq_len: int, world_size: int, rank: int, *, layout: Layout) -> list[int]:
    """Global token positions rank `rank` holds, in increasing order (S/N of them)."""
    s, n, layout = check_layout(seq_len, world_size, layout=layout)
    r = require_int("rank", rank, 0, high=n - 1)
    if layout == "contiguous":
        c = s // n
        return list(range(r * c, (r + 1) * c))
    h = s // (2 * n)
    return list(range(r * h, (r + 1) * h)) + list(range((2 * n - 1 - r) * h, (2 * n - r) * h))


def ring_source(rank: int, step: int, world_size: int) -> int:
    """Rank whose K, V block rank `rank` holds at ring step `step`: (rank - step) mod N."""
    n = require_int("world_size", world_size, 1)
    return (require_int("rank", rank, 0, high=n - 1) - require_int("step", step, 0, high=n - 1)) % n


def pair_count(q_positions: list[int], k_positions: list[int], *, causal: bool) -> int:
    """Query-key pairs computed between two sets of positions: all of them, or those with key <= query if causal."""
    if not require_bool("causal", causal):
        return len(q_positions) * len(k_positions)
    keys = sorted(k_positions)
    return sum(bisect_right(keys, i) for i in q_positions)


def step_work(seq_len: int, world_size: int, *, layout: Layout, causal: bool) -> list[list[int]]:
    """work[r][t]: query-key pairs rank r computes at ring step t (per sequence and head).

    Each row sums to that rank's total; all entries together are S^2, or
    S(S+1)/2 with a causal mask, whatever the layout.
    """
    s, n, layout = check_layout(seq_len, world_size, layout=layout)
    held = [rank_positions(s, n, r, layout=layout) for r in range(n)]
    return [[pair_count(held[r], held[ring_source(r, t, n)], causal=causal) for t in range(n)] for r in range(n)]


def rank_work(seq_len: int, world_size: int, *, layout: Layout, causal: bool) -> list[int]:
    """Query-key pairs each rank computes over the whole ring.

    Causal, contiguous: rank r does r c^2 + c(c+1)/2 with c = S/N, so rank 0
    least and the last rank most (N-1 full blocks plus its diagonal
    block). Causal, zigzag: every rank does 2N h^2 + h with h = S/(2N).
    """
    return [sum(row) for row in step_work(seq_len, world_size, layout=layout, causal=causal)]


def skipped_steps(seq_len: int, world_size: int, *, layout: Layout) -> list[tuple[int, int]]:
    """(rank, step) pairs whose K, V block lies entirely in the rank's future under a causal mask.

    Contiguous: rank r skips steps t > r (blocks from ranks after it), so
    N(N-1)/2 of the N^2 steps. Zigzag: none, every block meets the rank's
    late chunk. In the uniform ring skipped blocks still travel on; each skipped
    step is one dead send (block_reach).
    """
    work = step_work(seq_len, world_size, layout=layout, causal=True)
    return [(r, t) for r, row in enumerate(work) for t, w in enumerate(row) if w == 0]


def tile_pairs(seq_len: int, world_size: int, *, layout: Layout, block_size: int,
               causal: bool) -> list[list[int]]:
    """tiles[r][t]: score tiles rank r computes at step t, its queries and the visiting block cut in block_size rows.

    Both sides are cut in consecutive runs of block_size of the rank's own
    rows (the last shorter when block_size does not divide S/N); a tile whose
    keys all lie after its queries is skipped, the rule
    blockwise.block_is_future applies, so a rank's loop must count the same.
    """
    s, n, layout = check_layout(seq_len, world_size, layout=layout)
    b = require_int("block_size", block_size, 1, high=s // n)
    require_bool("causal", causal)
    held = [rank_positions(s, n, r, layout=layout) for r in range(n)]
    cuts = [[pos[i:i + b] for i in range(0, len(pos), b)] for pos in held]

    def live(q: list[int], k: list[int]) -> bool:
        return not causal or min(k) <= max(q)

    return [[sum(live(q, k) for q in cuts[r] for k in cuts[ring_source(r, t, n)]) for t in range(n)]
            for r in range(n)]


def block_reach(seq_len: int, world_size: int, *, layout: Layout, causal: bool) -> list[int]:
    """reach[s]: ring hops block s must make, up to the last rank along the ring whose queries see one of its keys.

    Block s sits on rank (s + t) mod N after t hops. It has to travel as far
    as the LAST such rank with work on it (a rank in between with none would
    still relay it); beyond that every send is dead. Full attention and
    zigzag: N-1 for every block, nothing to prune. Contiguous causal: N-1-s,
    the block stops at the last rank, so N(N-1)/2 of the N(N-1) sends of the
    uniform ring carry a block nobody downstream reads.
    """
    work = step_work(seq_len, world_size, layout=layout, causal=causal)
    n = len(work)
    return [max(t for t in range(n) if work[(s + t) % n][t] > 0) for s in range(n)]
