"""Four all-reduce algorithms: exact bytes and rounds per rank, and the alpha-beta time of each.

The ring's 2(N-1)G/N bytes per rank belong to the ring. The same sum can be built other ways:

    ring              reduce-scatter then all-gather around a ring (costs.collectives)
    tree              binomial tree: reduce to rank 0, then broadcast from it (whole vectors)
    halving-doubling  Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling
    direct            reduce-scatter by all-to-all, then all-gather directly (pairwise exchanges)

A *round* is one ledger record: a send, a receive or a paired send+receive (wmdist.comm.ledger).
Byte counts are exact for lengths N does not divide: chunks follow torch.tensor_split's layout
(`ring_chunk_sizes`), so the ledger must measure these very integers. The time model
(`model_rounds`, `model_bytes`, `algorithm_curves`) is the text's alpha-beta model applied to each:
a rank's round costs alpha plus beta times the larger of what it sends and receives in it, and the
busiest rank's rounds add up. Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, get_args

from wmdist.costs.collectives import ring_allreduce_bytes, ring_chunk_size, ring_chunk_sizes
from wmdist.costs.validate import require_choice, require_int, require_real

Algorithm = Literal["ring", "tree", "halving-doubling", "direct"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)


def _rank(world_size: int, rank: int) -> tuple[int, int]:
    n = require_int("world_size", world_size, 1)
    return n, require_int("rank", rank, 0, high=n - 1)


def tree_children(world_size: int, rank: int) -> int:
    """How many ranks send to `rank` in a binomial-tree reduce (and receive from it in the broadcast).

    Level k pairs rank r with r + 2^k when r's lowest k+1 bits are zero. So rank 0 has a child at
    every level with 2^k < N, ceil(log2 N) in all, and rank r > 0 has children r + 2^k for each
    2^k below its lowest set bit that stays inside the world.
    """
    n, r = _rank(world_size, rank)
    lowest = r & -r if r else 1 << (n - 1).bit_length()
    return sum(1 for k in range(lowest.bit_length() - 1) if r + (1 << k) < n)


def tree_allreduce_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Bytes `rank` sends in a binomial-tree all-reduce: G once up (unless it is the root), G to each child.

    Every message is the whole vector (the tree adds whole vectors), so a rank sends G times its number
    of tree edges: rank 0 sends ceil(log2 N) G, a leaf G. Unlike the ring, the ranks differ a lot.
    """
    n, r = _rank(world_size, rank)
    g = require_int("numel", numel, 0) * require_int("elem_size", elem_size, 1)
    return g * (tree_children(n, r) + (1 if r else 0))


def tree_allreduce_rounds(world_size: int, rank: int) -> int:
    """Rounds of `rank` in the tree: a receive per child and a send up, then a receive down and a send per
    child, 2(children + [rank > 0]); the root's 2 ceil(log2 N) is the longest."""
    n, r = _rank(world_size, rank)
    return 2 * (tree_children(n, r) + (1 if r else 0))


def halving_doubling_core(world_size: int) -> int:
    """p', the largest power of two <= N: the ranks that run recursive halving and doubling.

    When N is not a power of two, the first N - p' even ranks fold: each sends its whole vector to
    rank + 1 (which adds it) and sits out, then gets the finished sum back (as MPICH's Rabenseifner
    all-reduce does, src/mpi/coll/allreduce.c). That keeps every N runnable at the price of two more
    rounds and one extra G each way for the pairs. (MPICH's cost comment writes (2 floor(log2 N) + 2)
    alpha + (2(N-1)/N + 2) G beta; the halving runs on p' ranks, so model_bytes has 2(p'-1)/p'.)
    """
    return 1 << (require_int("world_size", world_size, 1).bit_length() - 1)


def halving_doubling_role(world_size: int, rank: int) -> tuple[Literal["folded", "partner", "core"], int | None]:
    """("folded", None) for a rank that sits out, else ("partner" | "core", its rank q among the p' core ranks)."""
    n, r = _rank(world_size, rank)
    extra = n - halving_doubling_core(n)
    if r < 2 * extra:
        return ("folded", None) if r % 2 == 0 else ("partner", r // 2)
    return "core", r - extra


def _block(sizes: Sequence[int], q: int, width: int) -> int:
    """Elements of the aligned block of `width` chunks that holds chunk q."""
    lo = q - q % width
    return sum(sizes[lo:lo + width])


def halving_doubling_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Bytes `rank` sends in Rabenseifner's all-reduce (with the fold when N is not a power of two).

    Over p' core ranks the vector is cut into p' chunks. Recursive halving: at distance m = p'/2, ...,
    1 core rank q keeps the half of its window holding chunk q and sends the other half to q XOR m;
    the halves it sends are disjoint and cover every chunk but its own, G - |chunk q| in all (the
    ring's reduce-scatter volume). Recursive doubling: at distance m = 1, 2, ..., p'/2 it sends its
    aligned block of m chunks, sum_m |block_m(q)| = (p'-1)G/p' for equal chunks. A folding pair adds
    G: the even rank sends its vector in, its partner sends the sum back.
    """
    n, r = _rank(world_size, rank)
    g = require_int("numel", numel, 0)
    e = require_int("elem_size", elem_size, 1)
    if n == 1:
        return 0
    role, q = halving_doubling_role(n, r)
    if role == "folded":
        return g * e
    p = halving_doubling_core(n)
    sizes = ring_chunk_sizes(g, p)
    core = g - sizes[q] + sum(_block(sizes, q, 1 << k) for k in range(p.bit_length() - 1))
    return (core + (g if role == "partner" else 0)) * e


def halving_doubling_rounds(world_size: int, rank: int) -> int:
    """2 log2 p' exchanges for a core rank, 2 more (in and out) for a partner, 2 (a send, a receive) if folded."""
    n, r = _rank(world_size, rank)
    if n == 1:
        return 0
    role, _ = halving_doubling_role(n, r)
    core = 2 * (halving_doubling_core(n).bit_length() - 1)
    return {"folded": 2, "partner": core + 2, "core": core}[role]


def direct_allreduce_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Bytes `rank` sends in the direct all-reduce: G - |chunk r| + (N-1)|chunk r|.

    Reduce-scatter: rank r sends chunk j of its vector straight to rank j, every chunk but its own.
    All-gather: it sends its summed chunk r to each of the N-1 others. For equal chunks that is
    2(N-1)G/N, the ring's volume; only uneven chunks tell the two apart.
    """
    n, r = _rank(world_size, rank)
    g = require_int("numel", numel, 0)
    own = ring_chunk_size(g, n, r)
    return (g - own + (n - 1) * own) * require_int("elem_size", elem_size, 1)


def allreduce_bytes(algorithm: Algorithm, numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Exact bytes `rank` sends in `algorithm`'s all-reduce of `numel` elements."""
    fn = {"ring": ring_allreduce_bytes, "tree": tree_allreduce_bytes, "halving-doubling": halving_doubling_bytes,
          "direct": direct_allreduce_bytes}[require_choice("algorithm", algorithm, ALGORITHMS)]
    return fn(numel, world_size, rank, elem_size=elem_size)


def allreduce_rounds(algorithm: Algorithm, world_size: int, rank: int) -> int:
    """Exact rounds (ledger records) of `rank` in `algorithm`'s all-reduce: ring and direct 2(N-1) each."""
    n, r = _rank(world_size, rank)
    if require_choice("algorithm", algorithm, ALGORITHMS) in ("ring", "direct"):
        return 2 * (n - 1)
    return tree_allreduce_rounds(n, r) if algorithm == "tree" else halving_doubling_rounds(n, r)


# --- the alpha-beta model: the busiest rank, equal chunks -------------------------------------------

def model_rounds(algorithm: Algorithm, world_size: int) -> int:
    """Rounds of the busiest rank: ring, direct 2(N-1); tree 2 ceil(log2 N); halving-doubling 2 log2 p' (+2 folded)."""
    n = require_int("world_size", world_size, 1)
    if require_choice("algorithm", algorithm, ALGORITHMS) in ("ring", "direct"):
        return 2 * (n - 1)
    if algorithm == "tree":
        return 2 * (n - 1).bit_length()             # the root: ceil(log2 N) children, each twice
    p = halving_doubling_core(n)
    return 2 * (p.bit_length() - 1) + (2 if p != n else 0)


def model_bytes(algorithm: Algorithm, world_size: int, payload_bytes: float) -> float:
    """What the busiest rank's rounds move, each round counted at the larger of its send and its receive.

    Ring and direct: 2(N-1) rounds of G/N each way at once, 2(N-1)G/N. Tree: the root receives G from
    each child, then sends G to each, never both in one round: 2 ceil(log2 N) G (it *sends* half that).
    Halving-doubling: 2(p'-1)G/p', plus G in and G out on a folding partner. Zero at N = 1.
    """
    n = require_int("world_size", world_size, 1)
    g = require_real("payload_bytes", payload_bytes)
    if require_choice("algorithm", algorithm, ALGORITHMS) in ("ring", "direct"):
        return 2 * (n - 1) * g / n
    if algorithm == "tree":
        return 2 * (n - 1).bit_length() * g
    p = halving_doubling_core(n)
    return 2 * (p - 1) * g / p + (2 * g if p != n else 0.0)


def model_time(algorithm: Algorithm, world_size: int, alpha: float, beta: float, payload_bytes: float) -> float:
    """T = alpha x rounds + beta x bytes (model_rounds, model_bytes): for the ring, the text's T(N)."""
    a, b = require_real("alpha", alpha), require_real("beta", beta)
    return a * model_rounds(algorithm, world_size) + b * model_bytes(algorithm, world_size, payload_bytes)


@dataclass(frozen=True, kw_only=True)
class AlgorithmCurves:
    """Model times of every algorithm over payload sizes at one N: what the trade-off figure draws."""
    world_size: int
    alpha: float                                # s per round
    beta: float                                 # s per byte
    sizes: tuple[float, ...]                    # payload G, bytes
    times: dict[str, tuple[float, ...]]         # algorithm -> T at each size, s
    rounds: dict[str, int]                      # algorithm -> the busiest rank's rounds
    bytes_per_g: dict[str, float]               # algorithm -> model_bytes / G
    fastest: tuple[str, ...]                    # the fastest algorithm at each size (first on ties)

    def crossover(self, first: Algorithm, second: Algorithm) -> float | None:
        """G where `first` and `second` take equal time (fewer rounds vs fewer bytes); None if they never cross."""
        rounds = (self.rounds[first] - self.rounds[second]) * self.alpha
        per_byte = (self.bytes_per_g[second] - self.bytes_per_g[first]) * self.beta
        return rounds / per_byte if per_byte and rounds / per_byte > 0 else None


def algorithm_curves(world_size: int, alpha: float, beta: float, sizes: Sequence[float]) -> AlgorithmCurves:
    """Every algorithm's model time at each payload size on `world_size` ranks (pure; the figure only draws)."""
    n = require_int("world_size", world_size, 1)
    g = tuple(require_real("sizes", s) for s in sizes)
    times = {a: tuple(model_time(a, n, alpha, beta, s) for s in g) for a in ALGORITHMS}
    fastest = tuple(min(ALGORITHMS, key=lambda a: times[a][i]) for i in range(len(g)))
    return AlgorithmCurves(world_size=n, alpha=float(alpha), beta=float(beta), sizes=g, times=times,
                           rounds={a: model_rounds(a, n) for a in ALGORITHMS},
                           bytes_per_g={a: model_bytes(a, n, 1.0) for a in ALGORITHMS}, fastest=fastest)
