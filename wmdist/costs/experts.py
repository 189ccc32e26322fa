"""Mixture of experts and expert parallelism in closed form: capacity, drops, imbalance, all-to-all bytes (pure).

Words: T tokens, each routed to k of E experts (T*k *assignments*), N ranks of one expert-parallel
group, each holding E/N consecutive experts (expert e on rank e // (E/N)), width d, `element_size`
bytes per element.

- Capacity: an expert takes at most C = ceil(c * T * k / E) assignments, c the capacity factor read
  as the decimal it prints as (1.1 is 11/10, not the binary double nearest it), so C is exact. The
  rest are dropped: their expert output is zero and the residual carries the token on unchanged.
  Which ones: token order first (the assignments of token 0, then of token 1, ...), so an expert
  keeps its first C assignments in token order.
- The dispatch moves one row of d elements per assignment to the rank of its expert, and the
  combine brings it back; the backward moves the gradients the same ways in reverse. Rows for a
  rank's own experts stay on it and are not counted. A rank's bytes are therefore a pure function
  of the matrix M[s][r] = assignments on rank s for experts on rank r (`rank_matrix`).
- Before the dispatch, each rank tells every other how many rows it will send to each of that
  rank's experts: an even all-to-all of (N, E/N) integers (`counts_exchange_bytes`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from wmdist.costs.validate import require_int, require_positive, require_real

COUNT_BYTES = 8       # the counts travel as int64

# Each public function checks its arguments, then calls its `_..._unchecked` core. A caller whose
# values are already checked (experts.tradeoff's ExpertsConfig) calls the cores directly, so one
# setting is checked once, where it enters, not again in every formula on the way to the figure.


def experts_per_rank(experts: int, ranks: int) -> int:
    """E/N, if N divides E (each rank holds the same number of whole experts); a ValueError naming both if not."""
    e, n = require_int("experts", experts, 1), require_int("ranks", ranks, 1)
    require_split(e, n)
    return e // n


def require_split(experts: int, ranks: int) -> None:
    """N divides E (integers >= 1, checked), else the ValueError experts_per_rank raises, naming ranks that do."""
    if experts % ranks:
        raise ValueError(f"expert parallelism needs the number of ranks to divide the number of experts: "
                         f"experts={experts} is not divisible by ranks={ranks} (try ranks in {divisors(experts)})")


def divisors(n: int) -> list[int]:
    """The world sizes expert parallelism accepts for n experts."""
    return [d for d in range(1, require_int("n", n, 1) + 1) if n % d == 0]


def capacity(tokens: int, k: int, experts: int, factor: float) -> int:
    """C = ceil(factor * T * k / E): the most assignments one expert takes (factor read as its printed decimal)."""
    t, kk, e = require_int("tokens", tokens, 0), require_int("k", k, 1), require_int("experts", experts, 1)
    require_top_k(kk, e)
    return _capacity_unchecked(t, kk, e, require_positive("capacity_factor", factor))


def require_top_k(k: int, experts: int) -> None:
    """k <= E (integers >= 1, checked), else the ValueError capacity raises."""
    if k > experts:
        raise ValueError(f"k={k} must be at most experts={experts} (a token picks k different experts)")


def _capacity_unchecked(t: int, k: int, e: int, factor: float) -> int:
    return math.ceil(Fraction(str(float(factor))) * t * k / e)


def expert_counts(assignments: Sequence[int], experts: int) -> list[int]:
    """Assignments per expert, from the expert id of each assignment."""
    e = require_int("experts", experts, 1)
    out = [0] * e
    for a in assignments:
        if not 0 <= a < e:
            raise ValueError(f"expert id {a} is outside [0, {e})")
        out[a] += 1
    return out


def kept_mask(assignments: Sequence[int], experts: int, cap: int | None) -> list[bool]:
    """Which assignments (in token order) their expert takes: its first `cap` (all of them when cap is None)."""
    seen = [0] * require_int("experts", experts, 1)
    out = []
    for a in assignments:
        out.append(cap is None or seen[a] < cap)
        seen[a] += 1
    return out


def dropped(counts: Sequence[int], cap: int | None) -> int:
    """Assignments dropped: sum over experts of max(0, count - C)."""
    return 0 if cap is None else sum(max(0, c - cap) for c in counts)


def imbalance(counts: Sequence[int]) -> float:
    """max / mean of the counts (1.0 perfectly balanced, E when one of E gets everything; 1.0 when all are 0)."""
    total = sum(counts)
    return 1.0 if total == 0 else max(counts) * len(counts) / total


def rank_loads(counts: Sequence[int], ranks: int) -> list[int]:
    """Assignments each rank's experts receive (rank r holds experts [r E/N, (r+1) E/N))."""
    experts_per_rank(len(counts), ranks)
    return _rank_loads_unchecked(counts, ranks)


def _rank_loads_unchecked(counts: Sequence[float], ranks: int) -> list:
    per = len(counts) // ranks
    return [sum(counts[r * per:(r + 1) * per]) for r in range(ranks)]


def rank_matrix(assignments_by_rank: Sequence[Sequence[int]], experts: int) -> list[list[int]]:
    """M[s][r]: assignments on source rank s (their expert ids) bound for the experts held by rank r."""
    n = len(assignments_by_rank)
    return [rank_loads(expert_counts(ids, experts), n) for ids in assignments_by_rank]


@dataclass(frozen=True, kw_only=True)
class RankTraffic:
    """One rank's all-to-all bytes in one training step: (sent, received) for each of the four all-to-alls."""
    dispatch: tuple[int, int]            # forward: token rows to the experts' ranks
    combine: tuple[int, int]             # forward: expert outputs back to the tokens' ranks
    combine_backward: tuple[int, int]    # backward of the combine: output gradients to the experts' ranks
    dispatch_backward: tuple[int, int]   # backward of the dispatch: input gradients back to the tokens' ranks

    @property
    def sent(self) -> int:
        return self.dispatch[0] + self.combine[0] + self.combine_backward[0] + self.dispatch_backward[0]


def rank_traffic(matrix: Sequence[Sequence[int]], width: int, element_size: int) -> list[RankTraffic]:
    """Each rank's bytes from M: the dispatch sends sum_{r != s} M[s][r] rows of d elements and receives
    sum_{r != s} M[r][s]; the combine is the dispatch reversed; each backward is its forward reversed."""
    return _traffic_unchecked(matrix, require_int("width", width, 1) * require_int("element_size", element_size, 1))


def _traffic_unchecked(matrix: Sequence[Sequence[float]], row: int) -> list[RankTraffic]:
    n = len(matrix)
    out = []
    for s in range(n):
        off_sent = sum(matrix[s][r] for r in range(n) if r != s) * row
        off_recv = sum(matrix[r][s] for r in range(n) if r != s) * row
        out.append(RankTraffic(dispatch=(off_sent, off_recv), combine=(off_recv, off_sent),
                               combine_backward=(off_sent, off_recv), dispatch_backward=(off_recv, off_sent)))
    return out


def counts_exchange_bytes(experts: int, ranks: int) -> int:
    """Bytes each rank sends (and receives) telling the others its row counts: (N-1) * E/N int64s."""
    experts_per_rank(experts, ranks)                    # both integers >= 1, and N divides E
    return _counts_unchecked(int(experts), int(ranks))


def _counts_unchecked(experts: int, ranks: int) -> int:
    return (ranks - 1) * (experts // ranks) * COUNT_BYTES


def uniform_dispatch_bytes(tokens_per_rank: int, k: int, ranks: int, width: int, element_size: int) -> float:
    """Expected bytes one rank sends in one dispatch under uniform routing: T k (N-1)/N rows of d elements.

    Each assignment lands on any of the N ranks with probability 1/N, so (N-1)/N of them leave. The
    combine and the two backward all-to-alls move as much again each.
    """
    t, kk = require_int("tokens_per_rank", tokens_per_rank, 0), require_int("k", k, 1)
    n = require_int("ranks", ranks, 1)
    return _uniform_unchecked(t, kk, n, require_int("width", width, 1) * require_int("element_size", element_size, 1))


def _uniform_unchecked(t: int, k: int, n: int, row: int) -> float:
    return t * k * (n - 1) / n * row


def padded_dispatch_bytes(experts: int, cap: int, width: int, element_size: int) -> int:
    """A fixed-capacity dispatch's buffer: E * C rows of d elements, full or not (what a padded all-to-all sends)."""
    return (require_int("experts", experts, 1) * require_int("capacity", cap, 0) * require_int("width", width, 1)
            * require_int("element_size", element_size, 1))


def padded_dispatch_sent(experts: int, ranks: int, cap: int, width: int, element_size: int) -> int:
    """What one rank sends in a fixed-capacity dispatch: C slots for each expert on another rank, full or not,
    (E - E/N) C d elt (its own experts' slots stay on it)."""
    experts_per_rank(experts, ranks)
    return _padded_sent_unchecked(experts, ranks, require_int("capacity", cap, 0),
                                  require_int("width", width, 1) * require_int("element_size", element_size, 1))


def _padded_sent_unchecked(experts: int, ranks: int, cap: int, row: int) -> int:
    return (experts - experts // ranks) * cap * row


def skewed_shares(experts: int, skew: float) -> list[float]:
    """Expected share of assignments per expert under a load skew s >= 0: proportional to 1/(e+1)^s (s=0 uniform)."""
    return _shares_unchecked(require_int("experts", experts, 1), require_real("skew", skew))


def _shares_unchecked(e: int, s: float) -> list[float]:
    weights = [(i + 1) ** -s for i in range(e)]
    return [w / sum(weights) for w in weights]


def dropped_fraction(shares: Sequence[float], factor: float) -> float:
    """Expected fraction of assignments dropped: sum_e max(0, share_e - c/E) (expert e gets share_e T k, keeps cT k/E).

    The large-T limit (rounding of C ignored): what the capacity factor costs under a given skew.
    """
    if not shares or any(s < 0 for s in shares) or not math.isclose(sum(shares), 1.0, rel_tol=1e-9):
        raise ValueError(f"shares must be >= 0 and add up to 1, got {list(shares)}")
    return _dropped_unchecked(shares, require_positive("capacity_factor", factor))


def _dropped_unchecked(shares: Sequence[float], c: float) -> float:
    return sum(max(0.0, s - c / len(shares)) for s in shares)


def expected_imbalance(shares: Sequence[float]) -> float:
    """max / mean of the expected loads: E * max share."""
    return len(shares) * max(shares)


def transfer_time(nbytes: float, bandwidth: float) -> float:
    """Seconds to move `nbytes` over a link of `bandwidth` bytes/s (no latency term)."""
    return _seconds_unchecked(require_real("nbytes", nbytes), require_positive("bandwidth", bandwidth))


def _seconds_unchecked(work: float, rate: float) -> float:
    """work / rate: transfer_time's bytes over bytes/s, expert_time's FLOPs over FLOP/s."""
    return work / rate


def expert_flops(assignments: float, width: int, hidden: int) -> float:
    """Forward FLOPs of the experts' two matmuls (d -> F -> d): 4 d F per assignment."""
    d, f = require_int("width", width, 1), require_int("hidden", hidden, 1)
    return _flops_unchecked(require_real("assignments", assignments), d, f)


def _flops_unchecked(assignments: float, d: int, f: int) -> float:
    return 4.0 * assignments * d * f


def expert_time(assignments: float, width: int, hidden: int, flops_per_s: float) -> float:
    """Seconds the busiest rank spends in its experts' forward: its assignments' FLOPs at `flops_per_s`."""
    return _seconds_unchecked(expert_flops(assignments, width, hidden), require_positive("flops_per_s", flops_per_s))
