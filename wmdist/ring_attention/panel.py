"""TrafficPanel: ring attention's bytes, FLOPs, memory and overlap live, and a real run on local ranks on demand.

A thin view over wmdist.ring_attention.traffic (the pure model: sliders set
a TrafficConfig, ranges declared next to its fields), .figures (the six
views) and .measure (the run on local ranks). The F and B sliders always show
the figures the model uses: picking a named device sets them to its
datasheet values, and moving either makes the device "custom".
"""
from __future__ import annotations

from typing import Any

from wmdist.costs.units import flops, seconds, si
from wmdist.ring_attention.figures import (draw_flops, draw_memory, draw_overlap, draw_parallel_s, draw_parallel_w,
                                           draw_sent)
from wmdist.ring_attention.measure import measure_ring
from wmdist.ring_attention.traffic import (CUSTOM, DEVICES, RingMeasurement, TrafficConfig, TrafficResult,
                                           traffic_model)
from wmdist.ui.panel import Panel, View
from wmdist.course.report import Report


def size(n: float) -> str:
    """Bytes in decimal engineering units, as the figures' axes print them: 9216 -> '9.22 kB'."""
    return si(n, "B")


class TrafficPanel(Panel):
    """Per-rank K, V traffic (N-1 vs N sends), FLOPs vs bytes, memory, overlap, and DP/TP/CP for comparison.

    `result` is the current TrafficResult; `measured` the last RingMeasurement (or None).
    """

    run_label = "Run it on local ranks"
    hint = ("in <i>ring</i>, double N: each rank's bytes level off near S·d<sub>KV</sub>·bytes while the "
            "FLOPs stay; then open the <i>overlap</i> view and shrink S until the send stops hiding.")
    control_groups = {"sizes": ("seq_len", "heads", "head_dim", "batch", "dtype", "causal"),
                      "ring": ("world_size", "block_size"),
                      "machine": ("device", "flops", "link")}

    def __init__(self, config: TrafficConfig | None = None):
        self.report: Report | None = None         # the last run's Report: every rank's bytes against the formulas
        super().__init__(config or TrafficConfig())
        device = self.controls["device"]          # "device" alone: its options already name the link, and
        device.tooltip, device.description = device.description, "device"    # "HDR InfiniBand" needs the room
        with self.holding():
            self._show_device(self.controls["device"].value)

    def views(self) -> list[View]:
        return [View("bytes per rank", lambda fig, c, r: draw_sent(fig, c, r, self.measured)),
                View("FLOPs vs bytes", draw_flops),
                View("memory", lambda fig, c, r: draw_memory(fig, c, r, self.measured)),
                View("overlap", draw_overlap),
                View("DP/TP/CP vs S", draw_parallel_s),
                View("vs width", draw_parallel_w)]

    def _show_device(self, device: str) -> None:
        """Set the F and B sliders to a named device's figures (clipped to their ranges)."""
        if device == CUSTOM:
            return
        f, b, _ = DEVICES[device]
        for name, value in (("flops", f), ("link", b)):
            s = self.controls[name]
            s.value = min(max(value, s.knob.low), s.knob.high)

    def _changed(self, name: str, change: dict) -> None:
        if self._holding:
            return
        with self.holding():
            if name == "device":
                self._show_device(change["new"])
            elif name in ("flops", "link") and self.controls["device"].value != CUSTOM:
                self.controls["device"].value = CUSTOM
        super()._changed(name, change)

    def compute(self, config: TrafficConfig) -> TrafficResult:
        return traffic_model(config)

    def describe(self, c: TrafficConfig, r: TrafficResult) -> str:
        hide = "hides under" if r.hides else "does <b>not</b> hide under"
        order = " &lt; ".join(r.ranking)
        return (f"N = {c.world_size} ranks, c = {r.tokens_per_rank:,} tokens each. Forward K, V sent per rank: "
                f"<b>{size(r.sent)}</b> (N-1 sends; the paper's N-send loop: {size(r.sent_paper)}); "
                f"backward: {size(r.backward[0])} of K, V and {size(r.backward[1])} of dK, dV.<br>"
                f"Forward attention: <b>{flops(r.flops)}</b> in all. Per rank: K, V {size(r.kv_storage)}, "
                f"score tiles {size(r.scores_blocked)} (one process's S x S scores: "
                f"{size(r.scores_full)}).<br>"
                f"On {c.device}, a step's send ({seconds(r.step_comm_s)}) {hide} its compute "
                f"({seconds(r.step_compute_s)}); hiding needs c ≥ {r.min_block:,}.<br>"
                f"Bytes per rank per layer and step: {order} (DP {size(r.parallel['DP'])}, "
                f"TP {size(r.parallel['TP'])}, CP {size(r.parallel['CP'])}).")

    def details(self, c: TrafficConfig, r: TrafficResult) -> str:
        m = self.measured
        if m is None:
            return ""
        ok = all(b == m.sent_predicted for b in m.sent) and all(b == m.backward_predicted for b in m.backward)
        return (f"Run at S = {m.seq_len:,} on {m.world_size} rank(s): forward bytes per rank {m.sent} "
                f"(formula {m.sent_predicted}), backward {m.backward} (formula {m.backward_predicted}): "
                f"<b>{'equal' if ok else 'DIFFERENT'}</b>; peak per rank {[size(p) for p in m.peak]} "
                f"(K, V held: {size(m.kv_storage)}).")

    def measure(self, config: TrafficConfig, progress: Any) -> RingMeasurement:
        """Ring attention forward and backward at this setting, S capped to what local ranks hold; the Report
        (every rank's bytes against the formulas) is kept in `report`."""
        self.report = measure_ring(config, progress=progress)
        return self.report.data
