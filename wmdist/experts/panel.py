"""ExpertsPanel: capacity, drops, imbalance and all-to-all bytes and time of one MoE layer, and a real run.

Sliders set an ExpertsConfig (ranges declared next to its fields in .tradeoff); compute() is the
pure model .tradeoff.experts_view (costs.experts only, no processes); the views come from .figures.
"Run it" runs the chapter's moe-ep Experiment at this E, k, N and capacity factor on local ranks
(a seeded random router, small tokens and width: see RUN_LIMITS) and keeps its Report, whose exact
counts include every rank's bytes in every all-to-all against costs.experts.rank_traffic of the
routing the run made.
"""
from __future__ import annotations

import dataclasses
import html
from typing import Any

from wmdist.costs import experts as ecosts
from wmdist.costs.units import seconds, si
from wmdist.experts.figures import draw_capacity, draw_loads, draw_measured, draw_ranks
from wmdist.experts.tradeoff import ExpertsConfig, ExpertsView, experts_view
from wmdist.course.report import Report
from wmdist.ui.panel import OnProgress, Panel, View

RUN_LIMITS = {"ranks": 8, "experts": 64}          # what "run it" starts on this machine
RUN_SIZES = {"tokens": 16, "width": 16, "hidden": 32}   # per rank, width, expert hidden: the run's (tiny) layer
ELEMENT = 4                                        # the run is float32
FLOAT_STEPS = {"capacity_factor": 2, "skew": 1}      # decimals of the float sliders' steps (0.05 and 0.1)


def nbytes(x: float) -> str:
    return si(x, "B")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertsRun:
    """What "run it" ran and what it measured: the setting, the case's name, the Report."""
    config: ExpertsConfig
    case: str
    tokens: int          # per rank, in the run
    width: int
    report: Report

    def matches(self, config: ExpertsConfig) -> bool:
        """Whether this run is of the routing setting on screen (E, k, N, c)."""
        keys = ("experts", "k", "ranks", "capacity_factor")
        return all(getattr(self.config, f) == getattr(config, f) for f in keys)

    @property
    def uniform(self) -> float:
        """The uniform-routing expectation of one dispatch at the run's sizes."""
        return ecosts.uniform_dispatch_bytes(self.tokens, self.config.k, self.config.ranks, self.width, ELEMENT)


def run_spec(config: ExpertsConfig) -> Any:
    """The LayerSpec "run it" runs: this E, k, N, c, a random router, the tiny sizes (a ValueError past the limits)."""
    from wmdist.experts.spec import LayerCase, LayerSpec       # torch: only when a run is asked for
    for what, value in (("ranks", config.ranks), ("experts", config.experts)):
        if value > RUN_LIMITS[what]:
            raise ValueError(f"run it starts local CPU ranks: {what} must be at most {RUN_LIMITS[what]}, got {value} "
                             "(the formulas above hold at any size)")
    case = LayerCase(router="random", k=config.k, capacity_factor=config.capacity_factor)
    return LayerSpec(world_size=config.ranks, cases=(case,), experts=config.experts,
                     tokens=config.ranks * RUN_SIZES["tokens"], width=RUN_SIZES["width"], hidden=RUN_SIZES["hidden"])


def summary(view: ExpertsView) -> str:
    """The numbers to take away, as HTML; every one is a costs.experts formula (see .tradeoff)."""
    c = view.config
    mean = sum(view.rank_loads) / c.ranks
    lines = [
        f"<b>Capacity</b> C = ⌈c N T k / E⌉ = <b>{view.capacity:,}</b> per expert; expected "
        f"<b>{100 * view.dropped_fraction:.1f}% dropped</b> at skew {c.skew:.1f}. <b>Imbalance</b> per expert "
        f"max/mean {view.imbalance:.2f} (the most popular expert's load over the mean expert's); per rank max/mean "
        f"{view.rank_imbalance:.2f}: rank {view.busiest}'s experts get {view.rank_loads[view.busiest]:,.0f} "
        f"assignments (mean {mean:,.0f}).",
        f"<b>All-to-all per rank</b>, one dispatch: up to <b>{nbytes(view.dispatch_bytes)}</b> (busiest rank, sent "
        f"or received); uniform routing {nbytes(view.uniform_bytes)} = T k (N-1)/N d x {c.element_size} B per "
        f"element. A training step runs four (dispatch, combine, both backward): {nbytes(view.step_sent)} sent by the "
        f"busiest, plus {nbytes(view.counts_bytes)} of counts before each dispatch. A padded dispatch "
        f"(C_r = ⌈c T k / E⌉ slots per expert, full or not) would send {nbytes(view.padded_bytes)} per rank.",
        f"<b>One forward</b>: dispatch + combine <b>{seconds(view.a2a_seconds)}</b> at {c.link_gbps:.3g} GB/s, the "
        f"busiest rank's experts <b>{seconds(view.compute_seconds)}</b> at {c.tflops:.3g} TFLOP/s: the all-to-alls "
        f"take {view.comm_over_compute:.2f}× the compute (nothing overlapped).",
    ]
    return "<br>".join(lines)


class ExpertsPanel(Panel):
    """Tokens per expert, bytes and time vs N, drops vs capacity; "run it" measures the layer on local ranks.

    `result` is the current ExpertsView; `measured` the last ExpertsRun (or None).
    """

    run_label = "Run the layer on N local ranks"
    measured_view = "measured"
    hint = ("raise the load skew s and watch the red (dropped) part grow; then raise c until nothing drops, and "
            "see what a padded dispatch would cost.")
    control_groups = {"routing": ("experts", "k", "ranks", "capacity_factor", "skew"),
                      "sizes": ("tokens", "width", "hidden", "element_size"),
                      "machine": ("link_gbps", "tflops")}

    def __init__(self, config: ExpertsConfig | None = None):
        super().__init__(config or ExpertsConfig())

    def read_config(self, *, change: dict[str, Any] | None = None) -> ExpertsConfig:
        """The controls' config, with the float sliders' values back on their steps (0.05 and 0.1): the
        browser adds its own rounding, and c is read as the decimal it prints as."""
        values = {name: self.controls[name].value for name in FLOAT_STEPS} | (change or {})
        steps = {name: round(values[name], digits) for name, digits in FLOAT_STEPS.items()
                 if isinstance(values[name], float)}           # anything else: the config names what is wrong
        return super().read_config(change={**(change or {}), **steps})      # one config built, checked once

    def compute(self, config: ExpertsConfig) -> ExpertsView:
        return experts_view(config)

    def views(self) -> list[View]:
        def measured(fig: Any, c: ExpertsConfig, r: ExpertsView) -> None:
            m = self.measured
            draw_measured(fig, m and m.report, m and m.case, uniform=m and m.uniform)
        return [View("tokens per expert", lambda fig, c, r: draw_loads(fig, r)),
                View("bytes and time vs N", lambda fig, c, r: draw_ranks(fig, r)),
                View("drops vs capacity", lambda fig, c, r: draw_capacity(fig, r)),
                View("measured", measured)]

    def describe(self, config: ExpertsConfig, result: ExpertsView) -> str:
        text = summary(result)
        m = self.measured
        if m is not None and m.matches(config):
            rep = m.report
            equal = all(c.passed for c in rep.exact if c.quantity in ("bytes sent", "bytes received"))
            drops = sum(rep.measured(quantity="assignments dropped at this rank's experts", case=m.case))
            text += (f"<br><b>Measured</b> on {rep.world_size} local ranks ({html.escape(m.case)}, T = {m.tokens} "
                     f"per rank, d = {m.width}, fp32): ledger bytes {'equal' if equal else 'DIFFER from'} the "
                     f"formula on every rank and all-to-all; {drops} assignments dropped; against one process "
                     f"{'PASS' if rep.passed else 'FAIL'}.")
        return text

    def measure(self, config: ExpertsConfig, progress: OnProgress) -> ExpertsRun:
        from wmdist.experts.demos import EP_DEMO                 # starts processes
        spec = run_spec(config)
        report = EP_DEMO.renamed("moe-ep (widget)").run_spec(spec, progress=progress)
        return ExpertsRun(config=config, case=spec.cases[0].name, tokens=spec.tokens_per_rank, width=spec.width,
                          report=report)
