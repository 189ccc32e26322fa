"""The comm-patterns widget's model: four patterns side by side, and which axes to put on the fast links (pure).

For one configured world model (width, heads, layers, context, batch,
microbatches) on a dp x tp x pp x cp mesh, costs.mesh.axis_traffic gives
what one rank sends along each axis per training step. Time on a link is
messages x latency + bytes / bandwidth (the text's alpha-beta model), so a
pattern of many small messages is latency-bound and one of few large ones
bandwidth-bound; which pattern moves the most bytes, and which costs the
most time, changes with the sizes: there is no fixed ranking.

With `experts` > 0 a fifth pattern joins them (chapter 10): every block's MLP
becomes E experts spread over the dp ranks (expert parallelism on the dp axis),
and the tokens travel to their experts and back in all-to-alls
(costs.mesh.expert_traffic, from costs.experts; uniform routing). Its groups are
the dp groups, so it gets dp's link; it hides under nothing. With experts = 0
(the default) nothing changes.

Placement on a two-level machine: ranks are numbered node by node
(`ranks_per_node` consecutive ranks share fast links, nodes talk over slow
ones). A Mesh order (fastest-varying axis first) decides each axis's
stride, and so whether each of its groups fits in one node
(costs.mesh.axis_in_node). Exposed time is the sum over axes of their time
on the link they get, less the share of dp traffic hidden under backward;
nothing else is assumed to overlap, and axes are assumed not to share a
link at the same moment. The best order puts the most exposed
communication on the fastest links, the text's heuristic, here computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

from wmdist.comm.mesh import COORD_AXES, DEFAULT_ORDER
from wmdist.costs.mesh import (TRAFFIC_AXES, Link, StepShape, Traffic, axis_in_node, axis_traffic, expert_traffic,
                               strides)
from wmdist.costs.validate import require_int, require_positive, require_real
from wmdist.base.knobs import knob, pow2


DEGREES = {"options": pow2(0, 6)}
PATTERNS = {"dp": "DP: gradient buckets (ring all-reduce)", "tp": "TP: 4 all-reduces per block",
            "pp": "PP: boundary activations / gradients", "cp": "CP: ring K, V sends (+ grad sum)",
            "ep": "EP: token all-to-alls (4 per MoE block)"}
EXPERT_AXES = (*TRAFFIC_AXES, "ep")     # the patterns with experts configured; "ep" runs on the dp groups


@dataclass(frozen=True, kw_only=True)
class PatternsConfig:
    """One world model on one mesh on one two-level machine. Knobs: the widget's controls."""
    width: int = knob(32, "width H", options=pow2(4, 14))
    heads: int = knob(4, "heads", options=pow2(0, 7))
    layers: int = knob(4, "layers", low=1, high=128)
    seq_len: int = knob(8, "context T (tokens)", options=pow2(3, 20))
    batch: int = knob(8, "batch B (trajectories)", options=pow2(0, 12))
    microbatches: int = knob(2, "microbatches M", options=pow2(0, 6))
    dp: int = knob(2, "dp degree", **DEGREES)
    tp: int = knob(2, "tp degree", **DEGREES)
    pp: int = knob(2, "pp degree", **DEGREES)
    cp: int = knob(1, "cp degree", **DEGREES)
    buckets: int = knob(2, "gradient buckets", options=pow2(0, 6))
    ranks_per_node: int = knob(4, "ranks per node", options=pow2(0, 4))
    intra_gbps: float = knob(150.0, "fast link GB/s", low=1.0, high=1000.0, log=True, fmt=".3g")
    intra_us: float = knob(2.0, "fast link latency µs", low=0.1, high=100.0, log=True, fmt=".3g")
    inter_gbps: float = knob(25.0, "slow link GB/s", low=0.1, high=400.0, log=True, fmt=".3g")
    inter_us: float = knob(10.0, "slow link latency µs", low=0.1, high=1000.0, log=True, fmt=".3g")
    dp_hidden: float = knob(0.0, "DP share hidden", low=0.0, high=1.0, step=0.05)
    experts: int = knob(0, "experts E (0: none)", options=(0, *pow2(1, 8)))
    top_k: int = knob(2, "experts per token k", low=1, high=8)

    def __post_init__(self) -> None:
        require_int("ranks_per_node", self.ranks_per_node, 1)
        for name in ("intra_gbps", "intra_us", "inter_gbps", "inter_us"):
            require_positive(name, getattr(self, name))
        require_real("dp_hidden", self.dp_hidden, low=0.0, high=1.0)
        require_int("experts", self.experts, 0)
        require_int("top_k", self.top_k, 1)
        shape = self.shape          # building the StepShape checks the model and mesh sizes
        if self.experts:
            expert_traffic(shape, shown_coords(shape), experts=self.experts, k=self.top_k)   # dp | E, k <= E

    @property
    def axes(self) -> tuple[str, ...]:
        """The patterns this config has: the four, and "ep" when experts are configured."""
        return EXPERT_AXES if self.experts else TRAFFIC_AXES

    def degree(self, axis: str) -> int:
        """Ranks along `axis` ("ep" runs on the dp groups)."""
        return self.dp if axis == "ep" else getattr(self, axis)

    @property
    def shape(self) -> StepShape:
        return StepShape(width=self.width, heads=self.heads, hidden=4 * self.width, layers=self.layers,
                         seq_len=self.seq_len, batch=self.batch, microbatches=self.microbatches, dp=self.dp,
                         tp=self.tp, pp=self.pp, cp=self.cp, buckets=self.buckets, max_len=self.seq_len)

    @property
    def fast(self) -> Link:
        return Link(self.intra_us * 1e-6, self.intra_gbps * 1e9)

    @property
    def slow(self) -> Link:
        return Link(self.inter_us * 1e-6, self.inter_gbps * 1e9)


def shown_coords(shape: StepShape) -> dict[str, int]:
    """The rank the widget shows: coordinate 0 on every axis, but a middle stage (sends both ways) when pp > 2."""
    return {"dp": 0, "tp": 0, "pp": 1 if shape.pp > 2 else 0, "cp": 0}


@dataclass(kw_only=True, frozen=True)
class Placement:
    """One Mesh order on the machine: which axes fit in a node, and each axis's exposed seconds."""
    order: tuple[str, ...]                 # fastest-varying first (Mesh.order)
    inside: dict[str, bool]                # every group of the axis within one node
    latency: dict[str, float]              # messages x latency on the axis's link (s)
    transfer: dict[str, float]             # bytes / bandwidth on the axis's link (s)
    exposed: dict[str, float]              # (latency + transfer), less the hidden share (s)

    @property
    def total(self) -> float:
        return sum(self.exposed.values())


def place(config: PatternsConfig, traffic: dict[str, Traffic], order: tuple[str, ...]) -> Placement:
    """Exposed time of every axis when the ranks are laid out in `order` on the config's machine."""
    shape = config.shape
    sizes = {a: getattr(shape, a) for a in TRAFFIC_AXES}
    where = strides(sizes, order)
    inside = {a: axis_in_node(sizes[a], where[a], config.ranks_per_node, shape.world_size) for a in TRAFFIC_AXES}
    if "ep" in traffic:
        inside["ep"] = inside["dp"]
    latency, transfer, exposed = {}, {}, {}
    for a in config.axes:
        latency[a], transfer[a] = (config.fast if inside[a] else config.slow).terms(traffic[a])
        exposed[a] = (latency[a] + transfer[a]) * ((1 - config.dp_hidden) if a == "dp" else 1.0)
    return Placement(order=order, inside=inside, latency=latency, transfer=transfer, exposed=exposed)


@dataclass(kw_only=True, frozen=True)
class PatternsResult:
    """The four patterns for the shown rank, and every distinct placement from best to worst."""
    config: PatternsConfig
    coords: dict[str, int]
    traffic: dict[str, Traffic]
    placements: tuple[Placement, ...]      # one per distinct set of in-node axes, lowest exposed time first
    default: Placement                     # the Mesh default order (tp, cp, dp, pp)

    @property
    def best(self) -> Placement:
        return self.placements[0]

    @property
    def by_bytes(self) -> list[str]:
        """Axes that send anything, most bytes first."""
        return sorted((a for a in self.config.axes if self.traffic[a].messages),
                      key=lambda a: -self.traffic[a].bytes_sent)

    @property
    def by_time(self) -> list[str]:
        """Axes that send anything, most exposed time (best placement) first."""
        return sorted((a for a in self.config.axes if self.traffic[a].messages), key=lambda a: -self.best.exposed[a])

    def savings(self) -> dict[str, float]:
        """Seconds of exposed time each axis (of more than one rank) saves on fast links instead of slow ones."""
        c = self.config
        out = {}
        for a in c.axes:
            if c.degree(a) > 1:
                slow, fast = (sum(link.terms(self.traffic[a])) for link in (c.slow, c.fast))
                out[a] = (slow - fast) * ((1 - c.dp_hidden) if a == "dp" else 1.0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def latency_bound(self, *, placement: Placement | None = None) -> list[str]:
        """Axes whose latency term is larger than their bandwidth term, on `placement`'s links (default: best)."""
        p = placement or self.best
        return [a for a in self.config.axes if self.traffic[a].messages and p.latency[a] > p.transfer[a]]


def patterns(config: PatternsConfig) -> PatternsResult:
    """Evaluate the four patterns and every placement (24 orders, deduplicated by which axes fit in a node)."""
    coords = shown_coords(config.shape)
    traffic = axis_traffic(config.shape, coords)
    if config.experts:
        traffic["ep"] = expert_traffic(config.shape, coords, experts=config.experts, k=config.top_k)
    orders = [DEFAULT_ORDER] + sorted(o for o in permutations(COORD_AXES) if o != DEFAULT_ORDER)
    distinct: dict[tuple[bool, ...], Placement] = {}
    for order in orders:
        p = place(config, traffic, order)
        distinct.setdefault(tuple(p.inside[a] for a in TRAFFIC_AXES), p)
    ranked = tuple(sorted(distinct.values(), key=lambda p: p.total))     # stable: ties keep the default first
    return PatternsResult(config=config, coords=coords, traffic=traffic, placements=ranked, default=place(config, traffic, DEFAULT_ORDER))
