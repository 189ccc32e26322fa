"""Chapter 06, single process: blockwise attention equals SDPA (values and gradients), merges are exact
where they must be, the ring's layouts count work exactly, and the byte and memory formulas hold."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from wmdist.costs import ring_attention as costs
from wmdist.ring_attention import blockwise, layout
from wmdist.ring_attention.blockwise import attend_block, attend_block_backward, block_is_future, merge
from wmdist.ring_attention.tolerance import (ROUNDOFF, SECOND_ORDER, attention_tolerance, exact_attention,
                                             rounding_bounds)

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks


def _inputs(shape, dtype, seed, count=4):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(count)]


def _assert_within(got, want, bound, what):
    gap = (got.double() - want.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(gap)
    assert (gap <= bound).all(), f"{what}: max gap {gap.max():.3g}, bound there {bound.flatten()[gap.argmax()]:.3g}"


CASES = [(24, 8), (24, 24), (25, 8), (23, 5), (7, 16), (10, 1)]   # (S, block): divides, = S, does not, > S, 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_len,block", CASES)
def test_blockwise_equals_sdpa_values_and_gradients(dtype, causal, seq_len, block):
    q, k, v, dout = _inputs((2, 3, seq_len, 8), dtype, seed=seq_len * 31 + block)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    got = blockwise.blockwise_attention(q, k, v, block_size=block, causal=causal)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(got.out, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    ex = exact_attention(q, k, v, dout, causal=causal)
    tol = attention_tolerance(ex, dtype, min(block, seq_len), math.ceil(seq_len / block))
    _assert_within(got.out, want, tol.out, "out")
    _assert_within(got.lse, ex.lse, tol.lse, "lse")
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        _assert_within(g, w, getattr(tol, name), name)
    assert got.largest_score_bytes == costs.score_tile_bytes(min(block, seq_len), min(block, seq_len), heads=3, batch=2,
                                                             elem_size=q.element_size())


def test_fully_masked_rows_give_zero_output_and_no_nan():
    q, k, v, dout = _inputs((1, 2, 4, 8), torch.float64, seed=1)
    q_pos, k_pos = torch.tensor([0, 1, 5, 6]), torch.tensor([2, 3, 4, 5])   # queries 0, 1 see no key
    out, lse = attend_block(q, k, v, q_pos, k_pos, causal=True)
    assert torch.isneginf(lse[..., :2]).all() and torch.isfinite(lse[..., 2:]).all()
    assert torch.equal(out[..., :2, :], torch.zeros_like(out[..., :2, :])) and torch.isfinite(out).all()
    grads = attend_block_backward(q, k, v, out, lse, dout, q_pos, k_pos, causal=True)
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][..., :2, :], torch.zeros_like(grads[0][..., :2, :]))


def test_block_is_future_uses_global_positions():
    assert block_is_future(torch.arange(0, 4), torch.arange(4, 8))
    assert not block_is_future(torch.arange(4, 8), torch.arange(0, 4))
    assert not block_is_future(torch.tensor([0, 7]), torch.tensor([5, 6]))     # zigzag rows: 7 sees 5, 6
    assert not block_is_future(torch.tensor([3]), torch.tensor([3]))           # the diagonal is visible
    with pytest.raises(ValueError, match="non-empty 1-D"):
        block_is_future(torch.arange(0), torch.arange(3))


def _partials(seed, dtype, sizes=(3, 5, 4)):
    """Partial attentions of the same 6 queries over disjoint key blocks, and the exact whole."""
    (q,) = _inputs((2, 2, 6, 8), dtype, seed, count=1)
    keys = [_inputs((2, 2, n, 8), dtype, seed + 1 + i, count=2) for i, n in enumerate(sizes)]
    pos = torch.arange(6)
    parts = [attend_block(q, kb, vb, pos, torch.arange(kb.shape[2]), causal=False) for kb, vb in keys]
    k_all, v_all = torch.cat([kb for kb, _ in keys], 2), torch.cat([vb for _, vb in keys], 2)
    return parts, exact_attention(q, k_all, v_all, torch.zeros_like(q), causal=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merge_is_commutative_exactly_and_associative_up_to_rounding(dtype):
    (a, b, c), ex = _partials(seed=7, dtype=dtype)
    ab, ba = merge(*a, *b), merge(*b, *a)
    assert torch.equal(ab[0], ba[0]) and torch.equal(ab[1], ba[1])        # same operations, operands swapped
    left, right = merge(*ab, *c), merge(*a, *merge(*b, *c))
    # Each grouping is blockwise attention over 3 blocks of at most 5 keys: bound both against the exact whole.
    tol = rounding_bounds(ex, ROUNDOFF[dtype], 5, 3, 1.0)
    for got in (left, right):
        _assert_within(got[0], ex.o, SECOND_ORDER * tol.out, "out")
        _assert_within(got[1], ex.lse, SECOND_ORDER * tol.lse, "lse")
    _assert_within(left[0], right[0], SECOND_ORDER * 2 * tol.out, "regrouped out")


def test_merge_with_an_empty_block_is_exact():
    (a, _, _), _ = _partials(seed=3, dtype=torch.float32)
    empty = (torch.zeros_like(a[0]), torch.full_like(a[1], -math.inf))
    for merged in (merge(*a, *empty), merge(*empty, *a)):
        assert torch.equal(merged[0], a[0]) and torch.equal(merged[1], a[1])
    both = merge(*empty, *empty)
    assert torch.equal(both[0], empty[0]) and torch.isneginf(both[1]).all()


def _ring_in_one_process(q, k, v, dout, world_size, kind, causal):
    """What N ranks do, step by step: queries stay, K/V blocks visit in ring order, dK/dV go home."""
    held = [torch.tensor(layout.rank_positions(q.shape[2], world_size, r, layout=kind)) for r in range(world_size)]
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=q.dtype)
    skipped, visits = [], []
    for r, qp in enumerate(held):
        acc = None
        for t in range(world_size):
            kp = held[layout.ring_source(r, t, world_size)]
            if causal and block_is_future(qp, kp):
                skipped.append((r, t))
                continue
            visits.append((r, t))
            part = attend_block(q[:, :, qp], k[:, :, kp], v[:, :, kp], qp, kp, causal=causal)
            acc = part if acc is None else merge(*acc, *part)
        out[:, :, qp], lse[:, :, qp] = acc
    grads = [torch.zeros_like(x) for x in (q, k, v)]
    for r, t in visits:
        qp, kp = held[r], held[layout.ring_source(r, t, world_size)]
        gq, gk, gv = attend_block_backward(q[:, :, qp], k[:, :, kp], v[:, :, kp], out[:, :, qp], lse[:, :, qp],
                                           dout[:, :, qp], qp, kp, causal=causal)
        grads[0][:, :, qp] += gq
        grads[1][:, :, kp] += gk
        grads[2][:, :, kp] += gv
    return out, grads, skipped


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", layout.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_block_functions_driven_as_a_ring_equal_sdpa(world_size, kind, causal):
    seq_len = 24
    q, k, v, dout = _inputs((2, 2, seq_len, 8), torch.float32, seed=world_size)
    out, grads, skipped = _ring_in_one_process(q, k, v, dout, world_size, kind, causal)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    want_grads = torch.autograd.grad(want, (qr, kr, vr), dout)
    tol = attention_tolerance(exact_attention(q, k, v, dout, causal=causal), torch.float32, seq_len // world_size,
                              world_size)
    _assert_within(out, want, tol.out, "out")
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        _assert_within(g, w, getattr(tol, name), name)
    assert skipped == (layout.skipped_steps(seq_len, world_size, layout=kind) if causal else [])


def _mask_count(q_positions, k_positions, causal):
    """Brute force: build the explicit mask of the full sequence and count the entries a rank computes."""
    full = torch.tril(torch.ones(48, 48, dtype=torch.bool)) if causal else torch.ones(48, 48, dtype=torch.bool)
    return int(full[torch.tensor(q_positions)][:, torch.tensor(k_positions)].sum())


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("kind", layout.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_layout_work_matches_an_explicit_mask(world_size, kind, causal):
    seq_len = 48
    held = [layout.rank_positions(seq_len, world_size, r, layout=kind) for r in range(world_size)]
    assert sorted(p for pos in held for p in pos) == list(range(seq_len))     # a partition of the sequence
    work = layout.step_work(seq_len, world_size, layout=kind, causal=causal)
    for r in range(world_size):
        for t in range(world_size):
            assert work[r][t] == _mask_count(held[r], held[(r - t) % world_size], causal)
    assert sum(map(sum, work)) == (seq_len * (seq_len + 1) // 2 if causal else seq_len ** 2)


def test_causal_balance_contiguous_grows_with_rank_zigzag_is_equal():
    seq_len, n = 48, 4
    c, h = seq_len // n, seq_len // (2 * n)
    contiguous = layout.rank_work(seq_len, n, layout="contiguous", causal=True)
    assert contiguous == [r * c * c + c * (c + 1) // 2 for r in range(n)]
    assert contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1]
    assert layout.rank_work(seq_len, n, layout="zigzag", causal=True) == [2 * n * h * h + h] * n
    assert layout.skipped_steps(seq_len, n, layout="contiguous") == [(r, t) for r in range(n) for t in range(r + 1, n)]
    assert layout.skipped_steps(seq_len, n, layout="zigzag") == []
    assert [layout.ring_source(2, t, 4) for t in range(4)] == [2, 1, 0, 3]


@pytest.mark.parametrize("seq_len,block", [(32, 8), (30, 7), (16, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_counts_match_what_blockwise_computes(monkeypatch, seq_len, block, causal):
    calls = []
    real = blockwise.attend_block
    monkeypatch.setattr(blockwise, "attend_block", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, _ = _inputs((1, 1, seq_len, 4), torch.float32, seed=0)
    blockwise.blockwise_attention(q, k, v, block_size=block, causal=causal)
    assert len(calls) == layout.tile_pairs(seq_len, 1, layout="contiguous", block_size=block, causal=causal)[0][0]
    tiles = math.ceil(seq_len / block)
    assert len(calls) == (tiles * (tiles + 1) // 2 if causal else tiles ** 2)


@pytest.mark.parametrize("call,message", [
    (lambda: layout.check_layout(10, 4, layout="contiguous"), "divisible by 4"),
    (lambda: layout.check_layout(12, 4, layout="zigzag"), "divisible by 8"),
    (lambda: layout.check_layout(4, 5, layout="contiguous"), "world_size must be <= seq_len"),
    (lambda: layout.check_layout(8, 2, layout="striped"), "layout must be one of"),
    (lambda: layout.tile_pairs(16, 2, layout="contiguous", block_size=9, causal=True),
     "block_size must be an integer from 1 to 8"),
    (lambda: layout.tile_pairs(16, 2, layout="contiguous", block_size=0, causal=True), "block_size"),
    (lambda: layout.ring_source(0, 4, 4), "step"),
    (lambda: costs.ring_kv_bytes_per_rank(10, 4, 8, elem_size=2), "divisible by world_size"),
    (lambda: costs.min_overlap_block_size(1e12, 0.0, elem_size=2), "link_bytes_per_s"),
    (lambda: blockwise.blockwise_attention(*_inputs((1, 1, 4, 2), torch.float32, 0, 3), block_size=0, causal=False),
     "block_size"),
])
def test_bad_arguments_are_refused_with_the_reason(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_kv_bytes_flops_and_memory_by_hand():
    # S = 8 tokens on N = 4 ranks: blocks of 2 tokens; d_KV = 6, batch 2, bf16 -> 2*6*2*2 = 48 bytes a block.
    assert costs.kv_block_bytes(8, 4, 6, batch=2, elem_size=2) == 48
    assert costs.ring_kv_bytes_per_rank(8, 4, 6, batch=2, elem_size=2) == 3 * 48                       # N-1 sends
    # the paper's loop
    assert costs.ring_kv_bytes_per_rank(8, 4, 6, batch=2, final_exchange=True, elem_size=2) == 4 * 48
    assert costs.ring_kv_bytes_per_rank(8, 1, 6, elem_size=2) == 0 and costs.ring_kv_sends(1, final_exchange=True) == 1
    assert costs.ring_kv_storage_bytes(8, 4, 6, batch=2, elem_size=2) == 96
    # Doubling S doubles the bytes sent (linear) but quadruples the FLOPs (quadratic).
    assert costs.ring_kv_bytes_per_rank(16, 4, 6, elem_size=2) == 2 * costs.ring_kv_bytes_per_rank(8, 4, 6, elem_size=2)
    assert costs.attention_flops(16, 3) == 4 * costs.attention_flops(8, 3)
    # S = 4, head_dim 3: 16 pairs * 4 * 3 = 192 FLOPs; causal keeps 4+3+2+1 = 10 pairs -> 120.
    assert costs.attention_flops(4, 3) == 192 and costs.attention_flops(4, 3, causal=True) == 120
    assert costs.attention_flops(4, 3, heads=2, batch=5) == 192 * 10
    assert costs.score_tile_bytes(4, 3, heads=2, batch=5, elem_size=4) == 4 * 3 * 2 * 5 * 4
    assert costs.full_scores_bytes(4, heads=2, batch=5) == 4 * 4 * 2 * 5 * 4


def test_overlap_condition_block_size():
    # bf16: a step computes 4 d c^2 FLOPs and sends 4 c d bytes, so c >= F / B.
    assert costs.block_pair_flops(10, 3) == 1200 and costs.kv_step_bytes(10, 3, elem_size=2) == 120
    assert costs.min_overlap_block_size(312e12, 300e9, elem_size=2) == 1040                   # exact ratio: no round-up
    assert costs.min_overlap_block_size(312e12, 300e9, elem_size=4) == 2080       # fp32 K, V: twice the bytes
    f, b = 1e12, 3e9                                                              # F/B = 333.3...
    c = costs.min_overlap_block_size(f, b, elem_size=2)
    assert c == 334
    hides = [costs.block_pair_flops(x, 64) / f >= costs.kv_step_bytes(x, 64, elem_size=2) / b for x in (c - 1, c)]
    assert hides == [False, True]
    assert costs.min_overlap_seq_len(f, b, world_size=8, elem_size=2) == 8 * 334
    # a block has a token at least
    assert costs.min_overlap_block_size(1e6, 1e9, elem_size=2) == 1


def test_temporary_score_memory_depends_on_block_size_not_sequence_length():
    # Bytes alive at once beyond the results, read from the profiler's allocation records.
    small, large = (blockwise.peak_score_bytes(2, 2, s, 16, 16, causal=True) for s in (64, 128))
    assert small.forward.temporary == large.forward.temporary
    assert small.backward.temporary == large.backward.temporary
    for mem in (small.forward, small.backward):
        # At least the one score tile the code allocates; at most what the code holds at once: two score
        # tiles (scores and softmax's exp, or P and dP), the boolean causal mask (1 byte an entry), five
        # (B, H, block, D) tensors (partial and running outputs, the merge's two products and its sum;
        # or dV, dO*out, dq and dk shares) and eight (B, H, block) row vectors (lse, shift, weights, max).
        rows = small.block_rows // 16
        assert small.tile <= mem.temporary <= 2 * small.tile + 16 * 16 + 5 * small.block_rows + 8 * rows
    assert large.forward.temporary < large.full_scores / 10
    q, k, v, _ = _inputs((2, 2, 128, 16), torch.float32, seed=0)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):     # unblocked: S x S scores
        _, naive = blockwise.measure_allocations(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert naive.temporary >= large.full_scores
