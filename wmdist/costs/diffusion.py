"""What distributing a diffusion or flow sampler costs: bytes per step, hand-offs, Picard work.

Three ways to use N ranks on a K-step sampler, each with its own bill:

- Shard the tokens of every step (exact, steps stay in order): attention
  needs every token's keys and values, so each attention layer of each step
  all-gathers them; everything else is token-wise and local.
- Put successive steps on different ranks: each step needs the whole state
  the previous one produced, so every change of rank is a point-to-point
  transfer of the state (not a collective). For one sample the ranks work one
  after another; only several samples in flight keep more than one busy.
- Picard iteration over the steps: evaluations that were a chain become
  rounds of independent evaluations; it converges to the sequential sample
  but spends more evaluations than the K the sequential sampler needs.

Token shards follow torch.tensor_split's layout (`ring_chunk_sizes`), so token
counts that N does not divide are counted exactly.
"""
from __future__ import annotations

from itertools import pairwise

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.validate import require_int


def token_shard_bounds(tokens: int, world_size: int) -> list[tuple[int, int]]:
    """[start, stop) of the tokens rank r holds: contiguous, torch.tensor_split's layout."""
    bounds, start = [], 0
    for size in ring_chunk_sizes(require_int("tokens", tokens, 1), require_int("world_size", world_size, 1)):
        bounds.append((start, start + size))
        start += size
    return bounds


def token_all_gather_bytes(batch: int, tokens: int, token_elems: int, world_size: int, rank: int, *,
                           elem_size: int = 4, layers: int = 1) -> dict[str, int]:
    """Bytes rank `rank` sends and receives per solver step when each attention layer all-gathers by token.

    Each layer gathers `token_elems` numbers per token and sample: 2 * D for
    the keys and values (what `Denoiser.project_kv` returns), or C to gather
    x itself and recompute K and V locally (cheaper on the wire when C < 2D,
    but only possible for the first layer). With a ring all-gather over the
    token shards, a rank receives every token but its own and forwards every
    token but its right neighbour's (which that neighbour already holds):

        recv = (S - s_r) * B * E * elem_size,   sent = (S - s_{r+1}) * B * E * elem_size

    per layer, with s_r the size of rank r's shard.
    """
    b = require_int("batch", batch, 1)
    e = require_int("token_elems", token_elems, 1)
    size = require_int("elem_size", elem_size, 1)
    n_layers = require_int("layers", layers, 0)
    sizes = ring_chunk_sizes(require_int("tokens", tokens, 1), require_int("world_size", world_size, 1))
    require_int("rank", rank, 0, high=world_size - 1)
    per_token = b * e * size * n_layers
    return {"sent": (tokens - sizes[(rank + 1) % world_size]) * per_token,
            "recv": (tokens - sizes[rank]) * per_token}


def token_all_gather_rounds(world_size: int, *, layers: int = 1) -> int:
    """Ring rounds per solver step: N-1 per attention layer (K and V travel together)."""
    return (require_int("world_size", world_size, 1) - 1) * require_int("layers", layers, 0)


def boundary_transfer_bytes(batch: int, tokens: int, channels: int, *, elem_size: int = 4) -> int:
    """Bytes of one hand-off between steps on different ranks: the whole state, B * S * C * elem_size.

    The next step reads every token of the state, so all of it moves, once,
    point to point, from the rank that computed it to the one that continues.
    """
    return (require_int("batch", batch, 1) * require_int("tokens", tokens, 1)
            * require_int("channels", channels, 1) * require_int("elem_size", elem_size, 1))


def step_owners(steps: int, world_size: int) -> list[int]:
    """Which rank runs each solver step when the K steps are cut into N contiguous blocks."""
    sizes = ring_chunk_sizes(require_int("steps", steps, 1), require_int("world_size", world_size, 1))
    return [r for r, size in enumerate(sizes) for _ in range(size)]


def step_handoffs(steps: int, world_size: int) -> int:
    """Hand-offs of the state per sample with contiguous step blocks: min(K, N) - 1.

    One at every change of owner (the final sample is not sent anywhere).
    Each is a point-to-point transfer of `boundary_transfer_bytes`.
    """
    owners = step_owners(steps, world_size)
    return sum(a != b for a, b in pairwise(owners))


def sequential_evaluations(steps: int) -> int:
    """Denoiser evaluations of the sequential sampler: K, in K sequential rounds."""
    return require_int("steps", steps, 1)


def picard_evaluations(steps: int, iterations: int, *, window: int | None = None) -> list[int]:
    """Denoiser evaluations in each Picard iteration when only the guaranteed step settles per iteration.

    After iteration i, states 0..i are exact, and a velocity read from an
    exact state is kept; so iteration i evaluates steps i-1 .. K-1, at most
    `window` of them: min(w, K - i + 1). The loop ends after K iterations at
    the latest. Without a window the total for k iterations is
    k*K - k(k-1)/2, i.e. K(K+1)/2 for the full K: (K+1)/2 times the
    sequential work, paid for fewer sequential rounds only when the error
    is small enough long before iteration K.
    """
    k_total = require_int("steps", steps, 1)
    rounds = min(require_int("iterations", iterations, 1), k_total)
    width = k_total if window is None else require_int("window", window, 1)
    return [min(width, k_total - i + 1) for i in range(1, rounds + 1)]


def picard_rounds(steps: int, iterations: int) -> int:
    """Sequential rounds of Picard iteration: one per iteration, never more than K."""
    return min(require_int("iterations", iterations, 1), require_int("steps", steps, 1))


def step_split_slots(steps: int, world_size: int, *, samples: int = 1) -> int:
    """Evaluation slots from the first step to the last sample when steps sit in contiguous blocks on ranks.

    Samples stream through the ranks like microbatches through pipeline
    stages: rank r spends b_r slots per sample (its block of steps), so the
    last sample finishes after sum_r b_r + (M - 1) * max_r b_r slots (hand-offs
    taken as free). For one sample that is K: no faster than one rank.
    """
    m = require_int("samples", samples, 1)
    blocks = [b for b in ring_chunk_sizes(require_int("steps", steps, 1), require_int("world_size", world_size, 1)) if b]
    return sum(blocks) + (m - 1) * max(blocks)


def batched_slots(steps: int, world_size: int, samples: int) -> int:
    """Evaluation slots when whole samples are spread over ranks: ceil(M / N) samples per rank, K steps each."""
    n = require_int("world_size", world_size, 1)
    return -(-require_int("samples", samples, 1) // n) * require_int("steps", steps, 1)


def cyclic_step_counts(lo: int, hi: int, world_size: int) -> list[int]:
    """Steps of [lo, hi) each rank evaluates when step j lives on rank j mod N (balanced within one)."""
    n = require_int("world_size", world_size, 1)
    lo = require_int("lo", lo, 0)
    hi = require_int("hi", hi, lo)
    return [len(range(lo + (r - lo) % n, hi, n)) for r in range(n)]


def picard_gather_bytes(lo: int, hi: int, world_size: int, rank: int, state_elems: int, *,
                        elem_size: int = 4) -> dict[str, int]:
    """Bytes rank `rank` sends and receives to share one Picard round's velocities (steps lo..hi-1).

    Every rank rebuilds the whole trajectory (the running sum needs every
    velocity), so the round's new velocities are all-gathered: a ring over
    chunks of c_r = (steps rank r evaluated) * state_elems numbers, which
    sends all chunks but the right neighbour's and receives all but its own.
    """
    counts = cyclic_step_counts(lo, hi, world_size)
    require_int("rank", rank, 0, high=world_size - 1)
    per_step = require_int("state_elems", state_elems, 1) * require_int("elem_size", elem_size, 1)
    total = sum(counts)
    if world_size == 1:
        return {"sent": 0, "recv": 0}
    return {"sent": (total - counts[(rank + 1) % world_size]) * per_step, "recv": (total - counts[rank]) * per_step}


def picard_critical_path(evaluations: list[int], world_size: int) -> int:
    """Evaluation slots on the busiest rank, summed over Picard rounds: sum_i ceil(e_i / N).

    The sequential sampler needs K slots. Picard pays only when this is
    smaller, i.e. when few rounds suffice and N is close to the evaluations
    per round.
    """
    n = require_int("world_size", world_size, 1)
    return sum(-(-require_int("evaluations", e, 0) // n) for e in evaluations)
