"""Ring collectives: exact bytes and rounds per rank, and the alpha-beta time model.

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
