"""Chapter 04: tensor parallelism and sequence vs context parallelism, checked against one device and the formulas."""
from __future__ import annotations

import math

import pytest
import torch

from wmdist.costs import tensor_parallel as C
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.tensor_parallel import demos as D
from wmdist.tensor_parallel.block import block_shape

SHAPE = block_shape(D.CONFIG, D.BATCH, D.SEQ)


pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks


# --- the formulas, without processes ---------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 9))
def test_sp_moves_the_same_bytes_as_tp_all_ranks_together(n):
    def activation(layout):
        return [c for c in C.block_schedule(SHAPE, n, layout=layout) if not c.site.startswith("sequence")]
    tp, sp, again = (sum(C.schedule_bytes(activation(lay), r) for r in range(n)) for lay in C.BLOCK_LAYOUTS)
    g = SHAPE.batch * SHAPE.seq * SHAPE.width * 4
    assert tp == sp == C.megatron_group_bytes(SHAPE.batch, SHAPE.seq, SHAPE.width, n) == 8 * (n - 1) * g
    assert again - sp == 2 * (n - 1) * g                        # Megatron's re-gather: two all-gathers more
    assert C.megatron_layer_bytes(2, 12, 32, n, sequence_parallel=True) == \
        C.megatron_layer_bytes(2, 12, 32, n, sequence_parallel=False)
    counts = [C.op_counts(C.block_schedule(SHAPE, n, layout=lay)) for lay in C.BLOCK_LAYOUTS]
    assert counts == ([{}] * 3 if n == 1 else [{"all-reduce": 4}, {"all-gather": 4, "reduce-scatter": 4, "all-reduce": 1},
                                               {"all-gather": 6, "reduce-scatter": 4, "all-reduce": 1}])


def test_ring_bytes_of_uneven_chunks():
    col = C.Collective("x", "forward", "reduce-scatter", (3, 2, 2))
    assert [col.bytes_sent(r, elem_size=1) for r in range(3)] == [4, 5, 5] and col.rounds == 2
    gather = C.Collective("x", "forward", "all-gather", (3, 2, 2))
    # all but the right neighbour's chunk
    assert [gather.bytes_sent(r, elem_size=1) for r in range(3)] == [5, 5, 4]
    assert C.Collective("x", "forward", "all-reduce", (1,)).bytes_sent(0) == 0
    with pytest.raises(ValueError, match="op must be one of"):
        C.Collective("x", "forward", "broadcast", (1, 1))


def test_needless_gather_costs_two_all_gathers_of_the_hidden_activation():
    for n in (2, 3, 8):
        good, gathered = (C.mlp_schedule(SHAPE, n, layout=lay) for lay in C.MLP_LAYOUTS[:2])
        # the row layer reads fc1's shards as they are
        assert C.op_counts(good) == {"all-reduce": 2}
        hidden = [SHAPE.batch * SHAPE.seq * f for f in C.shard_sizes(SHAPE.hidden, n)]
        extra = [C.schedule_bytes(gathered, r) - C.schedule_bytes(good, r) for r in range(n)]
        assert extra == [2 * 4 * (sum(hidden) - hidden[(r + 1) % n]) for r in range(n)]
    assert {lay: sum(C.op_counts(C.mlp_schedule(SHAPE, 4, layout=lay)).values()) for lay in C.MLP_LAYOUTS} == \
        dict(zip(C.MLP_LAYOUTS, (2, 4, 4, 4)))


def test_korthikanti_formulas():
    s, b, h, a = 2048, 1, 12288, 96
    one = C.korthikanti_layer_bytes(s, b, h, a)
    assert one == s * b * h * (34 + 5 * a * s / h)
    assert C.korthikanti_layer_bytes(s, b, h, a, t=1, sequence_parallel=True) == one
    assert math.isclose(C.korthikanti_layer_bytes(s, b, h, a, t=8, sequence_parallel=True), one / 8)
    tp = C.korthikanti_layer_bytes(s, b, h, a, t=8)
    assert math.isclose(tp - one / 8, s * b * h * 10 * (1 - 1 / 8))      # 10sbh stays whole without SP


def test_our_block_bytes_split_like_the_memory_model():
    per_token = C.block_elements_per_token(SHAPE.width, SHAPE.heads, SHAPE.hidden)
    assert per_token == 16 * SHAPE.width + 4 + SHAPE.heads
    single = C.block_saved_elements(SHAPE, 1, 0, layout="single")
    assert single == SHAPE.batch * SHAPE.seq * per_token
    for n in (2, 4):                                                      # n divides heads, hidden and tokens
        assert [C.block_saved_elements(SHAPE, n, r, layout="sp-regather") * n for r in range(n)] == [single] * n
        tp, sp = (C.block_saved_elements(SHAPE, n, 0, layout=lay) for lay in ("tp", "sp"))
        assert tp > sp > single // n


def test_bad_sizes_are_refused_before_any_process_starts(no_processes):
    for call, word in [(lambda: D.tp_block_demo(9), "more than the 8 attention heads"),
                       (lambda: D.tp_block_demo(0), "world_size must be an integer"),
                       (lambda: D.sp_cp_demo(4, seq=3), "more than the 3 tokens"),
                       (lambda: D.tp_layouts_demo(2, batch=0), "batch must be"),
                       (lambda: D.tp_dtensor_demo(9), "does not divide the MLP hidden width 840"),
                       (lambda: C.BlockShape(batch=1, seq=1, width=30, heads=4, hidden=8), "divisible by heads")]:
        with pytest.raises(ValueError, match=word):
            call()


# --- real ranks -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 9))
def test_every_demo_passes_at_every_world_size(n):
    block = D.tp_block_demo(n)
    assert block.passed, block.failures
    assert block.measured(quantity="all-reduce calls", case="tp") == [4 if n > 1 else 0] * n
    layouts = D.tp_layouts_demo(n)
    assert layouts.passed, layouts.failures
    assert layouts.measured(quantity="all-gather calls", case="column -> row") == [0] * n   # shards consumed as is
    assert layouts.measured(quantity="extra bytes sent for the needless gather") == \
        layouts.predicted(quantity="extra bytes sent for the needless gather")
    both = D.sp_cp_demo(n)
    assert both.passed, both.failures
    assert both.check("PITFALL CP masking with local positions: output differs from one device").passed if n > 1 \
        else both.check("one rank: local positions are the global ones, so the local mask is right").passed
    saved = both.data.saved_bytes
    assert sum(saved["sp-regather"]) == both.data.single_saved_bytes     # split, nothing repeated: sum = one device
    if n > 1:
        assert max(saved["sp-regather"]) < max(saved["sp"]) < max(saved["tp"]) < both.data.single_saved_bytes


@pytest.mark.parametrize("n", [1, 3])
def test_ours_matches_torch_dtensor(n):
    report = D.tp_dtensor_demo(n)
    assert report.passed, report.failures
    assert report.measured(quantity="all-reduce calls, torch (dispatched)") == \
        report.measured(quantity="all-reduce calls", case="ours") == [2 if n > 1 else 0] * n


@pytest.mark.parametrize("n", [2, 4])
def test_memory_model_agrees_with_the_runs(n):
    """The calculator's activation bytes equal the bytes the ranks kept for backward, without and with SP."""
    report = D.sp_cp_demo(n)
    per_token = 4 * C.block_elements_per_token(SHAPE.width, SHAPE.heads, SHAPE.hidden)
    replicated = 4 * C.replicated_elements_per_token(SHAPE.width)
    for sp, layout in ((False, "tp"), (True, "sp-regather")):
        cfg = MemoryConfig(params=1, tp=n, layers=1, micro_batch=SHAPE.batch, seq_len=SHAPE.seq, sequence_parallel=sp,
                           act_bytes_per_token_per_layer=per_token, act_replicated_bytes_per_token_per_layer=replicated)
        assert [per_rank_bytes(cfg, rank=r)["activations"] for r in range(n)] == report.data.saved_bytes[layout]
    old_rule = MemoryConfig(params=1, tp=n, layers=1, micro_batch=SHAPE.batch, seq_len=SHAPE.seq,
                            act_bytes_per_token_per_layer=per_token)    # no replicated part declared: all / tp
    assert per_rank_bytes(old_rule)["activations"] == report.data.saved_bytes["sp-regather"][0]


def _gradcheck_layers(ctx):
    """gradcheck every ColumnParallelLinear / RowParallelLinear variant (float64, one rank: the backward formulas)."""
    from wmdist.tensor_parallel.layers import ColumnSpec, RowSpec, column_linear, row_linear, tp_group
    tp = tp_group(ctx)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    specs = [(column_linear, ColumnSpec(site="c")), (column_linear, ColumnSpec(site="c", gather=(5,))),
             (column_linear, ColumnSpec(site="c", tokens=(3,))),
             (column_linear, ColumnSpec(site="c", tokens=(3,), regather=True)),
             (row_linear, RowSpec(site="r")), (row_linear, RowSpec(site="r", split=(4,))),
             (row_linear, RowSpec(site="r", tokens=(3,)))]
    return [torch.autograd.gradcheck(lambda *t, f=f, s=s: f(*t, tp, s), (x, w, b)) for f, s in specs]


def test_hand_written_backward_passes_gradcheck():
    from wmdist.runtime import run
    assert run(_gradcheck_layers, 1) == [[True] * 7]
