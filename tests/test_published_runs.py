"""The published runs hold together: layouts multiply out, batches add up, printed figures agree (issue 34 §2).

Each check compares numbers a source prints with each other or with the
architecture, so a mistyped row fails here. Rounding is the only slack, and it
is the source's own: a printed figure stands for the interval of half a unit
of its last digit either way, and two printed figures agree when the interval
computed from one overlaps the interval of the other.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from wmdist.planner.hardware import CLUSTERS, GPUS
from wmdist.planner.presets import PRESETS, Architecture, layer_params, nominal_params, param_count, printed_size
from wmdist.planner.published import RUNS, Layout, gpt_step_flops, known_keys_ok, peak_flops, published_share, published_run
from wmdist.planner.records import MEGA

IDS = [r.name for r in RUNS]


def _printed(value: float, step: float) -> tuple[float, float]:
    """What a figure printed to `step` stands for."""
    return value - step / 2, value + step / 2


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _peaks(r) -> tuple[float, float]:
    """The peak a source divides by: the datasheet's (989.4 TFLOP/s for an H100) or that figure to three
    digits (989), which Megatron-Core's table evidently uses: its 459.9 TFLOP/s prints as 47%, which
    is 46.48% of 989.4 and 46.50% of 989."""
    peak = peak_flops(r)
    return float(f"{peak:.3g}"), peak


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_the_layout_multiplies_out_to_the_gpu_count(r):
    assert r.layout.dp * r.layout.tp * r.layout.pp * r.layout.cp == r.gpus


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_experts_split_the_ranks_that_hold_one_copy_of_attention(r):
    m, lay = PRESETS[r.model], r.layout
    if not m.moe:
        assert lay.ep == 1 and lay.expert_tp == 1, f"{r.name}: a dense model with expert parallelism"
        return
    holders = lay.dp * lay.cp * lay.tp
    assert holders % (lay.ep * lay.expert_tp) == 0, f"{r.name}: ep {lay.ep} does not divide dp x cp x tp {holders}"
    assert m.experts % lay.ep == 0, f"{r.name}: {m.experts} experts do not spread over ep {lay.ep}"


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_the_pipeline_and_tensor_splits_divide_the_model(r):
    m, lay = PRESETS[r.model], r.layout
    chunks = lay.pp * (lay.virtual_stages or 1)
    assert (m.layers + lay.pipeline_padding) % chunks == 0, \
        f"{r.name}: {m.layers} layers + {lay.pipeline_padding} slots over {chunks} chunks"
    assert m.heads % lay.tp == 0, f"{r.name}: {m.heads} heads over tp {lay.tp}"
    assert m.kv_heads % lay.tp == 0 or lay.tp % m.kv_heads == 0, f"{r.name}: kv heads {m.kv_heads}, tp {lay.tp}"
    assert r.seq_len % (2 * lay.cp) == 0, f"{r.name}: a context-parallel rank takes two chunks of the sequence"


@pytest.mark.parametrize("r", [r for r in RUNS if r.global_batch and r.layout.micro_batch], ids=lambda r: r.name)
def test_micro_batches_fill_the_global_batch(r):
    assert r.global_batch % (r.layout.dp * r.layout.micro_batch) == 0


@pytest.mark.parametrize("r", [r for r in RUNS if r.batch_per_dp or (r.global_batch and r.printed_batch_tokens)],
                         ids=lambda r: r.name)
def test_sequences_times_length_is_the_printed_token_count(r):
    if r.batch_per_dp:
        assert r.global_batch == r.batch_per_dp * r.layout.dp
    if r.printed_batch_tokens:
        value = float(r.printed_batch_tokens[:-1])
        readings = [r.global_batch * r.seq_len / unit for unit in MEGA.values()]   # "M" as 10^6 or 2^20
        assert any(_overlap(_printed(value, 1), (x, x)) for x in readings), \
            f"{r.name}: {r.global_batch} x {r.seq_len} is {readings} M tokens, printed {r.printed_batch_tokens}"


def test_a_printed_token_count_stands_in_only_where_no_sequence_count_is_published():
    """OPT's sequence count is its launcher's (8 per rank over 124 ranks, 2.03M tokens, which prints as 2M); were
    it absent, the printed 2M would stand in, read as 2 x 2^20 tokens."""
    opt = published_run("opt-175b")
    assert opt.global_batch == 8 * 124 and opt.batch_tokens == 992 * 2048
    assert replace(opt, global_batch=None, batch_per_dp=None).batch_tokens == 2 * 2 ** 20
    assert published_run("bloom-176b").batch_tokens == 2048 * 2048


@pytest.mark.parametrize("r", [r for r in RUNS if r.tflops_per_gpu and (r.mfu or r.hfu)], ids=lambda r: r.name)
def test_the_printed_utilization_is_the_printed_tflops_over_the_peak(r):
    share = r.mfu if r.flops_counted == "model" else r.hfu
    assert share is not None, f"{r.name}: its TFLOP/s count {r.flops_counted} FLOPs but that utilization is absent"
    low, high = _printed(r.tflops_per_gpu * 1e12, r.tflops_step * 1e12)
    slow, fast = _peaks(r)
    assert _overlap((low / fast, high / slow), _printed(share, r.utilization_step)), \
        f"{r.name}: {r.tflops_per_gpu} TFLOP/s is {r.tflops_per_gpu * 1e12 / fast:.2%} of peak, printed {share:.1%}"


@pytest.mark.parametrize("r", [r for r in RUNS if r.iteration_s], ids=lambda r: r.name)
def test_the_iteration_time_reproduces_the_printed_throughput(r):
    """The source's own FLOP formulas (Korthikanti eq. 7 and 8, Narayanan eq. 3) over the printed seconds
    per step give its printed MFU, HFU or TFLOP/s, with the step time's last digit as the only slack."""
    m = PRESETS[r.model]
    digits = len(f"{r.iteration_s}".split(".")[1])
    t_low, t_high = _printed(r.iteration_s, 10.0 ** -digits)
    checks = []
    for counted, printed in (("none", r.mfu), (r.layout.recompute, r.hfu)):
        if printed is not None:
            flops = gpt_step_flops(m, sequences=r.global_batch, seq_len=r.seq_len, counted=counted)
            per_gpu = (flops / (t_high * r.gpus), flops / (t_low * r.gpus))
            checks.append(_overlap((per_gpu[0] / peak_flops(r), per_gpu[1] / peak_flops(r)),
                                   _printed(printed, r.utilization_step)))
    if r.tflops_per_gpu is not None:
        flops = gpt_step_flops(m, sequences=r.global_batch, seq_len=r.seq_len, counted=r.layout.recompute)
        checks.append(_overlap((flops / (t_high * r.gpus), flops / (t_low * r.gpus)),
                               _printed(r.tflops_per_gpu * 1e12, r.tflops_step * 1e12)))
    assert checks and all(checks), f"{r.name}: {checks}"


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_a_lone_utilization_figure_counts_what_the_row_says(r):
    if r.hfu is not None and r.mfu is None:
        assert r.flops_counted == "hardware"
    if r.mfu is not None and r.hfu is None and r.tflops_per_gpu is not None:
        assert r.flops_counted == "model"
    for share in (r.mfu, r.hfu):
        assert share is None or 0 < share < 1


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_every_row_names_its_paper_and_the_table_or_section(r):
    c = r.citation
    assert c.authors and c.title and 2019 <= c.year <= 2026
    assert re.search(r"\b(Table|section|abstract|table|headline)\b", c.where), f"{r.name}: where? {c.where!r}"
    assert (c.arxiv and re.fullmatch(r"\d{4}\.\d{4,5}", c.arxiv)) or (c.url or "").startswith("https://")
    assert r.confidence in ("checked", "partly checked", "unchecked") and r.note
    assert known_keys_ok(r), f"{r.name} names an unknown preset, GPU or cluster"


def test_the_runs_cover_what_the_issue_asks():
    assert len(RUNS) >= 8
    assert len({r.citation.title for r in RUNS}) >= 4
    assert len({GPUS[r.gpu].generation for r in RUNS}) >= 2
    assert any(r.layout.cp > 1 and r.seq_len >= 131072 for r in RUNS), "a long-context, context-parallel run"
    assert any(PRESETS[r.model].moe and r.layout.ep > 1 for r in RUNS), "a mixture-of-experts run"
    assert len(IDS) == len(set(IDS)), "run names are unique"


@pytest.mark.parametrize("m", PRESETS.values(), ids=PRESETS)
def test_the_parameter_count_from_the_shape_matches_the_name(m):
    """Within 2%, or half a unit of the name's last digit where that is looser ("1.7B" covers 1.65-1.75B)."""
    count, nominal = param_count(m), nominal_params(m)
    digits = m.nominal[:-1].replace(",", "").partition(".")[2]
    half_unit = 0.5 * 10.0 ** -len(digits) * printed_size("1" + m.nominal[-1])
    assert abs(count - nominal) <= max(0.02 * nominal, half_unit), f"{m.name}: {count / 1e9:.2f}B vs {m.nominal}"
    if m.nominal_active:
        active = param_count(m, active=True)
        assert abs(active - printed_size(m.nominal_active)) <= 0.02 * printed_size(m.nominal_active)


def test_param_count_by_hand():
    """A 2-layer toy counted term by term: attention 2h^2 + 2h(kv x d) = 128 + 64, two LayerNorms with bias
    4h = 32, a 2-matrix MLP with biases 2h x ffn + ffn + h = 512 + 40; embeddings tied 10h, positions 4h,
    final LayerNorm 2h."""
    toy = Architecture(name="toy", layers=2, hidden=8, ffn=32, heads=2, kv_heads=1, vocab=10, seq_len=4,
                       learned_positions=4, nominal="1M", source="by hand")
    attention = 2 * 64 + 2 * 8 * 4 + (2 * 8 + 2 * 4)
    block = attention + 2 * 16 + (2 * 8 * 32 + 32 + 8)
    assert layer_params(toy, moe_layer=False) == block
    assert param_count(toy) == 2 * block + 10 * 8 + 4 * 8 + 16
    moe = Architecture(name="toy-moe", layers=3, hidden=8, ffn=32, heads=2, kv_heads=2, vocab=10, seq_len=4,
                       gated_mlp=True, biases=False, tied_embeddings=False, experts=4, top_k=2, expert_ffn=16,
                       shared_experts=1, shared_ffn=16, dense_layers=1, nominal="1M", source="by hand")
    dense_block = 4 * 64 + 2 * 8 + 3 * 8 * 32
    expert = 3 * 8 * 16
    moe_block = 4 * 64 + 2 * 8 + 4 * expert + expert + 8 * 4
    assert param_count(moe) == dense_block + 2 * moe_block + 2 * 10 * 8 + 8
    assert param_count(moe, active=True) == param_count(moe) - 2 * 2 * expert


def test_bloom_and_llama_counts_match_the_published_totals_exactly():
    assert param_count(PRESETS["bloom-176b"]) // 10 ** 6 == 176_247         # the BLOOM paper's "176,247M"
    assert round(param_count(PRESETS["llama3-405b"]) / 1e9, 1) == 405.9


def test_gpt_step_flops_by_hand():
    gpt = PRESETS["gpt3-175b"]
    B, s, L, h, V = 2, 2048, 96, 12288, 51200
    assert math.isclose(gpt_step_flops(gpt, sequences=B, seq_len=s, counted="none"),
                        72 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (12 * h * L)), rel_tol=1e-12)
    assert gpt_step_flops(gpt, sequences=B, seq_len=s, counted="full") > \
        gpt_step_flops(gpt, sequences=B, seq_len=s, counted="selective") > \
        gpt_step_flops(gpt, sequences=B, seq_len=s, counted="none")
    with pytest.raises(ValueError, match="not a GPT-shaped model"):
        gpt_step_flops(PRESETS["llama3-405b"], sequences=1, seq_len=8192, counted="none")


def test_hardware_records_read_as_their_datasheets():
    h100, a100 = GPUS["h100"], GPUS["a100-80gb"]
    assert math.isclose(h100.peak_bf16_flops, 1979e12 / 2, rel_tol=1e-3)      # "1,979 with sparsity"
    assert a100.peak_bf16_flops == 312e12 and a100.hbm_bytes == h100.hbm_bytes == 80 * 10 ** 9
    assert h100.nvlink_send_bytes_per_s == 450e9 and a100.nvlink_send_bytes_per_s == 300e9
    assert h100.network_send_bytes_per_s == 50e9 and CLUSTERS["selene"].network_send_bytes_per_s == 25e9
    assert all(c.gpu in GPUS and c.gpus_per_node == GPUS[c.gpu].gpus_per_node for c in CLUSTERS.values())
    assert CLUSTERS["jean-zay"].network_bits_per_s == 4 * 100e9 / 8          # four 100 Gb/s links per 8 GPUs


def test_bad_records_and_names_are_refused_with_the_value():
    with pytest.raises(ValueError, match="published run must be one of .*got 'gpt-9'"):
        published_run("gpt-9")
    with pytest.raises(ValueError, match="tp must be an integer >= 1, got 0"):
        Layout(dp=1, tp=0, pp=1)
    with pytest.raises(ValueError, match="zero_stage must be an integer from 0 to 3, got 4"):
        Layout(dp=1, tp=1, pp=1, zero_stage=4)
    with pytest.raises(ValueError, match="width 100 must be divisible by heads 3"):
        Architecture(name="bad", layers=1, hidden=100, ffn=400, heads=3, kv_heads=3, vocab=10, seq_len=8,
                     nominal="1M", source="none")


def test_published_share_compares_like_with_like():
    """MFU where printed, else HFU, else TFLOP/s over peak, each with what it counts."""
    assert published_share(published_run("korthikanti22-1t")) == (0.563, "model")
    assert published_share(published_run("narayanan21-1008.0b")) == (0.52, "hardware")
    share, counted = published_share(published_run("mcore24-mixtral-8x7b"))
    assert counted == "model" and math.isclose(share, 438 / 989.4)
    assert published_share(published_run("opt-175b"))[1] is None            # the paper does not say what it counts
    assert published_run("llama3-405b-128k-16384gpu").layout.overlapped == ("dp", "pp")   # CP's all-gather is exposed
    with pytest.raises(ValueError, match="overlapped must name axes"):
        Layout(dp=1, tp=1, pp=1, overlapped=("nvlink",))
