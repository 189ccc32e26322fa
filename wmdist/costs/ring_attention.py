"""Ring attention: KV bytes each rank sends, attention FLOPs, memory per rank, and when sends hide under compute.

Conventions (every function below uses them):
  S tokens in one sequence, split over N ranks in blocks of S/N tokens
  (wmdist.ring_attention.layout decides which tokens; the counts here do not
  depend on it). `kv_width` (d_KV) is the combined key + value width per
  token: 2 * kv_heads * head_dim for standard multi-head attention. `batch`
  sequences travel together. Sizes are exact integers in bytes.
  FLOPs count a multiply-add as 2 FLOPs and only the two matrix products:
  QK^T (head_dim multiply-adds per query-key pair) and PV (head_dim per pair),
  so 4 * head_dim FLOPs per pair and head. Softmax, scaling and masking are
  O(S^2) too but not counted.
Causal pruning and the backward pass have their own accounting. In the
uniform ring, skipping an all-future block saves its FLOPs, not its bytes:
every block goes N-1 hops. The PRUNED ring (contiguous layout, causal) stops
a block after the last rank that reads it, so rank r sends unequal counts
(pruned_kv_sends, pruned_grad_sends) and half of the uniform ring's sends go
(dead_kv_sends); zigzag has no dead send. The backward ring circulates K, V
again and carries the gradients dK, dV to their owners
(ring_backward_bytes_per_rank, pruned_ring_bytes_per_rank).
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal, get_args

from wmdist.costs.validate import require_bool, require_choice, require_int, require_positive, require_real

Layout = Literal["contiguous", "zigzag"]    # which tokens a rank holds (wmdist.ring_attention.layout)
LAYOUTS: tuple[Layout, ...] = get_args(Layout)


def _block_tokens(seq_len: int, world_size: int) -> int:
    s = require_int("seq_len", seq_len, 1)
    n = require_int("world_size", world_size, 1)
    if s % n:
        raise ValueError(f"seq_len must be divisible by world_size (one block of S/N tokens per rank), "
                         f"got seq_len={s}, world_size={n}")
    return s // n


def ring_kv_sends(world_size: int, *, final_exchange: bool = False) -> int:
    """KV block sends per rank in one forward sweep: N-1, or N for a loop that also sends after the last step.

    N-1 sends bring every other rank's block past a rank once. The loop in the
    Ring Attention paper's appendix sends after every one of its N steps,
    including the last (which returns blocks to their owners); with N = 1 that
    is a send to itself. Count what the implementation you measure does.
    """
    n = require_int("world_size", world_size, 1)
    return n if require_bool("final_exchange", final_exchange) else n - 1


def kv_block_bytes(seq_len: int, world_size: int, kv_width: int, *, batch: int = 1, elem_size: int = 4) -> int:
    """Bytes of one rank's K and V block: (S/N) * d_KV * batch * elem_size."""
    c = _block_tokens(seq_len, world_size)
    return c * require_int("kv_width", kv_width, 1) * require_int("batch", batch, 1) \
        * require_int("elem_size", elem_size, 1)


def ring_kv_bytes_per_rank(seq_len: int, world_size: int, kv_width: int, *, batch: int = 1, elem_size: int = 4,
                           final_exchange: bool = False) -> int:
    """KV bytes one rank sends in the forward ring: (N-1) (S/N) d_KV batch elem_size (N sends with the final exchange).

    Linear in S for fixed N, while attention arithmetic is quadratic: the two
    are different quantities. Causal skipping does not reduce it in this uniform ring
    (the pruned one, pruned_ring_bytes_per_rank, drops the dead sends).
    """
    return ring_kv_sends(world_size, final_exchange=final_exchange) * kv_block_bytes(
        seq_len, world_size, kv_width, batch=batch, elem_size=elem_size)


def ring_grad_sends(world_size: int, *, every_step: bool = False) -> int:
    """dK, dV sends per rank in the backward ring: N-1, or N when a rank sends after every step (torch's template).

    N-1: a block's partial gradient sum starts on the rank after its owner,
    travels one step behind the block, and its last hop lands on the owner.
    torch's template passes the sum on after every one of the N steps, the
    last send delivering it home; it does so on one rank too (an
    all_to_all_single with itself).
    """
    n = require_int("world_size", world_size, 1)
    return n if require_bool("every_step", every_step) else n - 1


def ring_backward_bytes_per_rank(seq_len: int, world_size: int, kv_width: int, *, batch: int = 1,
                                 elem_size: int = 4, every_step: bool = False) -> tuple[int, int]:
    """(K, V bytes, dK, dV bytes) a rank sends in the backward ring: N-1 K, V blocks again, N-1 (or N) gradient blocks.

    dK, dV have the shapes of K, V, so each gradient message is one KV block
    (in the dtype the gradients are summed in).
    """
    block = kv_block_bytes(seq_len, world_size, kv_width, batch=batch, elem_size=elem_size)
    return ring_kv_sends(world_size) * block, ring_grad_sends(world_size, every_step=every_step) * block


def dead_kv_sends(world_size: int, *, layout: Layout, causal: bool = True) -> int:
    """Forward K, V sends of the uniform ring (N(N-1) in all) whose block no later rank on its way reads.

    Contiguous and causal: block s is read by ranks s..N-1 only, so of its
    N-1 hops the last s (to ranks 0..s-1) are dead: N(N-1)/2 over all s.
    Zigzag, or no mask: every rank reads every block, none is dead.
    """
    n = require_int("world_size", world_size, 1)
    require_choice("layout", layout, LAYOUTS)
    return n * (n - 1) // 2 if require_bool("causal", causal) and layout == "contiguous" else 0


def pruned_kv_sends(world_size: int, rank: int) -> int:
    """K, V sends of rank r in one sweep of the pruned causal ring (contiguous layout): r+1, and 0 on the last rank.

    Rank r holds blocks r, r-1, ..., 0 at steps 0..r, and its right
    neighbour reads all of them, so it forwards each; the last rank's blocks
    are read by nobody after it. Sum over ranks: N(N-1)/2. The busiest
    sender, rank N-2, still sends N-1 blocks, as every rank of the uniform ring does.
    """
    n = require_int("world_size", world_size, 1)
    r = require_int("rank", rank, 0, high=n - 1)
    return r + 1 if r < n - 1 else 0


def pruned_grad_sends(world_size: int, rank: int) -> int:
    """dK, dV sends of rank r in the pruned ring's backward: r, one per visiting block it holds.

    A block's partial sum trails the block one step behind, as in the uniform
    ring; the last rank (N-1) sends each finished sum straight to its owner
    instead of around the ring. Sum over ranks: N(N-1)/2.
    """
    n = require_int("world_size", world_size, 1)
    return require_int("rank", rank, 0, high=n - 1)


def pruned_ring_bytes_per_rank(seq_len: int, world_size: int, kv_width: int, *, batch: int = 1,
                               elem_size: int = 4) -> list[tuple[int, int, int]]:
    """Per rank: (forward K, V bytes, backward K, V bytes, backward dK, dV bytes) of the pruned causal ring.

    Each message is one K, V block (kv_block_bytes); the backward K, V sweep
    is pruned exactly as the forward one.
    """
    block = kv_block_bytes(seq_len, world_size, kv_width, batch=batch, elem_size=elem_size)
    kv = [pruned_kv_sends(world_size, r) * block for r in range(world_size)]
    return [(b, b, pruned_grad_sends(world_size, r) * block) for r, b in enumerate(kv)]


def ring_kv_storage_bytes(seq_len: int, world_size: int, kv_width: int, *, batch: int = 1, elem_size: int = 4,
                          blocks: int = 2) -> int:
    """KV bytes a rank holds at once: `blocks` blocks of S/N tokens (2: the one in use and the one arriving).

    A rank that overlaps computes on one block while the next arrives; with
    blocking sends one block (plus the send buffer of the same size) suffices.
    Independent of N beyond S/N: adding ranks shrinks it.
    """
    return require_int("blocks", blocks, 1) * kv_block_bytes(seq_len, world_size, kv_width, batch=batch,
                                                               elem_size=elem_size)


def attention_pairs(seq_len: int, *, causal: bool) -> int:
    """Query-key pairs one sequence and head computes: S^2, or S(S+1)/2 under a causal mask (key j <= query i)."""
    s = require_int("seq_len", seq_len, 1)
    return s * (s + 1) // 2 if require_bool("causal", causal) else s * s


def attention_flops(seq_len: int, head_dim: int, *, heads: int = 1, batch: int = 1, causal: bool = False) -> int:
    """Forward attention FLOPs in total (all ranks together): 4 * head_dim per query-key pair, per head and sequence.

    Non-causal: 4 S^2 d H B. Causal: 4 d H B S(S+1)/2, i.e. half plus the
    diagonal, counting only pairs that are computed. Ring attention divides
    this work over ranks; it does not make it less than quadratic.
    """
    return (4 * require_int("head_dim", head_dim, 1) * require_int("heads", heads, 1)
            * require_int("batch", batch, 1) * attention_pairs(seq_len, causal=causal))


def score_tile_bytes(block_q: int, block_k: int, *, heads: int = 1, batch: int = 1, elem_size: int = 4) -> int:
    """Bytes of one temporary score tile: batch * heads * block_q * block_k * elem_size.

    Blockwise attention keeps a small fixed number of such tiles alive at once
    (wmdist.ring_attention.blockwise measures it), independent of S.
    """
    return (require_int("block_q", block_q, 1) * require_int("block_k", block_k, 1)
            * require_int("heads", heads, 1) * require_int("batch", batch, 1) * require_int("elem_size", elem_size, 1))


def full_scores_bytes(seq_len: int, *, heads: int = 1, batch: int = 1, elem_size: int = 4) -> int:
    """Bytes of the full S x S score matrix that unblocked attention materializes."""
    s = require_int("seq_len", seq_len, 1)
    return score_tile_bytes(s, s, heads=heads, batch=batch, elem_size=elem_size)


def block_pair_flops(block_size: int, hidden: int) -> int:
    """The paper's compute per step: 4 d c^2 FLOPs for one query block against one K, V block of c tokens, width d."""
    c = require_int("block_size", block_size, 1)
    return 4 * require_int("hidden", hidden, 1) * c * c


def kv_step_bytes(block_size: int, hidden: int, *, elem_size: int = 4) -> int:
    """The paper's communication per step: the next K and V blocks, 2 c d elements (4 c d bytes in bf16)."""
    return 2 * require_int("block_size", block_size, 1) * require_int("hidden", hidden, 1) \
        * require_int("elem_size", elem_size, 1)


def min_overlap_block_size(flops_per_s: float, link_bytes_per_s: float, *, elem_size: int = 4) -> int:
    """Smallest block c (tokens per rank) for which computing a step takes at least as long as sending the next K, V.

    4 d c^2 / F >= 2 c d e / B  <=>  c >= e F / (2 B), which is F / B for
    bf16 (e = 2): the width d cancels. Computed exactly on the given floats,
    so a ratio that is an integer is not rounded up by float error. Assumes
    perfect overlap, peak F and B, and no other traffic on the link.
    """
    f = Fraction(require_positive("flops_per_s", flops_per_s))
    b = Fraction(require_positive("link_bytes_per_s", link_bytes_per_s))
    return max(1, math.ceil(require_int("elem_size", elem_size, 1) * f / (2 * b)))


def min_overlap_seq_len(flops_per_s: float, link_bytes_per_s: float, world_size: int, *, elem_size: int = 4) -> int:
    """Shortest total context S = c N at which each of N ranks has a block large enough to hide its sends."""
    return require_int("world_size", world_size, 1) * min_overlap_block_size(flops_per_s, link_bytes_per_s,
                                                                             elem_size=elem_size)


def lse_rounding_bound(head_dim: int, block_keys: int, key_blocks: int, score_abs: float, exponent_range: float,
                       lse_abs: float, unit_roundoff: float, *, exp_ulps: float = 1.0) -> float:
    """First-order bound on |computed - exact| of a row's log-sum-exp, blockwise with online merges.

    Terms (u = unit_roundoff, x = 2 exp_ulps: a math call off by exp_ulps
    ulps errs by at most x u relative):
      scores: a D-term dot product and a scale, (D+1) u |q||k| <= (D+1) u A;
      one tile's logsumexp over n keys: exponent shift u R, exp x u, the sum
        (n-1) u, the log x u ln n, adding the max u M;
      each of K-1 merges (logaddexp): u R + 2 x u + u M.
    A = `score_abs` bounds scale * sum_d |q_d k_d|; R = `exponent_range`
    bounds lse - score over unmasked keys; M = `lse_abs` bounds |lse| and
    |score| of unmasked keys. Any order of the sums is covered.
    """
    d = require_int("head_dim", head_dim, 1)
    n = require_int("block_keys", block_keys, 1)
    k = require_int("key_blocks", key_blocks, 1)
    a = require_real("score_abs", score_abs)
    r = require_real("exponent_range", exponent_range)
    m = require_real("lse_abs", lse_abs)
    u = require_positive("unit_roundoff", unit_roundoff)
    x = 2 * require_positive("exp_ulps", exp_ulps)
    return u * ((d + 1) * a + (r + x + n - 1 + x * math.log(n) + m) + (k - 1) * (r + 2 * x + m))


def weight_rounding_bound(head_dim: int, block_keys: int, key_blocks: int, score_abs: float, exponent_range: float,
                          lse_abs: float, unit_roundoff: float, *, exp_ulps: float = 1.0) -> float:
    """First-order bound E on the relative error of each softmax weight as blockwise attention applies it.

    The output of a row then errs by at most E * sum_j p_j |v_j| (per
    column). E adds to the lse bound: the score's own error (D+1) u A, the
    tile's exp(score - lse) u (R + x), each of K-1 merges reweighting and
    adding u (R + x + 2), and a tile's n-term product with V, n u. Arguments
    as in lse_rounding_bound. Terms of order E^2 are dropped: check E << 1.
    """
    lse = lse_rounding_bound(head_dim, block_keys, key_blocks, score_abs, exponent_range, lse_abs,
                             unit_roundoff, exp_ulps=exp_ulps)
    u, x, r = unit_roundoff, 2 * exp_ulps, exponent_range
    return lse + u * ((head_dim + 1) * score_abs + (r + x) + (key_blocks - 1) * (r + x + 2) + block_keys)
