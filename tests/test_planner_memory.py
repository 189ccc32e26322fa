"""The planner's memory is the calculator's (memory.footprint), asked the right questions; its activation formula is
Korthikanti et al.'s for a GPT block; the calculator's new in_flight term counts sets, not recomputed layers.

Byte counts are exact integers, so equalities are exact.
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from test_planner import JOB, MODEL

from wmdist.costs.pipeline import peak_activations_in_flight
from wmdist.costs.tensor_parallel import korthikanti_layer_bytes
from wmdist.memory.footprint import MemoryConfig, activation_bytes, per_rank_bytes
from wmdist.planner.layout import ParallelLayout
from wmdist.planner.memory import DTYPES, gpu_memory, layer_activation_bytes
from wmdist.planner.model import TransformerSpec

H = 1024


def test_a_gpt_block_saves_what_korthikanti_counts():
    gpt = TransformerSpec(name="gpt", layers=2, hidden=H, ffn=4 * H, heads=16, kv_heads=16, vocab=10, gated=False,
                          dropout=True)
    for s in (512, 2048):
        a, r = layer_activation_bytes(gpt, s, scores=True, moe=False)
        assert a == korthikanti_layer_bytes(s, 1, H, 16) / s           # 34 h + 5 a s per token
        assert r == 10 * H
        assert layer_activation_bytes(gpt, s, scores=False, moe=False)[0] == 34 * H


def _by_hand(layout: ParallelLayout, stage: int, *, act: float, repl: float) -> dict[str, int]:
    """The calculator asked directly: MODEL's pieces written out (two layers per stage, head on each end)."""
    tp = layout.tp
    layer = (4 * H * H + 2 * H * 4096) // tp + 2 * H
    first, last = 2 * layer + 1000 * H // tp, 2 * layer + 1000 * H // tp + H
    pieces = (first,) * tp + (last,) * tp
    cfg = MemoryConfig(params=sum(pieces), param_pieces=pieces, dp=layout.dp, tp=tp, pp=2, cp=layout.cp,
                       zero_stage=layout.zero, layers=4, seq_len=1024, micro_batch=layout.micro_batch,
                       act_bytes_per_token_per_layer=act, act_replicated_bytes_per_token_per_layer=repl,
                       sequence_parallel=tp > 1, checkpointing=layout.recompute == "full",
                       input_bytes_per_token=2 * H, **DTYPES)
    micro = 64 // (layout.dp * layout.micro_batch)
    sets = Fraction(peak_activations_in_flight("interleaved" if layout.virtual > 1 else "1f1b", 2, micro,
                                               chunks=layout.virtual, rank=stage), layout.virtual)
    return per_rank_bytes(cfg, rank=stage * tp * layout.cp * layout.dp, in_flight=sets)


@pytest.mark.parametrize("layout", [
    ParallelLayout(dp=2, tp=2, pp=2, cp=2, zero=1, micro_batch=2),
    ParallelLayout(dp=4, tp=1, pp=2, cp=2, zero=3, micro_batch=1, virtual=2, recompute="full"),
    ParallelLayout(dp=1, tp=8, pp=2, cp=1, zero=0, micro_batch=4),
    ParallelLayout(dp=8, tp=1, pp=2, cp=1, zero=2, micro_batch=2, recompute="selective")],
    ids=lambda lay: lay.describe())
def test_planner_memory_is_the_calculators(layout):
    act = (6 * H + 2 * H) * 2 + 2 * 4096 * 2                       # MODEL: GELU, no dropout, FlashAttention
    both = [_by_hand(layout, stage, act=act, repl=4 * H * 2) for stage in (0, 1)]
    assert gpu_memory(JOB, layout) == max(both, key=lambda b: b["total"])


def test_without_flash_attention_the_scores_stay_unless_recomputed():
    job = replace(JOB, flash_attention=False)
    lay = ParallelLayout(dp=2, tp=2, pp=2, cp=2, zero=1, micro_batch=2)
    kept = gpu_memory(job, lay)["activations"]
    assert kept > gpu_memory(JOB, lay)["activations"]
    assert gpu_memory(job, replace(lay, recompute="selective")) == gpu_memory(JOB, lay)


def test_routed_experts_are_a_second_calculator_call_over_dp_over_ep():
    moe = replace(MODEL, experts=4, top_k=2, expert_ffn=1024)
    job = replace(JOB, model=moe)
    lay = ParallelLayout(dp=4, tp=2, pp=2, ep=2, micro_batch=2, zero=1)
    layer = 4 * H * H // 2 + 2 * H + 4 * H                          # attention / tp, norms, router; every layer MoE
    pieces = (2 * layer + 1000 * H // 2,) * 2 + (2 * layer + 1000 * H // 2 + H,) * 2
    act = (8 * H + 2 * (1024 + 2 * 1024)) * 2                      # attention's 8h, k = 2 copies of h + 2 F_e
    main = MemoryConfig(params=sum(pieces), param_pieces=pieces, dp=4, tp=2, pp=2, zero_stage=1, layers=4,
                        seq_len=1024, micro_batch=2, act_bytes_per_token_per_layer=act,
                        act_replicated_bytes_per_token_per_layer=8 * H, sequence_parallel=True,
                        input_bytes_per_token=2 * H, **DTYPES)
    routed = 2 * (4 // 2) * 2 * H * 1024                           # 2 layers x E/ep experts of 2 h F_e, whole
    experts = MemoryConfig(params=4 * routed, param_pieces=(routed,) * 4, dp=2, tp=2, pp=2, zero_stage=1,
                           layers=4, **DTYPES)
    got = []
    for stage in (0, 1):
        a = per_rank_bytes(main, rank=stage * 8, in_flight=peak_activations_in_flight("1f1b", 2, 8, rank=stage))
        b = per_rank_bytes(experts, rank=stage * 4)
        kinds = {k: a[k] + (b[k] if k not in ("activations", "batch") else 0) for k in a if k != "total"}
        got.append({**kinds, "total": sum(kinds.values())})
    assert gpu_memory(job, lay) == max(got, key=lambda g: g["total"])


def test_in_flight_multiplies_sets_but_not_the_recomputed_layer():
    base = MemoryConfig(params=10 ** 6, layers=8, pp=2, seq_len=128, micro_batch=2,
                        act_bytes_per_token_per_layer=1000.0, input_bytes_per_token=100.0)
    assert activation_bytes(base, in_flight=3) == 3 * activation_bytes(base)
    ck = replace(base, checkpointing=True)
    kept = 4 * 2 * 128 * 100                                       # 4 layers' inputs of one set
    full = 2 * 128 * 1000                                          # one layer recomputed at a time
    assert activation_bytes(ck) == kept + full
    assert activation_bytes(ck, in_flight=3) == 3 * kept + full
    assert activation_bytes(ck, in_flight=Fraction(5, 2)) == 5 * kept // 2 + full
    with pytest.raises(ValueError, match="in_flight"):
        activation_bytes(base, in_flight=-1)
