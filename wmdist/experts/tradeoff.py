"""The experts panel's model: capacity, drops, imbalance, all-to-all bytes and time for one setting (pure).

Every number comes from `wmdist.costs.experts`; this file only decides which formula answers which
question, for T tokens on each of N expert-parallel ranks, routed to k of E experts:

- Routing is described by a load skew s: expert e gets the expected share 1/(e+1)^s of the assignments
  (`skewed_shares`; s = 0 is uniform), the same on every rank. Expected loads are that share of the
  group's N T k assignments; they are real numbers, not the integers of one draw.
- Capacity C = ceil(c N T k / E) per expert over the group's tokens (`capacity`, as the chapter's runs
  apply it); the dropped fraction is `dropped_fraction(shares, c)` and the imbalance max / mean load
  `expected_imbalance(shares)`.
- Bytes: every rank sends each of its T k assignments to the rank of its expert, so the expected
  matrix is M[s][r] = T k * (share of rank r's experts), and each rank's four all-to-alls are
  `rank_traffic(M, d, element size)`. Capacity does not change them: rows travel uneven and are
  dropped where their expert runs. At s = 0 this is `uniform_dispatch_bytes` on every rank.
- Padding: a fixed-shape dispatch would send C_r slots for each expert on another rank instead, full
  or not, C_r = ceil(c T k / E) of the rank's own tokens (`padded_dispatch_sent`), whatever the routing.
- Time of one forward: the two all-to-alls at the busiest rank's bytes (the larger of what it sends
  and receives) over the link (`transfer_time`), against the busiest rank's expert matmuls on the
  assignments it keeps (`expert_time`). Nothing is assumed to overlap.

ExpertsConfig checks every field once, where a setting enters; experts_view then calls those
formulas' unchecked cores (costs.experts' `_..._unchecked`), which trust the checked values.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from operator import attrgetter

from wmdist.costs import experts as ecosts
from wmdist.costs.experts import (
    RankTraffic,
    _capacity_unchecked,
    _counts_unchecked,
    _dropped_unchecked,
    _flops_unchecked,
    _padded_sent_unchecked,
    _rank_loads_unchecked,
    _seconds_unchecked,
    _shares_unchecked,
    _traffic_unchecked,
    _uniform_unchecked,
)
from wmdist.costs.validate import require_fields, require_positive, require_real
from wmdist.base.knobs import knob, pow2


CAPACITY_SWEEP = tuple(round(0.25 * i, 2) for i in range(2, 17))     # c = 0.5 .. 4 for the drops view


@dataclass(frozen=True, kw_only=True)
class ExpertsConfig:
    """One MoE layer on N expert-parallel ranks. Knobs: the panel's controls."""
    experts: int = knob(8, "experts E", options=pow2(1, 8))
    k: int = knob(2, "experts per token k", low=1, high=8)
    ranks: int = knob(4, "ranks N", options=pow2(0, 8))
    capacity_factor: float = knob(1.25, "capacity factor c", low=0.5, high=4.0, step=0.05, fmt=".2f")
    skew: float = knob(0.5, "load skew s", low=0.0, high=2.0, step=0.1, fmt=".1f")
    tokens: int = knob(4096, "tokens per rank T", options=pow2(4, 20))
    width: int = knob(1024, "width d", options=pow2(3, 14))
    hidden: int = knob(4096, "expert hidden F", options=pow2(3, 16))
    element_size: int = knob(2, "element", options=(("bf16 (2 B)", 2), ("fp32 (4 B)", 4)))
    link_gbps: float = knob(50.0, "link GB/s", low=1.0, high=1000.0, log=True, fmt=".3g")
    tflops: float = knob(100.0, "expert TFLOP/s", low=0.1, high=2000.0, log=True, fmt=".3g")

    def __post_init__(self) -> None:
        """Every check of the panel's path, here once: each field, then N divides E and k <= E."""
        require_fields(self, ("experts", "k", "ranks", "tokens", "width", "hidden", "element_size"), 1)
        for name in ("capacity_factor", "link_gbps", "tflops"):
            require_positive(name, getattr(self, name))
        require_real("skew", self.skew)
        ecosts.require_split(self.experts, self.ranks)
        ecosts.require_top_k(self.k, self.experts)

    @property
    def bandwidth(self) -> float:
        return self.link_gbps * 1e9

    @property
    def flops_per_s(self) -> float:
        return self.tflops * 1e12


@dataclass(frozen=True, kw_only=True)
class ExpertsView:
    """What the panel shows for one ExpertsConfig (see the module doc for which formula gives each)."""
    config: ExpertsConfig
    capacity: int                        # C per expert, over the group's N T tokens
    shares: list[float]                  # [expert] expected share of the assignments
    loads: list[float]                   # [expert] expected assignments, N T k share
    dropped_fraction: float
    imbalance: float                     # max / mean expected load per expert
    rank_loads: list[float]              # [rank] expected assignments at its experts (before capacity)
    busiest: int                         # the rank with the most
    traffic: list[RankTraffic]           # [rank] expected bytes of the four all-to-alls
    uniform_bytes: float                 # one all-to-all, one rank, uniform routing
    counts_bytes: int                    # the counts exchange before each dispatch, per rank
    padded_bytes: int                    # what a fixed-capacity dispatch sends, per rank
    dispatch_bytes: float                # the most any rank sends or receives in one dispatch (combine: as much)
    dispatch_sent: float                 # the most any rank sends in one dispatch
    step_sent: float                     # the most any rank sends in a training step's four all-to-alls
    rank_imbalance: float                # max / mean of rank_loads: what the step waits on (per expert: imbalance)
    a2a_seconds: float                   # dispatch + combine at the busiest rank's bytes
    compute_seconds: float               # the busiest rank's experts, forward, on the assignments they keep
    comm_over_compute: float             # a2a_seconds / compute_seconds
    kept: list[float] = field(repr=False, default_factory=list)     # [expert] min(load, C)


def experts_view(config: ExpertsConfig) -> ExpertsView:
    """Evaluate every number the panel shows for one setting (checked by ExpertsConfig: the cores trust it)."""
    c = config
    n, row, total = c.ranks, c.width * c.element_size, c.ranks * c.tokens * c.k
    bandwidth, flops_per_s = c.bandwidth, c.flops_per_s
    shares = _shares_unchecked(c.experts, c.skew)
    cap = _capacity_unchecked(n * c.tokens, c.k, c.experts, c.capacity_factor)
    padded = _padded_sent_unchecked(c.experts, n, _capacity_unchecked(c.tokens, c.k, c.experts, c.capacity_factor),
                                    row)
    dropped = _dropped_unchecked(shares, c.capacity_factor)
    imbalance = ecosts.expected_imbalance(shares)
    uniform, counts = _uniform_unchecked(c.tokens, c.k, n, row), _counts_unchecked(c.experts, n)
    rank_share = _rank_loads_unchecked(shares, n)
    loads = [total * s for s in shares]                          # expected assignments, the group's N T k
    kept = [min(load, cap) for load in loads]
    sent = [c.tokens * c.k * s for s in rank_share]               # M[s][r]: rank s's T k by rank r's share
    per_rank, kept_per_rank = _rank_loads_unchecked(loads, n), _rank_loads_unchecked(kept, n)
    traffic = _traffic_unchecked([sent] * n, row)
    most = max(map(max, map(attrgetter("dispatch"), traffic)))    # the busiest rank's dispatch, sent or received
    step_sent = max(map(attrgetter("sent"), traffic))
    a2a = 2 * _seconds_unchecked(most, bandwidth)                 # dispatch, then combine back
    # the busiest rank's expert time: the time of its largest kept load (FLOPs and seconds grow with it)
    compute = _seconds_unchecked(_flops_unchecked(max(kept_per_rank), c.width, c.hidden), flops_per_s)
    return ExpertsView(
        config=c, capacity=cap, shares=shares, loads=loads, dropped_fraction=dropped, imbalance=imbalance,
        rank_loads=per_rank, busiest=max(range(n), key=per_rank.__getitem__), traffic=traffic,
        uniform_bytes=uniform, counts_bytes=counts, padded_bytes=padded, dispatch_bytes=most,
        dispatch_sent=max(t.dispatch[0] for t in traffic), step_sent=step_sent,
        rank_imbalance=max(per_rank) / (sum(per_rank) / n), a2a_seconds=a2a, compute_seconds=compute,
        comm_over_compute=a2a / compute, kept=kept)


def rank_sweep(config: ExpertsConfig) -> list[ExpertsView]:
    """The same layer at every N that divides E (the bytes and time vs N view)."""
    return [experts_view(replace(config, ranks=n)) for n in ecosts.divisors(config.experts)]


def capacity_sweep(config: ExpertsConfig) -> list[ExpertsView]:
    """The same layer at c = 0.5 .. 4 (the drops vs capacity view)."""
    return [experts_view(replace(config, capacity_factor=f)) for f in CAPACITY_SWEEP]

