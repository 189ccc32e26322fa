"""Ring collectives: exact bytes, rounds and messages per rank, and the alpha-beta time model.

Chunks follow torch.tensor_split's layout (`ring_chunk_sizes`), so lengths
that N does not divide are counted exactly; the ledger must measure the same
integers.
"""
from __future__ import annotations

from wmdist.costs.validate import require_int, require_real


def ring_chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Element counts of the N ring chunks of a flat tensor of `numel` elements.

    The first numel % N chunks hold one extra element (torch.tensor_split's
    layout), so lengths that N does not divide are handled exactly.
    """
    numel = require_int("numel", numel, 0)
    world_size = require_int("world_size", world_size, 1)
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def nonempty_split(total: int, parts: int, *, total_name: str, parts_name: str, what: str,
                   refusal: str | None = None) -> list[int]:
    """Sizes of `parts` consecutive parts of `total` items, none empty; the first total % parts get one more.

    torch.tensor_split's layout (costs.ring_chunk_sizes), for a split whose
    every part must hold at least one `what`: parts > total is refused, naming
    both arguments (`refusal`, formatted with total= and parts=, says it in the
    caller's words). Time chunks (costs/scan.py) and the pipeline's stages and
    microbatches (pipeline/plan.py) are all cut this way.
    """
    total = require_int(total_name, total, 1)
    parts = require_int(parts_name, parts, 1)
    if parts > total and refusal is not None:
        raise ValueError(refusal.format(total=total, parts=parts))
    if parts > total:
        raise ValueError(f"{parts_name} must be <= {total_name} (every part needs at least one {what}), "
                         f"got {parts_name}={parts}, {total_name}={total}")
    return ring_chunk_sizes(total, parts)


def ring_chunk_size(numel: int, world_size: int, index: int) -> int:
    """Element count of chunk `index` alone: ring_chunk_sizes(numel, world_size)[index] in closed form.

    Builds no list, so a world of 10**12 ranks (the memory calculator's dp)
    costs what a world of 2 does.
    """
    numel = require_int("numel", numel, 0)
    world_size = require_int("world_size", world_size, 1)
    i = require_int("index", index, 0, high=world_size - 1)
    base, extra = divmod(numel, world_size)
    return base + (1 if i < extra else 0)


def ring_reduce_scatter_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Bytes rank `rank` sends in a ring reduce-scatter that leaves chunk r on rank r.

    In each of the N-1 rounds a rank forwards one partial chunk; over the
    rounds it sends every chunk except its own, i.e. G - |chunk_r|.
    """
    n = require_int("world_size", world_size, 1)
    own = ring_chunk_size(numel, n, require_int("rank", rank, 0, high=n - 1))
    return 0 if n == 1 else (numel - own) * elem_size


def ring_all_gather_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Bytes rank `rank` sends in a ring all-gather starting from chunk r on rank r.

    It forwards every chunk except the one its right neighbour owns:
    G - |chunk_{r+1}|.
    """
    n = require_int("world_size", world_size, 1)
    right = ring_chunk_size(numel, n, (require_int("rank", rank, 0, high=n - 1) + 1) % n)
    return 0 if n == 1 else (numel - right) * elem_size


def ring_allreduce_bytes(numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> int:
    """Exact bytes one rank sends in a ring all-reduce (reduce-scatter + all-gather).

    Equals 2(N-1)G/N when N divides the length; otherwise the true chunk sizes
    decide, and ranks differ by at most a few elements.
    """
    return (ring_reduce_scatter_bytes(numel, world_size, rank, elem_size=elem_size)
            + ring_all_gather_bytes(numel, world_size, rank, elem_size=elem_size))


def ring_allreduce_ideal_bytes(payload_bytes: float, world_size: int) -> float:
    """The text's per-rank volume 2(N-1)G/N for a payload of G bytes."""
    g = require_real("payload_bytes", payload_bytes)
    n = require_int("world_size", world_size, 1)
    return 2 * (n - 1) * g / n


def ring_allreduce_rounds(world_size: int) -> int:
    """Communication rounds of a ring all-reduce: N-1 per phase, two phases."""
    return 2 * (require_int("world_size", world_size, 1) - 1)


# How the hand-written ring (wmdist.comm.ring) cuts each chunk for the wire: None sends each chunk as one
# message, an int cuts it into pieces of at most that many bytes (ceil(|chunk| / piece) messages), so
# that adding one piece overlaps receiving the next. The default is what measured fastest against gloo
# (issue 35 §4; median of paired gloo/ring time ratios, 4 ranks on this 2-core machine while it was
# loaded, 1-min load 10-25, 6 runs x 41 pairs each): at 16 MiB, uncut 1.00x, 2 MiB pieces 0.96x,
# 1 MiB 0.83x, 512 KiB 0.83x; with the variants' order rotated, uncut 1.01x, 2 MiB 1.01x, 1 MiB
# 0.98x; at 64 MiB uncut 0.48-0.50x, every cut size lower (0.27-0.44x). Each message costs a rank
# about 20 us of CPU (Python, gloo's rendezvous, a wake-up), and with more ranks than cores no core
# sits idle for the overlap to use, so cutting paid for itself at no size measured. What made the
# ring faster (0.87-0.92x before, same runs) is that its receives wait before the left neighbour
# sends (comm/ring_rounds.py). With cores to spare, try pieces: `chunk_bytes=` on every ring function.
DEFAULT_RING_CHUNK_BYTES: int | None = None


def ring_chunk_elems(chunk_bytes: int | None, *, elem_size: int = 4) -> int | None:
    """Elements in one ring piece of at most `chunk_bytes` bytes (at least one element); None: no cutting."""
    if chunk_bytes is None:
        return None
    chunk_bytes = require_int("chunk_bytes", chunk_bytes, 1)
    return max(1, chunk_bytes // require_int("elem_size", elem_size, 1))


def ring_pieces(numel: int, chunk_elems: int | None) -> int:
    """Messages a ring segment of `numel` elements travels as: ceil(numel / chunk_elems), at least one.

    The pieces are torch.tensor_split(segment, this many), so they differ by
    at most one element and none is empty unless the segment is (an empty
    segment is still sent, as one empty message). None: the whole segment.
    """
    numel = require_int("numel", numel, 0)
    if chunk_elems is None:
        return 1
    return max(1, -(-numel // require_int("chunk_elems", chunk_elems, 1)))


def _pieces_of_all_segments(numel: int, n: int, chunk_elems: int | None) -> int:
    """Sum of ring_pieces over the N segments, in closed form (they have only two sizes)."""
    base, extra = divmod(numel, n)
    return extra * ring_pieces(base + 1, chunk_elems) + (n - extra) * ring_pieces(base, chunk_elems)


def ring_reduce_scatter_messages(numel: int, world_size: int, rank: int, *,
                                 chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES, elem_size: int = 4) -> int:
    """Messages rank `rank` sends in a ring reduce-scatter: the pieces of every segment but its own.

    N-1 when no segment is cut (chunk_bytes None, or segments of at most one piece).
    """
    n = require_int("world_size", world_size, 1)
    e = ring_chunk_elems(chunk_bytes, elem_size=elem_size)
    own = ring_chunk_size(numel, n, require_int("rank", rank, 0, high=n - 1))
    return 0 if n == 1 else _pieces_of_all_segments(numel, n, e) - ring_pieces(own, e)


def ring_all_gather_messages(numel: int, world_size: int, rank: int, *,
                             chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES, elem_size: int = 4) -> int:
    """Messages rank `rank` sends in a ring all-gather: the pieces of every segment but its right neighbour's."""
    n = require_int("world_size", world_size, 1)
    e = ring_chunk_elems(chunk_bytes, elem_size=elem_size)
    right = ring_chunk_size(numel, n, (require_int("rank", rank, 0, high=n - 1) + 1) % n)
    return 0 if n == 1 else _pieces_of_all_segments(numel, n, e) - ring_pieces(right, e)


def ring_allreduce_messages(numel: int, world_size: int, rank: int, *,
                            chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES, elem_size: int = 4) -> int:
    """Messages one rank sends in a ring all-reduce: 2(N-1)C when every segment is cut into C pieces.

    Cutting changes the count of messages only: the bytes stay
    ring_allreduce_bytes, and the rounds (ledger records) stay 2(N-1).
    """
    return (ring_reduce_scatter_messages(numel, world_size, rank, chunk_bytes=chunk_bytes, elem_size=elem_size)
            + ring_all_gather_messages(numel, world_size, rank, chunk_bytes=chunk_bytes, elem_size=elem_size))


def allreduce_time(world_size: int, alpha: float, beta: float, payload_bytes: float) -> float:
    """T(N) = 2(N-1)a + 2(N-1)/N bG: rounds times latency plus bytes times cost.

    T(1) = 0: a single worker has nothing to synchronize. Ignores reduction
    arithmetic, contention and overlap with compute, as the text says.
    """
    latency, transfer = allreduce_terms(world_size, alpha, beta, payload_bytes)
    return latency + transfer


def allreduce_terms(world_size: int, alpha: float, beta: float, payload_bytes: float) -> tuple[float, float]:
    """The latency term 2(N-1)a and the byte term 2(N-1)/N bG of T(N), separately."""
    n = require_int("world_size", world_size, 1)
    a = require_real("alpha", alpha)
    b = require_real("beta", beta)
    g = require_real("payload_bytes", payload_bytes)
    return 2 * (n - 1) * a, 2 * (n - 1) / n * b * g
