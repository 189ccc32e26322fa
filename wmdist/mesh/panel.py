"""PatternsPanel: the four communication patterns side by side, where they go on a two-level machine, and a real run.

Sliders set a PatternsConfig (ranges declared next to its fields in
.patterns); compute() is the pure model .patterns.patterns (formulas and
the 24 Mesh orders, no processes); the figure comes from .figures. "Run it"
trains one step of the current sizes on local ranks (.demos.run_mesh: the
one-device check, the ledger by axis, the memory calculator) and overlays
the ledger's bytes on the formula's bars.
"""
from __future__ import annotations

import html

from wmdist.costs.mesh import TRAFFIC_AXES
from wmdist.costs.units import seconds
from wmdist.costs.validate import require_int
from wmdist.memory.footprint import format_bytes
from wmdist.mesh.demos import MeshRun, run_mesh
from wmdist.mesh.figures import draw_bytes, draw_orders, draw_time
from wmdist.mesh.patterns import PatternsConfig, PatternsResult, patterns
from wmdist.mesh.spec import MAX_CONTEXT, MeshSpec
from wmdist.ui.panel import OnProgress, Panel, View

RUN_LIMITS = {"world size": 8, "width": 256, "layers": 16, "batch": 64}   # what "run it" runs on this machine


def mesh_run_spec(config: PatternsConfig) -> MeshSpec:
    """The MeshSpec "run it" trains: the widget's sizes, if they fit a few local CPU ranks (else a ValueError)."""
    world = config.shape.world_size
    for what, value in (("world size", world), ("width", config.width), ("layers", config.layers),
                        ("batch", config.batch)):
        if value > RUN_LIMITS[what]:
            raise ValueError(f"run it trains on local CPU ranks: {what} must be at most {RUN_LIMITS[what]}, "
                             f"got {value} (the formulas above hold at any size)")
    require_int("context T", config.seq_len, 1, high=MAX_CONTEXT)
    return MeshSpec(width=config.width, heads=config.heads, layers=config.layers, seq_len=config.seq_len,
                    batch=config.batch, microbatches=config.microbatches, dp=config.dp, tp=config.tp, pp=config.pp,
                    cp=config.cp, buckets=config.buckets)


def _share(n: int, parts: int) -> str:
    """What one of `parts` ranks holds of n things split in torch.tensor_split's layout: '2' or '3 or 2'."""
    low, extra = divmod(n, parts)
    return f"{low}" if not extra else f"{low + 1} or {low}"


def patterns_summary(result: PatternsResult) -> str:
    """The numbers to take away, as HTML: who moves the most bytes, who is latency-bound, the best order and why."""
    t, best, default = result.traffic, result.best, result.default
    if not result.by_bytes:
        return "One rank: nothing to communicate. Raise a degree above 1."
    most = result.by_bytes[0]
    ranked = " &gt; ".join(f"{a.upper()} {format_bytes(t[a].bytes_sent)}" for a in result.by_bytes)
    lines = ["<b>Most bytes:</b> " + ranked
             + "; <b>most exposed time:</b> " + " &gt; ".join(a.upper() for a in result.by_time)]
    bound = result.latency_bound()
    lines.append("<b>Latency-bound</b> (messages × latency &gt; bytes / bandwidth): "
                 + (", ".join(f"{a.upper()} ({t[a].messages} messages)" for a in bound) if bound else "none")
                 + ".")
    inside = [a.upper() for a in TRAFFIC_AXES if best.inside[a] and getattr(result.config, a) > 1] or ["none"]
    node = result.config.ranks_per_node
    saved = ", ".join(f"{a.upper()} {seconds(s)}" + ("" if result.config.degree(a) <= node else
                                                           f" (its {result.config.degree(a)} ranks cannot share a "
                                                           f"node of {node})") for a, s in result.savings().items())
    same = " (the default order is already best)" if best.total == default.total else \
        f"; the default tp·cp·dp·pp: {seconds(default.total)}"
    lines.append(f"<b>Best order</b> {'·'.join(best.order)} (fastest-varying first): {', '.join(inside)} inside a "
                 f"node, exposed {seconds(best.total)} per step{same}. Why: fast links save the most on "
                 f"{saved}; the best order gives them to the axes that save the most and fit together.")
    c = result.config
    lines.append(f"<b>Each rank holds</b> {_share(c.heads, c.tp)} of the {c.heads} heads and {_share(c.layers, c.pp)} of "
                 f"the {c.layers} layers (tp {c.tp}, pp {c.pp}): heads change who computes what, not the bytes above.")
    if c.experts:
        ep = t["ep"]
        lines.append(f"<b>EP</b>: each block's MLP as {c.experts} experts over the dp ranks (ep = dp = {c.dp}, top-"
                     f"{c.top_k}): 4 all-to-alls per block and microbatch, {format_bytes(int(round(ep.bytes_sent)))} "
                     f"expected per step (uniform routing; chapter 10). The dp row still sums the dense MLP's "
                     "gradient, which experts held on one dp rank each would not; run it measures the four others.")
    top = result.by_time[0]
    if most != top:
        lines.append(f"{most.upper()} moves the most bytes, yet {top.upper()} costs the most time: bytes alone do "
                     "not rank the patterns.")
    return "<br>".join(lines)


class PatternsPanel(Panel):
    """Bytes, time and placement of the four patterns; "run it" measures one step of these sizes on local ranks.

    `result` is the current PatternsResult; `measured` the last MeshRun (or None).
    """

    run_label = "Run one step on local ranks"
    hint = ("raise the context T from 8 to 4,096 and watch CP and DP bytes pass TP's; then set <i>DP share "
            "hidden</i> to 0.8 and see the best order change.")
    control_groups = {"model": ("width", "heads", "layers", "seq_len", "batch", "microbatches", "buckets"),
                      "mesh": ("dp", "tp", "pp", "cp"),
                      "machine": ("ranks_per_node", "intra_gbps", "intra_us", "inter_gbps", "inter_us", "dp_hidden"),
                      "experts": ("experts", "top_k")}

    def __init__(self, config: PatternsConfig | None = None):
        self.report = None                       # the last run's Report (checks and exact counts)
        super().__init__(config or PatternsConfig())
        self._k_only_with_experts()

    def _k_only_with_experts(self) -> None:
        """k applies only when experts are configured: greyed out with experts = 0."""
        self.controls["top_k"].disabled = self.controls["experts"].value == 0

    def _changed(self, name: str, change: dict) -> None:
        if name == "experts" and not self._holding:
            self._k_only_with_experts()
        super()._changed(name, change)

    def compute(self, config: PatternsConfig) -> PatternsResult:
        return patterns(config)

    def views(self) -> list[View]:
        return [View("bytes per axis", lambda fig, c, r: draw_bytes(fig, r, self.measured)),
                View("time per axis", lambda fig, c, r: draw_time(fig, r)),
                View("mesh orders", lambda fig, c, r: draw_orders(fig, r))]

    def describe(self, config: PatternsConfig, result: PatternsResult) -> str:
        text = patterns_summary(result)
        m = self.measured
        if m is not None and m.spec.shape == config.shape and self.report is not None:
            equal = all(c.passed for c in self.report.exact)
            text += (f"<br><b>Measured</b> on {len(m.coords)} local ranks ({html.escape(m.spec.degrees)}): ledger "
                     f"bytes {'equal' if equal else 'DIFFER from'} the formulas on every rank and axis; one-device "
                     f"check {'PASS' if self.report.passed else 'FAIL'}; step {max(m.step_seconds):.2f} s.")
        return text

    def measure(self, config: PatternsConfig, progress: OnProgress) -> MeshRun:
        spec = mesh_run_spec(config)
        self.report = run_mesh(spec, spec.world_size, name="mesh (widget)", progress=progress)
        return self.report.data
