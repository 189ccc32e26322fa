"""TrafficPanel: ring attention's bytes, FLOPs, memory and overlap live, and a real run on local ranks on demand.

A thin view over wmdist.ring_attention.traffic (the pure model: sliders set
a TrafficConfig, ranges declared next to its fields), .figures (the plots)
and .measure (the run on local ranks).
"""
from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from wmdist.ring_attention.figures import traffic_figure
from wmdist.ring_attention.measure import measure_ring
from wmdist.ring_attention.traffic import RingMeasurement, TrafficConfig, TrafficResult, traffic_model
from wmdist.ui import Panel


def _size(n: float) -> str:
    """Bytes in binary units, 3 significant digits."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


class TrafficPanel(Panel):
    """Per-rank K, V traffic (N-1 vs N sends), FLOPs vs bytes, memory, overlap, and DP/TP/CP for comparison.

    `result` is the current TrafficResult; `measured` the last RingMeasurement (or None).
    """

    run_label = "Run it on local ranks"

    def __init__(self, config: TrafficConfig | None = None):
        super().__init__(config or TrafficConfig())

    def compute(self, config: TrafficConfig) -> TrafficResult:
        return traffic_model(config)

    def figure(self, config: TrafficConfig, result: TrafficResult) -> Figure:
        # Redraw into the figure on screen when there is one: new axes cost most of a redraw.
        return traffic_figure(config, result, self.measured, into=self.shown)

    def describe(self, c: TrafficConfig, r: TrafficResult) -> str:
        hide = "hides under" if r.hides else "does <b>not</b> hide under"
        order = " &lt; ".join(r.ranking)
        return (f"Each of N = {c.world_size} ranks holds c = {r.tokens_per_rank:,} tokens and sends "
                f"<b>{_size(r.sent)}</b> of K, V in forward (N-1 sends; the paper's N-send loop: {_size(r.sent_paper)}), "
                f"then {_size(r.backward[0])} of K, V and {_size(r.backward[1])} of dK, dV in backward. "
                f"Forward attention: {r.flops:.3g} FLOPs in all. Memory per rank: K, V {_size(r.kv_storage)}, "
                f"score tiles {_size(r.scores_blocked)} (full S x S scores in one process: {_size(r.scores_full)}). "
                f"On {c.device}, a step's send ({1e3 * r.step_comm_s:.3g} ms) {hide} its compute "
                f"({1e3 * r.step_compute_s:.3g} ms); hiding needs c >= {r.min_block:,}. "
                f"Bytes per rank per layer and step: {order} "
                f"(DP {_size(r.parallel['DP'])}, TP {_size(r.parallel['TP'])}, CP {_size(r.parallel['CP'])})."
                + self._measured_text())

    def _measured_text(self) -> str:
        m = self.measured
        if m is None:
            return ""
        ok = all(b == m.sent_predicted for b in m.sent) and all(b == m.backward_predicted for b in m.backward)
        return (f"<br>Run at S = {m.seq_len} on {m.world_size} rank(s): forward bytes per rank {m.sent} "
                f"(formula {m.sent_predicted}), backward {m.backward} (formula {m.backward_predicted}): "
                f"{'equal' if ok else 'DIFFERENT'}; peak per rank {[_size(p) for p in m.peak]} "
                f"(K, V held: {_size(m.kv_storage)}).")

    def measure(self, config: TrafficConfig, progress: Any) -> RingMeasurement:
        """Ring attention forward and backward at this setting, S capped to what local ranks hold."""
        return measure_ring(config, progress)
