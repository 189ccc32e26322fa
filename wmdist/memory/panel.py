"""MemoryPanel: what each rank holds, which kind is the limit, and which remedy targets it.

A thin view over wmdist.memory.footprint (the controls are MemoryConfig's
knobs). The run button trains the course's tiny model with real ZeRO on a few
gloo ranks (wmdist.memory.zero_demos) and shows the bytes each rank actually
held next to the model's prediction for that tiny model.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
from matplotlib.figure import Figure

from wmdist.memory.figures import memory_bars
from wmdist.memory.footprint import KINDS, MemoryConfig, distinct_breakdowns, format_bytes, per_rank_bytes
from wmdist.memory.remedies import limiting_kind, remedies_for
from wmdist.ui import Panel
from wmdist.ui.controls import CONTROL_WIDTH, LABEL_WIDTH

MAX_BARS_WORLD = 1024   # above this many ranks, show ranks 0..7 of the dp group instead of every distinct one
CAVEATS = ("Simplifications: activations are divided by tp as if sequence parallelism were on (without it, "
           "LayerNorm and dropout activations stay whole on every TP rank); microbatches in flight in a pipeline "
           "are not counted (GPipe keeps M, 1F1B up to P on the first stage); ZeRO bytes are steady state "
           "(stage 2 briefly holds the full gradient, stage 3 the full parameters).")


@dataclass(frozen=True)
class Breakdown:
    """Every distinct per-rank breakdown (with its ranks), and the fullest rank's."""
    groups: list[tuple[list[int], dict[str, int]]]
    fullest_rank: int
    fullest: dict[str, int]


class MemoryPanel(Panel):
    """Controls -> MemoryConfig -> per-rank bytes -> stacked bars, the limit and its remedies."""

    run_label = "measure: real ZeRO run (tiny model)"

    def __init__(self, params: float = 1e9, config: MemoryConfig | None = None):
        style, width = {"description_width": LABEL_WIDTH}, W.Layout(width=CONTROL_WIDTH)
        extra = {"capacity_gb": W.FloatText(value=80.0, description="device capacity (GB)", style=style, layout=width),
                 "binary": W.Checkbox(value=False, description="binary units (GiB)", indent=False, layout=width)}
        self.measure_ranks = W.IntSlider(value=4, min=2, max=4, description="measure on ranks", style=style,
                                         layout=width)
        super().__init__(config or MemoryConfig(params=int(params)), extra_controls=extra,
                         extra_widgets=[self.measure_ranks])

    def compute(self, config: MemoryConfig) -> Breakdown:
        capacity = self.extra["capacity_gb"].value
        if capacity < 0:
            raise ValueError(f"device capacity must be >= 0 GB, got {capacity}")
        if config.world_size <= MAX_BARS_WORLD:
            groups = distinct_breakdowns(config)
        else:
            groups = [([r], per_rank_bytes(config, r)) for r in range(min(config.dp, 8))]
        ranks, fullest = max(groups, key=lambda g: g[1]["total"])
        return Breakdown(groups, ranks[0], fullest)

    def figure(self, config: MemoryConfig, result: Breakdown) -> Figure:
        return memory_bars(result.groups, self.extra["capacity_gb"].value * 1e9, self.extra["binary"].value,
                           f"{config.world_size} rank(s), ZeRO-{config.zero_stage}")

    def describe(self, config: MemoryConfig, result: Breakdown) -> str:
        binary, cap, b = self.extra["binary"].value, self.extra["capacity_gb"].value * 1e9, result.fullest
        kind = limiting_kind(b)
        rows = "".join(f"<tr><td>{k.replace('_', ' ')}</td><td style='text-align:right'>{b[k]:,}</td>"
                       f"<td style='text-align:right'>{format_bytes(b[k], binary)}</td></tr>" for k in (*KINDS, "total"))
        fixes = "".join(f"<li><b>{r.name}</b>: {html.escape(r.how)}</li>" for r in remedies_for(kind))
        verdict = (f"fits in {format_bytes(cap, binary)}" if b["total"] <= cap else
                   f"<b style='color:#b00'>does not fit</b> in {format_bytes(cap, binary)}")
        return (f"<p>Fullest rank: {result.fullest_rank} of {config.world_size}. Total "
                f"{format_bytes(b['total'], binary)}: {verdict}.</p>"
                f"<table><tr><th>kind</th><th>bytes</th><th>size</th></tr>{rows}</table>"
                f"<p>Largest kind (the limit): <b>{kind.replace('_', ' ')}</b>. Remedies that target it:</p>"
                f"<ul>{fixes}</ul><p>More replicated data-parallel workers do not shrink any of these.</p>"
                f"<p style='font-size:90%'>{CAVEATS}</p>{self._measured_html()}")

    def measure(self, config: MemoryConfig, progress: Any) -> Any:
        """Train the course's tiny model with ZeRO at this panel's stage on a few real ranks."""
        from wmdist.memory.zero_demos import zero_memory_report   # starts processes
        n, stage = self.measure_ranks.value, config.zero_stage
        progress(0, 1, f"running ZeRO-{stage} on {n} ranks")
        report = zero_memory_report(n, stage)
        progress(1, 1, f"ZeRO-{stage} on {n} ranks: {'PASS' if report.passed else 'FAIL'}")
        return report

    def _measured_html(self) -> str:
        report = self.measured
        if report is None:
            return ""
        rows = "".join(f"<tr><td>{c.rank}</td><td>{html.escape(c.case)}</td><td style='text-align:right'>"
                       f"{c.measured:,}</td><td style='text-align:right'>{c.predicted:,}</td>"
                       f"<td>{'ok' if c.passed else 'MISMATCH'}</td></tr>" for c in report.counts(quantity="held bytes"))
        return (f"<p><b>Measured</b>: {html.escape(report.name)} on {report.world_size} ranks training the course's "
                f"tiny model ({report.params['params']:,} fp32 parameters, Adam), not the configuration above: "
                f"<b>{'PASS' if report.passed else 'FAIL'}</b></p><table><tr><th>rank</th><th>kind</th>"
                f"<th>held</th><th>predicted</th><th></th></tr>{rows}</table>")
