"""Memory calculator: what each rank holds, which kind is the limit, which remedy targets it.

A thin view over wmdist.memory.per_rank_bytes. The "measure" button runs the
real ZeRO demo (wmdist.zero.zero_memory_report) on a few gloo ranks and shows
the bytes each rank actually held next to the model's prediction.
"""
from __future__ import annotations

import html
from typing import Any, Callable

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display

from wmdist.memory import (DTYPE_BYTES, KINDS, OPTIMIZER_SLOTS, MemoryConfig, distinct_breakdowns,
                           format_bytes, limiting_kind, per_rank_bytes, remedies_for)
from wmdist.plots.memory import memory_bars

MAX_BARS_WORLD = 1024   # above this many ranks, show ranks 0..7 of the dp group instead of every distinct one


def _default_measure(world_size: int, stage: int) -> Any:
    from wmdist.zero import zero_memory_report   # lazy: starts processes, imports torch
    return zero_memory_report(world_size, stage)


class MemoryPanel:
    """Controls -> MemoryConfig -> per-rank bytes -> stacked bars, limit and remedies."""

    def __init__(self, params: float = 1e9, measure: Callable[[int, int], Any] | None = None) -> None:
        style, lay = {"description_width": "150px"}, W.Layout(width="360px")
        self._measure = measure or _default_measure
        self.params = W.FloatLogSlider(value=params, base=10, min=3, max=12, step=0.1, description="parameters P",
                                       readout_format=".3g", continuous_update=False, style=style, layout=lay)
        dtypes = [d for d in DTYPE_BYTES if d in ("fp32", "bf16", "fp16", "fp8")]
        self.param_dtype = W.Dropdown(options=dtypes, value="fp32", description="param dtype", style=style)
        self.grad_dtype = W.Dropdown(options=["same", *dtypes], value="same", description="grad dtype", style=style)
        self.optimizer = W.Dropdown(options=list(OPTIMIZER_SLOTS), value="adam", description="optimizer", style=style)
        self.master_weights = W.Checkbox(value=False, description="fp32 master weights (+ fp32 moments)")
        self.zero_stage = W.IntSlider(value=0, min=0, max=3, description="ZeRO stage", style=style)
        self.dp, self.tp, self.pp, self.cp = (
            W.IntSlider(value=1, min=1, max=m, description=f"{a} degree", continuous_update=False, style=style)
            for a, m in (("dp", 256), ("tp", 16), ("pp", 16), ("cp", 16)))
        self.layers = W.IntSlider(value=24, min=1, max=128, description="layers", continuous_update=False, style=style)
        self.act_bytes = W.FloatText(value=0.0, description="act bytes/token/layer", style=style)
        self.input_bytes = W.FloatText(value=0.0, description="input bytes/token", style=style)
        self.context = W.IntText(value=0, description="context (tokens)", style=style)
        self.micro_batch = W.IntSlider(value=1, min=1, max=64, description="micro-batch", style=style)
        self.checkpointing = W.Checkbox(value=False, description="activation checkpointing")
        self.capacity_gb = W.FloatText(value=80.0, description="device capacity (GB)", style=style)
        self.binary = W.Checkbox(value=False, description="binary units (GiB)")
        self.summary = W.HTML()
        self.out = W.Output()
        self.measure_ranks = W.IntSlider(value=4, min=2, max=4, description="measure on ranks", style=style)
        self.measure_button = W.Button(description="measure (real ZeRO run)", icon="play")
        self.progress = W.Label("")
        self.measured = W.HTML()
        self.config: MemoryConfig | None = None
        self.groups: list[tuple[list[int], dict[str, int]]] = []
        self.result: dict[str, int] = {}
        self.report: Any = None
        self.error = ""
        controls = [self.params, self.param_dtype, self.grad_dtype, self.optimizer, self.master_weights,
                    self.zero_stage, self.dp, self.tp, self.pp, self.cp, self.layers, self.act_bytes,
                    self.input_bytes, self.context, self.micro_batch, self.checkpointing, self.capacity_gb, self.binary]
        for c in controls:
            c.observe(self._on_change, names="value")
        self.measure_button.on_click(self._on_measure)
        left = W.VBox(controls)
        right = W.VBox([self.out, self.summary])
        measure = W.VBox([W.HBox([self.measure_ranks, self.measure_button, self.progress]), self.measured])
        self.widget = W.VBox([W.HBox([left, right]), measure])
        self.update()

    def _ipython_display_(self) -> None:
        display(self.widget)

    def _on_change(self, _change: dict) -> None:
        self.update()

    def read_config(self) -> MemoryConfig:
        """The MemoryConfig the controls describe (ValueError names a bad one)."""
        return MemoryConfig(
            params=int(round(self.params.value)), param_dtype=self.param_dtype.value,
            grad_dtype=None if self.grad_dtype.value == "same" else self.grad_dtype.value,
            optimizer=self.optimizer.value, master_weights=self.master_weights.value,
            zero_stage=self.zero_stage.value, dp=self.dp.value, tp=self.tp.value, pp=self.pp.value,
            cp=self.cp.value, layers=self.layers.value, act_bytes_per_token_per_layer=float(self.act_bytes.value),
            context=self.context.value, micro_batch=self.micro_batch.value,
            checkpointing=self.checkpointing.value, input_bytes_per_token=float(self.input_bytes.value))

    def update(self) -> None:
        """Recompute the model, the summary table and the figure."""
        try:
            cfg = self.read_config()
            if self.capacity_gb.value < 0:
                raise ValueError(f"device capacity must be >= 0 GB, got {self.capacity_gb.value}")
        except (ValueError, TypeError) as err:
            self.error = str(err)
            self.summary.value = f"<b style='color:#b00'>cannot compute: {html.escape(self.error)}</b>"
            return
        self.error = ""
        self.config = cfg
        if cfg.world <= MAX_BARS_WORLD:
            self.groups = distinct_breakdowns(cfg)
        else:
            self.groups = [([r], per_rank_bytes(cfg, r)) for r in range(min(cfg.dp, 8))]
        ranks, self.result = max(self.groups, key=lambda g: g[1]["total"])
        self.summary.value = self._summary(cfg, ranks[0], self.result)
        with self.out:
            self.out.clear_output(wait=True)
            fig = memory_bars(self.groups, self.capacity_gb.value * 1e9, self.binary.value,
                              f"{cfg.world} rank(s), ZeRO-{cfg.zero_stage}")
            display(fig)
            plt.close(fig)

    def _summary(self, cfg: MemoryConfig, rank: int, b: dict[str, int]) -> str:
        binary, cap = self.binary.value, self.capacity_gb.value * 1e9
        kind = limiting_kind(b)
        fits = b["total"] <= cap
        rows = "".join(f"<tr><td>{k.replace('_', ' ')}</td><td style='text-align:right'>{b[k]}</td>"
                       f"<td style='text-align:right'>{format_bytes(b[k], binary)}</td></tr>"
                       for k in (*KINDS, "total"))
        fixes = "".join(f"<li><b>{r.name}</b>: {html.escape(r.how)}</li>" for r in remedies_for(kind))
        verdict = (f"fits in {format_bytes(cap, binary)}" if fits else
                   f"<b style='color:#b00'>does not fit</b> in {format_bytes(cap, binary)}")
        return (f"<p>Fullest rank: {rank} of {cfg.world}. Total {format_bytes(b['total'], binary)} — {verdict}.</p>"
                f"<table><tr><th>kind</th><th>bytes</th><th>size</th></tr>{rows}</table>"
                f"<p>Largest kind (the limit): <b>{kind.replace('_', ' ')}</b>. Remedies that target it:</p>"
                f"<ul>{fixes}</ul><p>More replicated data-parallel workers do not shrink any of these.</p>")

    def _on_measure(self, _button: Any = None) -> None:
        """Run the real ZeRO demo; show measured vs predicted bytes, or the error as text."""
        n, stage = self.measure_ranks.value, self.zero_stage.value
        self.measure_button.disabled = True
        self.progress.value = f"running ZeRO-{stage} on {n} ranks..."
        try:
            self.report = self._measure(n, stage)
            rows = [r for r in self.report.comm if "held" in r.quantity]
            body = "".join(f"<tr><td>{r.rank}</td><td>{html.escape(r.quantity)}</td>"
                           f"<td style='text-align:right'>{r.measured}</td>"
                           f"<td style='text-align:right'>{r.predicted}</td>"
                           f"<td>{'ok' if r.passed else 'MISMATCH'}</td></tr>" for r in rows)
            self.measured.value = (f"<p>{html.escape(self.report.name)} on {n} ranks: "
                                   f"<b>{'PASS' if self.report.passed else 'FAIL'}</b></p>"
                                   "<table><tr><th>rank</th><th>quantity</th><th>measured</th><th>predicted</th>"
                                   f"<th></th></tr>{body}</table>")
            self.progress.value = "done"
        except Exception as err:  # a missing module or a failed rank, shown as text
            self.report = None
            self.measured.value = f"<pre>{html.escape(type(err).__name__ + ': ' + str(err))}</pre>"
            self.progress.value = "failed"
        finally:
            self.measure_button.disabled = False
