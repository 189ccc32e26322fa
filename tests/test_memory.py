"""The memory model against the text's figures and the ZeRO paper's formulas; the transient peak; the panel."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from wmdist.costs import ring_chunk_sizes                              # noqa: E402
from wmdist.course.exercises import check                                     # noqa: E402
from wmdist.memory import footprint as M, remedies, transient          # noqa: E402
from wmdist.memory.exercises import ZERO_BYTES, zero_bytes_solution    # noqa: E402
from wmdist.memory.footprint import KINDS, MemoryConfig, per_rank_bytes  # noqa: E402
from wmdist.course.report import Count, Report                                # noqa: E402

G = 10 ** 9


def test_text_figures_decimal():
    b = per_rank_bytes(MemoryConfig(params=G, param_dtype="fp32", optimizer="adam"))
    assert b["optimizer_state"] == 8 * G            # two fp32 Adam moments: 8 GB decimal
    assert M.format_bytes(b["optimizer_state"]) == "8.00 GB"
    assert M.format_bytes(b["optimizer_state"], binary=True) == "7.45 GiB"   # 8e9 / 2**30 = 7.4506
    assert b["gradients"] == 4 * G                  # a billion fp32 gradients: 4 GB decimal
    assert M.format_bytes(b["gradients"]) == "4.00 GB"
    assert b["master_weights"] == 0 and b["total"] == sum(b[k] for k in KINDS)


@pytest.mark.parametrize("P,N", [(7_500_000_000, 64), (10 ** 6, 8), (1200, 4)])
def test_zero_paper_mixed_precision_adam(P, N):
    """fp16 params+grads, K = 12 (fp32 master + 2 fp32 moments); N divides P here."""
    def total(stage):
        cfg = MemoryConfig(params=P, param_dtype="fp16", optimizer="adam", master_weights=True, zero_stage=stage,
                           dp=N)
        return per_rank_bytes(cfg, rank=0)
    b0 = total(0)
    assert (b0["parameters"], b0["gradients"], b0["optimizer_state"] + b0["master_weights"]) == (2 * P, 2 * P, 12 * P)
    assert b0["total"] == 16 * P
    assert total(1)["total"] == 4 * P + 12 * P // N
    assert total(2)["total"] == 2 * P + 14 * P // N
    assert total(3)["total"] == 16 * P // N


def test_uneven_shards_exact_per_rank():
    P, N = 10, 4                                     # tensor_split layout: 3, 3, 2, 2 elements
    cfg = MemoryConfig(params=P, param_dtype="fp32", optimizer="adam", zero_stage=3, dp=N)
    got = [per_rank_bytes(cfg, rank=r) for r in range(N)]
    assert [b["parameters"] for b in got] == [12, 12, 8, 8]
    assert [b["optimizer_state"] for b in got] == [24, 24, 16, 16]
    assert sum(b["parameters"] for b in got) == 4 * P   # shards cover the model exactly once
    # tp*pp first (P=1003 over 2*3 -> 168,167,...), then dp over that piece
    cfg = MemoryConfig(params=1003, param_dtype="bf16", zero_stage=3, dp=3, tp=2, pp=3)
    held = [per_rank_bytes(cfg, rank=r)["parameters"] for r in range(cfg.world_size)]
    assert sum(held) == 2 * 1003
    for r in range(cfg.world_size):
        c = M.rank_coords(cfg, r)
        assert c == cfg.mesh.coords(r)                      # the same layout the process groups use
        piece = ring_chunk_sizes(1003, 6)[c["pp"] * 2 + c["tp"]]
        assert held[r] == 2 * ring_chunk_sizes(piece, 3)[c["dp"]]


def test_replicated_dp_does_not_shrink_per_rank_bytes():
    base = per_rank_bytes(MemoryConfig(params=G, param_dtype="fp32", dp=1, zero_stage=0))
    for dp in (2, 8, 1024):
        assert per_rank_bytes(MemoryConfig(params=G, param_dtype="fp32", dp=dp, zero_stage=0), rank=dp - 1) == base
    sharded = per_rank_bytes(MemoryConfig(params=G, param_dtype="fp32", dp=8, zero_stage=1))
    assert sharded["optimizer_state"] == base["optimizer_state"] // 8 and sharded["parameters"] == base["parameters"]
    assert [r.name for r in remedies.REMEDIES if r.name.startswith("more replicated")] and \
        all(not r.targets for r in remedies.REMEDIES if r.name.startswith("more replicated"))


def test_activations_checkpointing_cp_pp_tp():
    kw = dict(layers=24, act_bytes_per_token_per_layer=34 * 1024, input_bytes_per_token=2 * 1024,
              seq_len=4096, micro_batch=2)
    full = per_rank_bytes(MemoryConfig(params=1000, **kw))["activations"]
    assert full == 24 * 2 * 4096 * 34 * 1024
    ck = per_rank_bytes(MemoryConfig(params=1000, checkpointing=True, **kw))["activations"]
    assert ck == 24 * 2 * 4096 * 2 * 1024 + 2 * 4096 * 34 * 1024   # inputs of every layer + one layer
    assert ck < full
    cp = MemoryConfig(params=1000, cp=3, **kw)      # 4096 tokens over 3: 1366, 1365, 1365
    assert [per_rank_bytes(cp, rank=r)["activations"] for r in range(3)] == \
        [24 * 2 * t * 34 * 1024 for t in (1366, 1365, 1365)]
    pp = MemoryConfig(params=1000, pp=5, **kw)      # 24 layers over 5 stages: 5,5,5,5,4
    assert per_rank_bytes(pp, rank=4)["activations"] == 4 * 2 * 4096 * 34 * 1024
    tp = MemoryConfig(params=1000, tp=3, layers=5, act_bytes_per_token_per_layer=1.0, seq_len=7)
    assert per_rank_bytes(tp)["activations"] == 12      # ceil(5 layers * 7 tokens * 1 byte / 3) = ceil(11.67)


def test_limit_and_remedies():
    b = per_rank_bytes(MemoryConfig(params=G, param_dtype="fp32", optimizer="adam"))
    assert remedies.limiting_kind(b) == "optimizer_state"
    names = {r.name for r in remedies.remedies_for("optimizer_state")}
    assert {"ZeRO-1", "ZeRO-2", "ZeRO-3", "tensor parallel", "pipeline parallel"} <= names
    assert "activation checkpointing" not in names and "more replicated DP workers" not in names
    assert remedies.remedies_for("gradients")[0].name == "ZeRO-2"
    assert {r.name for r in remedies.remedies_for("activations")} >= {"activation checkpointing", "context parallel"}
    assert "ZeRO-3" in {r.name for r in remedies.remedies_for("parameters")}
    assert "ZeRO-2" not in {r.name for r in remedies.remedies_for("parameters")}
    offload = {r.name for r in remedies.remedies_for("optimizer_state")} & {"offload to host memory or NVMe"}
    assert offload and "offload to host memory or NVMe" not in {r.name for r in remedies.remedies_for("activations")}


@pytest.mark.parametrize("kwargs,word", [
    (dict(params=-1), "params"), (dict(params=10, zero_stage=4), "zero_stage"),
    (dict(params=10, dp=0), "dp"), (dict(params=10, param_dtype="fp13"), "param_dtype"),
    (dict(params=10, optimizer="lion"), "optimizer"), (dict(params=10, seq_len=-5), "seq_len"),
    (dict(params=10, act_bytes_per_token_per_layer=float("nan")), "act_bytes"),
])
def test_config_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        MemoryConfig(**kwargs)


def test_the_choices_a_signature_names_are_the_tables_it_reads():
    """Dtype, Optimizer, Kind and Preset (the Literal annotations) list exactly the names the run-time checks accept."""
    from typing import get_args

    from wmdist.memory import presets
    assert set(get_args(M.Dtype)) == set(M.DTYPE_BYTES) and set(get_args(M.Optimizer)) == set(M.OPTIMIZER_SLOTS)
    assert get_args(M.Kind) == KINDS
    assert set(get_args(presets.Preset)) == set(presets.PRESETS)
    with pytest.raises(ValueError, match="model must be one of"):
        presets.preset_fields("llama")


def test_rank_out_of_range():
    with pytest.raises(ValueError, match="rank must be < world size 4"):
        per_rank_bytes(MemoryConfig(params=10, dp=2, tp=2), rank=4)


def test_transient_peak_rule():
    cfg = MemoryConfig(params=1000, param_dtype="bf16", zero_stage=3, dp=4, layers=10)
    steady = per_rank_bytes(cfg)["total"]
    assert transient.transient_peak(cfg).peak == steady + 1000 * (2 + 2)          # whole model gathered
    assert transient.transient_peak(cfg, unit=100).peak == steady + 100 * (2 + 2)  # one layer at a time
    two = MemoryConfig(params=1000, param_dtype="bf16", zero_stage=2, dp=4)
    assert transient.transient_peak(two).extra == 1000 * 2
    for stage in (0, 1):
        assert transient.transient_peak(MemoryConfig(params=1000, zero_stage=stage, dp=4)).extra == 0
    # the demo's points: the peak over them is the calculator's rule at unit = the whole model
    for stage in range(4):
        for r in range(3):
            held = transient.zero_step_held(2105, 3, r, stage)
            peak = max(sum(h.values()) for h in held.values())
            cfg = MemoryConfig(params=2105, optimizer="adam", zero_stage=stage, dp=3)
            b = per_rank_bytes(cfg, rank=r)
            assert peak == transient.transient_peak(cfg, rank=r).peak - b["activations"] - b["batch"]


def test_exercise_checker():
    good = check(ZERO_BYTES, zero_bytes_solution)
    assert good.passed and "passed all" in good.message

    def even_only(params, stage, dp, dp_rank):   # forgets uneven shards: P // dp
        shard = params // dp
        return {0: 16 * params, 1: 4 * params + 12 * shard, 2: 2 * params + 14 * shard, 3: 16 * shard}[stage]
    bad = check(ZERO_BYTES, even_only)
    assert not bad.passed and bad.details == ["fn(params=1, stage=1, dp=2, dp_rank=0) returned 4, expected 16"]
    assert not check(ZERO_BYTES, lambda *a: 1 / 0).passed
    assert not check(ZERO_BYTES, 42).passed


def test_exercise_solution_is_the_memory_model():
    """The exercise's readable solution agrees with the calculator on its whole grid."""
    for params, stage, dp, dp_rank in ZERO_BYTES.cases():
        cfg = MemoryConfig(params=params, param_dtype="fp16", optimizer="adam", master_weights=True,
                           zero_stage=stage, dp=dp)
        assert zero_bytes_solution(params, stage, dp, dp_rank) == per_rank_bytes(cfg, rank=dp_rank)["total"]


def test_panel_updates_on_value():
    from wmdist.memory.panel import MemoryPanel
    panel = MemoryPanel(params=1e9)
    c = panel.controls
    assert panel.result.fullest == per_rank_bytes(MemoryConfig(params=G)) and "optimizer state" in panel.summary.value
    assert "fits in 80.00 GB" in panel.summary.value
    c["param_dtype"].value = "fp16"
    c["master_weights"].value = True
    assert panel.result.fullest["total"] == 16 * G
    c["dp"].value = 8
    assert panel.result.fullest["total"] == 16 * G                   # replicated: nothing shrinks
    c["zero_stage"].value = 3
    assert panel.result.fullest["total"] == 2 * G and len(panel.result.groups) == 1
    panel.extra["capacity_gb"].value = 1.0
    assert "does not fit" in panel.summary.value
    c["params"].value = 10.0 ** 3                                    # 1000 over 8: even, one bar
    c["dp"].value = 3                                                # 334, 333, 333: two distinct bars
    assert [g[0] for g in panel.result.groups] == [[0], [1, 2]]
    assert panel.result.fullest["parameters"] == 334 * 2
    assert len(panel.shown.axes[0].patches) > 0                      # the bars on screen
    c["seq_len"].value = -1
    assert "cannot compute" in panel.status.value and "seq_len" in panel.error
    assert panel.result is None and panel.shown is None              # no stale figure left on screen
    c["seq_len"].value = 0
    panel.extra["capacity_gb"].value = -1.0                          # a bad capacity clears the figure too
    assert panel.shown is None and "capacity" in panel.error
    panel.extra["capacity_gb"].value = 80.0
    assert panel.shown is not None


def test_panel_shows_its_simplifications_and_the_transient_peak():
    from wmdist.memory.panel import MemoryPanel
    panel = MemoryPanel(params=1e9)
    details = panel.more.value                                       # the caveats sit in the folded details
    assert "sequence parallelism" in details and "1F1B" in details and "steady state" in details
    assert "Within a step ZeRO" not in panel.summary.value           # ZeRO-0: no transient
    panel.controls["dp"].value = 8
    panel.controls["zero_stage"].value = 3
    peak = transient.transient_peak(MemoryConfig(params=G, zero_stage=3, dp=8))
    assert "Within a step ZeRO-3" in panel.summary.value and M.format_bytes(peak.peak) in panel.summary.value
    assert "checks the rules, not the size" in panel.measure_note.value
    assert [p.get_hatch() for p in panel.shown.axes[0].patches].count("//") == 1   # the peak box on the bar


def test_degree_sliders_stop_only_at_listed_degrees():
    from wmdist.memory.panel import MemoryPanel
    panel = MemoryPanel(config=MemoryConfig(params=G, dp=7))         # a degree the list lacks is added, not refused
    dp = panel.controls["dp"]
    assert list(dp.options)[:8] == [1, 2, 3, 4, 6, 7, 8, 12] and dp.value == 7
    assert max(dp.options) == 256 and 129 not in dp.options
    dp.value = 256
    assert panel.result.groups and panel.config.dp == 256


def test_panel_measure_button_with_fake_report(monkeypatch):
    from wmdist.memory import zero_demos
    from wmdist.memory.panel import MemoryPanel
    calls = []

    def fake(world_size, stage):
        calls.append((world_size, stage))
        return Report(name="zero-memory", world_size=world_size, exact=[Count(quantity="held bytes", rank=r, measured=10 + r, predicted=10, case="parameters")
                                                        for r in range(world_size)], params={"params": 2105})
    monkeypatch.setattr(zero_demos, "zero_memory_report", fake)
    panel = MemoryPanel()
    panel.controls["zero_stage"].value = 2
    panel.measure_ranks.value = 3
    panel.run_button.click()
    assert calls == [(3, 2)] and "FAIL" in panel.status.value
    assert "measured: zero-memory on 3 real ranks" in panel.shown.texts[0].get_text()   # the figure says so too
    assert "FAIL" in panel.more.value and panel.more.value.count("MISMATCH") == 2
    assert "tiny model" in panel.more.value and "not the configuration above" in panel.more.value

    def broken(world_size, stage):
        raise ModuleNotFoundError("No module named 'wmdist.zero'")
    monkeypatch.setattr(zero_demos, "zero_memory_report", broken)
    panel = MemoryPanel()
    panel.run_button.click()
    assert "run failed" in panel.status.value and "wmdist.zero" in panel.status.value
    assert not panel.run_button.disabled


def test_zero_stages_figure_keys_every_kind_and_refuses_unknown_ones():
    """The figure's legend names each kind drawn and the model's ticks; a misspelt kind is refused, not drawn empty."""
    from wmdist.memory.figures import zero_stages_figure
    kinds = {"parameters": 8_000, "gradients": 8_000, "optimizer_state": 16_000}
    fig = zero_stages_figure({s: kinds for s in range(4)}, {s: 32_000 for s in range(4)}, world_size=3)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["memory model", "parameters", "gradients", "optimizer state"]   # lines first, then bars
    with pytest.raises(ValueError, match=r"held: unknown tensor kinds \['grads', 'params'\]"):
        zero_stages_figure({0: {"params": 1, "grads": 1}}, {0: 2}, world_size=3)
