"""MemoryPanel: what each rank holds, which kind is the limit, and which remedy targets it.

A thin view over wmdist.memory.footprint (the controls are MemoryConfig's
knobs) and wmdist.memory.transient (the peak within a step). The run button
trains the course's tiny model with real ZeRO on a few gloo ranks
(wmdist.memory.zero_demos) and shows the bytes each rank actually held next to
the model's prediction for that tiny model, not for the configuration set here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
from wmdist.memory.figures import draw_bars, rank_label
from wmdist.memory.footprint import KINDS, MemoryConfig, distinct_breakdowns, format_bytes, local_params, per_rank_bytes
from wmdist.memory.presets import PRESETS, Preset, preset_fields
from wmdist.memory.remedies import limiting_kind, remedies_for
from wmdist.memory.transient import TransientPeak, transient_peak
from wmdist.ui.controls import CONTROL_WIDTH, LABEL_WIDTH, model_value, widget_value
from wmdist.ui.panel import Panel, View

MAX_BARS_WORLD = 1024   # above this many ranks, show ranks 0..7 of the dp group instead of every distinct one
CAVEATS = ("<b>What this model simplifies.</b> Activations under tp: only the part entered as <i>TP-"
           "replicated part</i> stays whole on every tp rank (Korthikanti et al.: 10 of a transformer layer's 34 "
           "bytes per token and width, LayerNorm and dropout); left at 0 it treats every activation as sharded, "
           "which overstates the saving unless sequence parallelism is on. Pipelines: one micro-batch's "
           "activations per stage; GPipe keeps all M in flight, 1F1B up to P on the first stage. ZeRO: the table "
           "is the steady state between steps; the peak within a step is given under the table.")


CUSTOM = "custom"
# The panel opens on a setting where every control changes the picture: GPT-3 6.7B in bf16 with fp32 master
# weights and Adam, 8 ranks as dp 4 x tp 2, ZeRO-1, sequence 2048, checkpointing on.
TEACHING = dict(param_dtype="bf16", master_weights=True, zero_stage=1, dp=4, tp=2,
                checkpointing=True, batch_bytes=2 ** 20)
GROUPS = {"model": ("preset", "params", "layers", "seq_len", "micro_batch", "act_bytes_per_token_per_layer",
                    "act_replicated_bytes_per_token_per_layer", "input_bytes_per_token", "batch_bytes"),
          "precision": ("param_dtype", "grad_dtype", "grad_accum_dtype", "optimizer", "master_weights"),
          "parallel": ("dp", "tp", "pp", "cp", "zero_stage", "sequence_parallel", "checkpointing"),
          "device": ("capacity_gb", "binary")}


def teaching_config(*, preset: Preset = "gpt3-6.7b") -> MemoryConfig:
    """The panel's opening setting for a preset (see TEACHING); a name outside Preset is refused (ValueError)."""
    return MemoryConfig(**preset_fields(preset), **TEACHING)


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """Every distinct per-rank breakdown (with its ranks), the fullest rank's, and its peak within a step
    (the whole model gathered at once, and one layer at a time)."""
    groups: list[tuple[list[int], dict[str, int]]]
    fullest_rank: int
    fullest: dict[str, int]
    peak_whole: TransientPeak
    peak_layer: TransientPeak


class MemoryPanel(Panel):
    """Controls -> MemoryConfig -> per-rank bytes -> stacked bars, the limit and its remedies."""

    run_label = "measure: real ZeRO (tiny model)"
    hint = ("move the ZeRO stage from 1 to 3, then untick checkpointing; pick another preset, or set the "
            "parameters yourself.")
    control_groups = GROUPS

    def __init__(self, *, params: float | None = None, config: MemoryConfig | None = None):
        """No arguments: a GPT-3 6.7B preset on 8 ranks. `params` or `config`: that custom setting instead."""
        style, width = {"description_width": LABEL_WIDTH}, W.Layout(width=CONTROL_WIDTH)
        custom = params is not None or config is not None
        self.preset = W.Dropdown(options=[CUSTOM, *PRESETS], value=CUSTOM if custom else "gpt3-6.7b",
                                 description="model preset", style=style, layout=width)
        extra = {"preset": self.preset,
                 "capacity_gb": W.FloatText(value=80.0, description="device capacity (GB)", style=style, layout=width),
                 "binary": W.Checkbox(value=False, description="binary units (GiB)", indent=False, layout=width)}
        self.measure_ranks = W.IntSlider(value=4, min=2, max=4, description="ranks to measure on", style=style,
                                         layout=width)
        self.measure_note = W.HTML("<div style='font-size:90%; white-space:normal; line-height:1.35'>"
                                   "The button trains the course's "
                                   "tiny model (2,105 fp32 parameters, Adam) at this ZeRO stage on real ranks: "
                                   "it checks the rules, not the size, dtypes or degrees set above.</div>",
                                   layout=width)
        start = config or (MemoryConfig(params=int(params)) if params is not None else teaching_config())
        super().__init__(start, extra_controls=extra, extra_widgets=[self.measure_ranks, self.measure_note])

    def views(self) -> list[View]:
        return [View("bytes per rank", self._draw_bars)]

    def read_config(self, *, change: dict[str, Any] | None = None) -> MemoryConfig:
        """The config the controls describe: a menu's "same" / "none" (held as its label, see
        ui.controls.ChoiceDropdown) is None in the config."""
        values = {**{name: c.value for name, c in self.controls.items()}, **(change or {})}
        return super().read_config(change={name: model_value(self.controls[name], v) if name in self.controls else v
                                           for name, v in values.items()})

    def apply_preset(self, name: str) -> None:
        """Set the model fields of a published shape (params, layers, sequence, activation bytes) at once."""
        if name == CUSTOM:
            return
        with self.holding():
            for field, value in preset_fields(name, seq_len=self.controls["seq_len"].value or None).items():
                self.controls[field].value = widget_value(self.controls[field], value)
        self.update()

    def _changed(self, name: str, change: dict) -> None:
        if self._holding:
            return
        if name == "preset":
            self.apply_preset(change["new"])
            return
        if name in ("params", "layers") and self.preset.value != CUSTOM:
            with self.holding():                    # the shape no longer is the preset's
                self.preset.value = CUSTOM
        super()._changed(name, change)

    def compute(self, config: MemoryConfig) -> Breakdown:
        capacity = self.extra["capacity_gb"].value
        if capacity < 0:
            raise ValueError(f"device capacity must be >= 0 GB, got {capacity}")
        if config.world_size <= MAX_BARS_WORLD:
            groups = distinct_breakdowns(config)
        else:
            groups = [([r], per_rank_bytes(config, rank=r)) for r in range(min(config.dp, 8))]
        ranks, fullest = max(groups, key=lambda g: g[1]["total"])
        layer = max(1, local_params(config, rank=ranks[0])[0] // max(config.layers, 1))
        return Breakdown(groups=groups, fullest_rank=ranks[0], fullest=fullest, peak_whole=transient_peak(config, rank=ranks[0]),
                         peak_layer=transient_peak(config, rank=ranks[0], unit=layer))

    def _draw_bars(self, fig: Any, config: MemoryConfig, result: Breakdown) -> None:
        index = next(i for i, (ranks, _) in enumerate(result.groups) if result.fullest_rank in ranks)
        run = self.measured
        note = "" if run is None else (f"measured: {run.name} on {run.world_size} real ranks, course's tiny model: "
                                       f"{'PASS' if run.passed else 'FAIL'} (see details)")
        bars = [(rank_label(ranks), b) for ranks, b in result.groups]
        draw_bars(fig, bars, capacity_bytes=self.extra["capacity_gb"].value * 1e9, binary=self.extra["binary"].value,
                  title=f"{config.world_size} rank(s), ZeRO-{config.zero_stage}", peak=(index, result.peak_whole.peak),
                  note=note)

    def describe(self, config: MemoryConfig, result: Breakdown) -> str:
        binary, cap, b = self.extra["binary"].value, self.extra["capacity_gb"].value * 1e9, result.fullest
        kind = limiting_kind(b)
        size = lambda n: format_bytes(n, binary=binary)   # noqa: E731 - one unit choice for the whole summary
        fixes = ", ".join(f"<b>{r.name}</b>" for r in remedies_for(kind))
        verdict = (f"fits in {size(cap)}" if b["total"] <= cap else
                   f"<b style='color:#b00'>does not fit</b> in {size(cap)}")
        whole, layer = result.peak_whole, result.peak_layer
        peak = (f"<br>Within a step ZeRO-{config.zero_stage} briefly holds more ({html.escape(whole.what)}): peak "
                f"<b>{size(whole.peak)}</b> with the whole model gathered at once (as our demo does), "
                f"{size(layer.peak)} one layer at a time (as FSDP does)." if whole.extra else "")
        return (f"Fullest rank: {result.fullest_rank} of {config.world_size}, <b>{size(b['total'])}</b>: {verdict}."
                f"{peak}<br>Largest kind (the limit): <b>{kind.replace('_', ' ')}</b>. Remedies that target it: "
                f"{fixes} (how each works: details). More replicated data-parallel workers shrink none of these.")

    def details(self, config: MemoryConfig, result: Breakdown) -> str:
        binary, b = self.extra["binary"].value, result.fullest
        rows = "".join(f"<tr><td>{k.replace('_', ' ')}</td><td style='text-align:right'>{b[k]:,}</td>"
                       f"<td style='text-align:right; white-space:nowrap'>{format_bytes(b[k], binary=binary)}</td></tr>"
                       for k in (*KINDS, "total"))
        how = "".join(f"<li><b>{r.name}</b>: {html.escape(r.how)}</li>" for r in remedies_for(limiting_kind(b)))
        return (f"<p>Rank {result.fullest_rank}, by kind:</p><table><tr><th>kind</th><th>bytes</th><th>size</th></tr>"
                f"{rows}</table><p>Remedies for its largest kind:</p><ul>{how}</ul><p>{CAVEATS}</p>"
                f"{self._measured_html()}")

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
                       f"<td>{'ok' if c.passed else 'MISMATCH'}</td></tr>"
                       for c in report.counts(quantity="held bytes"))
        return (f"<p><b>Measured</b>: {html.escape(report.name)} on {report.world_size} ranks training the course's "
                f"tiny model ({report.params['params']:,} fp32 parameters, Adam), not the configuration above: "
                f"<b>{'PASS' if report.passed else 'FAIL'}</b></p><table><tr><th>rank</th><th>kind</th>"
                f"<th>held</th><th>predicted</th><th></th></tr>{rows}</table>")
