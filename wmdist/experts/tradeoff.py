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
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from wmdist.costs import experts as ecosts
from wmdist.costs.experts import RankTraffic
from wmdist.costs.validate import require_int, require_positive, require_real
from wmdist.knobs import knob, pow2


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
        ecosts.experts_per_rank(self.experts, self.ranks)          # N must divide E
        ecosts.capacity(self.tokens, self.k, self.experts, self.capacity_factor)    # k <= E, c > 0
        require_real("skew", self.skew)
        for name in ("tokens", "width", "hidden", "element_size"):
            require_int(name, getattr(self, name), 1)
        require_positive("link_gbps", self.link_gbps)
        require_positive("tflops", self.tflops)

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
    a2a_seconds: float                   # dispatch + combine at the busiest rank's bytes
    compute_seconds: float               # the busiest rank's experts, forward, on the assignments they keep
    kept: list[float] = field(repr=False, default_factory=list)     # [expert] min(load, C)

    @property
    def dispatch_bytes(self) -> float:
        """The most any rank sends or receives in one dispatch (the combine moves as much back)."""
        return max(max(t.dispatch) for t in self.traffic)

    @property
    def dispatch_sent(self) -> float:
        """The most any rank sends in one dispatch."""
        return max(t.dispatch[0] for t in self.traffic)

    @property
    def rank_imbalance(self) -> float:
        """max / mean of the assignments per rank's experts: what the step waits on (per expert is `imbalance`)."""
        return max(self.rank_loads) / (sum(self.rank_loads) / len(self.rank_loads))

    @property
    def comm_over_compute(self) -> float:
        return self.a2a_seconds / self.compute_seconds


def rank_shares(shares: list[float], ranks: int) -> list[float]:
    """The expected share of the assignments that go to each rank's experts (rank r holds [r E/N, (r+1) E/N))."""
    return ecosts.rank_loads(shares, ranks)


def expected_traffic(config: ExpertsConfig, shares: list[float]) -> list[RankTraffic]:
    """Each rank's four all-to-alls when every rank routes its T tokens with `shares`: rank_traffic of
    M[s][r] = T k * (rank r's share)."""
    c = config
    row = [c.tokens * c.k * s for s in rank_shares(shares, c.ranks)]
    return ecosts.rank_traffic([row] * c.ranks, c.width, c.element_size)


def experts_view(config: ExpertsConfig) -> ExpertsView:
    """Evaluate every number the panel shows for one setting."""
    c = config
    shares = ecosts.skewed_shares(c.experts, c.skew)
    cap = ecosts.capacity(c.ranks * c.tokens, c.k, c.experts, c.capacity_factor)
    total = c.ranks * c.tokens * c.k
    loads = [total * s for s in shares]
    kept = [min(load, cap) for load in loads]
    per_rank = ecosts.rank_loads(loads, c.ranks)
    busiest = max(range(c.ranks), key=lambda r: per_rank[r])
    traffic = expected_traffic(c, shares)
    busy = max(max(t.dispatch) for t in traffic)
    a2a = 2 * ecosts.transfer_time(busy, c.bandwidth)                      # dispatch, then combine back
    compute = max(ecosts.expert_time(a, c.width, c.hidden, c.flops_per_s) for a in ecosts.rank_loads(kept, c.ranks))
    return ExpertsView(
        config=c, capacity=cap, shares=shares, loads=loads,
        dropped_fraction=ecosts.dropped_fraction(shares, c.capacity_factor),
        imbalance=ecosts.expected_imbalance(shares), rank_loads=per_rank, busiest=busiest, traffic=traffic,
        uniform_bytes=ecosts.uniform_dispatch_bytes(c.tokens, c.k, c.ranks, c.width, c.element_size),
        counts_bytes=ecosts.counts_exchange_bytes(c.experts, c.ranks),
        padded_bytes=ecosts.padded_dispatch_sent(c.experts, c.ranks,
                                                 ecosts.capacity(c.tokens, c.k, c.experts, c.capacity_factor),
                                                 c.width, c.element_size),
        a2a_seconds=a2a, compute_seconds=compute, kept=kept)


def rank_sweep(config: ExpertsConfig) -> list[ExpertsView]:
    """The same layer at every N that divides E (the bytes and time vs N view)."""
    return [experts_view(replace(config, ranks=n)) for n in ecosts.divisors(config.experts)]


def capacity_sweep(config: ExpertsConfig) -> list[ExpertsView]:
    """The same layer at c = 0.5 .. 4 (the drops vs capacity view)."""
    return [experts_view(replace(config, capacity_factor=f)) for f in CAPACITY_SWEEP]

