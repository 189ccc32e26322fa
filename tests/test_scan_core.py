"""Chapter 07, single process: every grouping of the affine scan equals the loop, counts match the
formulas, and the nonlinear cell's time axis splits only with boundary states (or Picard sweeps)."""
from __future__ import annotations

import math
import re

import pytest
import torch

from wmdist.costs import scan as costs
from wmdist.costs.rounding import FLOAT32_ROUNDOFF, FLOAT64_ROUNDOFF
from wmdist.scan import affine, cell

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks
ROUNDOFF = {torch.float64: FLOAT64_ROUNDOFF, torch.float32: FLOAT32_ROUNDOFF}


def _abs_states(A, b, h0):
    """The loop run on |A|, |b|, |h0| in float64: bounds every term of every grouping (no cancellation)."""
    return affine.sequential(A.double().abs(), b.double().abs(), h0.double().abs())


def _assert_within(x, y, depth_x, depth_y, A, b, h0, diagonal):
    """|x - y| <= (gamma(c D_x) + gamma(c D_y)) |h|_abs elementwise: costs.scan.reassociation_bound.

    Both are sums of the same products, grouped differently; along any path a
    compose or apply rounds at most c = n + 1 times (2 for diagonal A), and
    a schedule of depth D chains D of them. So the bound scales with the
    depths (T for the loop, ~log2 T for the scan), n, and the magnitudes.
    """
    factor = costs.reassociation_bound(depth_x, depth_y, b.shape[-1], diagonal=diagonal,
                                       unit_roundoff=ROUNDOFF[x.dtype])
    gap = (x.double() - y.double()).abs()
    bound = factor * _abs_states(A, b, h0)
    assert (gap <= bound).all(), f"max gap {gap.max():.3g} vs bound there {bound.flatten()[gap.argmax()]:.3g}"


CASES = [(1, 1), (5, 1), (7, 7), (12, 4), (13, 4), (13, 5), (37, 6)]   # (T, N): N divides T or not, N = T, T = 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("diagonal", [True, False])
@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("steps, chunks", CASES)
def test_every_grouping_equals_the_loop(steps, chunks, n, diagonal, dtype):
    A, b, h0 = affine.random_system(3, steps, n, diagonal=diagonal, radius=0.95, seed=steps * 100 + n, dtype=dtype)
    ref = affine.sequential(A, b, h0)
    d_seq = costs.sequential_ops(steps).depth
    gathered = affine.chunked(A, b, h0, chunks, combine="gathered")
    handoff = affine.chunked(A, b, h0, chunks, combine="handoff")
    assert torch.equal(gathered, handoff)                    # the same applies in the same order
    first = costs.time_chunk_sizes(steps, chunks)[0]
    assert torch.equal(handoff[:, :first], ref[:, :first])   # chunk 0 replays the loop's own operations
    _assert_within(handoff, ref, costs.chunked_ops(steps, chunks).depth, d_seq, A, b, h0, diagonal)
    _assert_within(affine.associative_scan(A, b, h0), ref, costs.hillis_steele_ops(steps).depth, d_seq,
                   A, b, h0, diagonal)
    _assert_within(affine.torch_associative_scan(A, b, h0), ref, costs.blelloch_ops(steps).depth, d_seq,
                   A, b, h0, diagonal)


@pytest.mark.parametrize("diagonal", [True, False])
def test_a_wrong_order_is_caught(diagonal):
    # The tolerance is not vacuous: composing in the wrong order (A1 A2) breaks it by orders of magnitude.
    A, b, h0 = affine.random_system(2, 12, 4, diagonal=diagonal, seed=3, dtype=torch.float32)
    pieces = affine.split_chunks(A, b, 4)
    backwards = [affine.chunk_summary(Ac.flip(1), bc.flip(1)) for Ac, bc in pieces]   # folds last step first
    incoming = affine.incoming_by_handoff(backwards, h0)
    wrong = torch.cat([affine.apply_incoming(Ac, bc, h) for (Ac, bc), h in zip(pieces, incoming)], dim=1)
    with pytest.raises(AssertionError):
        _assert_within(wrong, affine.sequential(A, b, h0), 12, 12, A, b, h0, diagonal)


def test_compose_means_first_then_second():
    for diagonal in (True, False):
        A, b, h = affine.random_system(2, 2, 5, diagonal=diagonal, seed=7)
        first, second = (A[:, 0], b[:, 0]), (A[:, 1], b[:, 1])
        two_steps = affine.apply_map(second, affine.apply_map(first, h))
        torch.testing.assert_close(affine.apply_map(affine.compose(first, second), h), two_steps,
                                   rtol=0, atol=1e-14)      # float64, a handful of roundings on O(1) values


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 8, 13, 16, 37, 64])
@pytest.mark.parametrize("diagonal", [True, False])
def test_counts_equal_the_formulas(steps, diagonal):
    A, b, h0 = affine.random_system(2, steps, 3, diagonal=diagonal, seed=steps)
    tally = affine.Tally()
    affine.associative_scan(A, b, h0, tally=tally)
    hs = costs.hillis_steele_ops(steps)
    assert (tally.composes, tally.applies, tally.calls) == (hs.composes, hs.applies, hs.depth)
    tally = affine.Tally()
    affine.sequential(A, b, h0, tally=tally)
    assert (tally.composes, tally.applies, tally.calls) == (0, steps, costs.sequential_ops(steps).depth)
    tally = affine.Tally()
    affine.chunk_summary(A, b, tally=tally)
    assert tally.composes == costs.fold_ops(steps).composes == steps - 1
    for chunks in {1, min(steps, 3), steps}:
        for combine in costs.COMBINES:
            tally = affine.Tally()
            affine.chunked(A, b, h0, chunks, combine=combine, tally=tally)
            ops = costs.chunked_ops(steps, chunks, combine=combine)
            assert (tally.composes, tally.applies) == (ops.composes, ops.applies)


@pytest.mark.parametrize("steps", list(range(1, 34)) + [64, 100])
def test_blelloch_counts_are_torchs_generic_scan(steps):
    """costs.blelloch_ops counts what torch's generic scan really does: calls are its dependent levels."""
    from torch._higher_order_ops.associative_scan import generic_associative_scan

    sizes = []

    def counting(a1, b1, a2, b2):                             # scan axis first; empty calls do nothing
        if b1.shape[0]:
            sizes.append(b1.shape[0])
        return list(affine.compose((a1, b1), (a2, b2)))

    generic_associative_scan(counting, [torch.rand(steps, 1, 2), torch.rand(steps, 1, 2)])
    ops = costs.blelloch_ops(steps)
    assert (sum(sizes), len(sizes) + 1) == (ops.composes, ops.depth)


@pytest.mark.parametrize("k", range(11))
def test_closed_forms_at_powers_of_two(k):
    t = 2 ** k
    assert costs.hillis_steele_ops(t) == costs.OpCount(k * t - t + 1, t, k + 1)
    if k:
        assert costs.blelloch_ops(t) == costs.OpCount(2 * t - 2 - k, t, 2 * k - 1 + 1)
    assert costs.fold_ops(t) == costs.OpCount(t - 1, 0, t - 1)
    assert costs.sequential_ops(t).depth == t


@pytest.mark.parametrize("steps, chunks", [(1, 1), (9, 1), (12, 4), (13, 4), (13, 5), (40, 7)])
def test_chunked_depth(steps, chunks):
    sizes = costs.time_chunk_sizes(steps, chunks)
    expected = steps if chunks == 1 else (sizes[0] - 1) + (chunks - 1) + sizes[-1]
    for combine in costs.COMBINES:
        ops = costs.chunked_ops(steps, chunks, combine=combine)
        assert ops.depth == expected and ops.composes == steps - chunks
    assert costs.chunked_ops(steps, chunks, combine="handoff").applies == steps + chunks - 1
    assert costs.chunked_ops(steps, chunks, combine="gathered").applies == steps + chunks * (chunks - 1) // 2


@pytest.mark.parametrize("diagonal", [True, False])
def test_summary_bytes_are_what_a_rank_holds_and_do_not_grow_with_t(diagonal):
    n, batch, world = 5, 3, 4
    A, b, _ = affine.random_system(batch, 40, n, diagonal=diagonal, dtype=torch.float32)
    for length in (1, 7, 40):
        sA, sb = affine.chunk_summary(A[:, :length], b[:, :length])
        assert sA.numel() + sb.numel() == costs.summary_elements(n, batch, diagonal=diagonal)
    per_summary = batch * ((n if diagonal else n * n) + n) * 4
    gather = costs.allgather_summary_bytes(n, batch, world, diagonal=diagonal)
    assert gather == {"bytes_sent": (world - 1) * per_summary, "bytes_recv": (world - 1) * per_summary,
                      "messages": world - 1}
    state = batch * n * 4
    hops = [costs.handoff_bytes(n, batch, world, r) for r in range(world)]
    assert [h["bytes_sent"] for h in hops] == [state, state, state, 0]
    assert [h["bytes_recv"] for h in hops] == [0, state, state, state]
    assert sum(h["messages"] for h in hops) == costs.handoff_hops(world) == world - 1


@pytest.mark.parametrize("call, message", [
    (lambda: costs.time_chunk_sizes(3, 4), "chunks must be <= steps"),
    (lambda: costs.time_chunk_sizes(0, 1), "steps must be an integer >= 1"),
    (lambda: costs.time_chunk_sizes(5, 0), "chunks must be an integer >= 1"),
    (lambda: affine.chunked(*affine.random_system(1, 3, 2, diagonal=True), chunks=4), "chunks must be <= steps"),
    (lambda: affine.sequential(torch.zeros(1, 3, 4, 4), torch.zeros(1, 3, 3), torch.zeros(1, 3)), "A must be"),
    (lambda: affine.sequential(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4), torch.zeros(1, 3)), "h0 must be"),
    (lambda: affine.sequential(torch.zeros(1, 0, 4), torch.zeros(1, 0, 4), torch.zeros(1, 4)), "T (b.shape[1])"),
    (lambda: affine.sequential(torch.zeros(1, 2, 4, 4, 4), torch.zeros(1, 2, 4), torch.zeros(1, 4)), "A must have"),
    (lambda: affine.sequential(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, dtype=torch.float64), torch.zeros(1, 4)),
     "share one dtype"),
    (lambda: affine.chunked(*affine.random_system(1, 3, 2, diagonal=True), chunks=2, combine="ring"),
     "combine must be"),
    (lambda: costs.chunked_rank_ops(8, 2, 2), "rank must be an integer from 0 to 1"),
    (lambda: costs.reassociation_bound(10 ** 9, 1, 16, diagonal=False, unit_roundoff=FLOAT32_ROUNDOFF), "too deep"),
])
def test_bad_inputs_are_refused_clearly(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_timing_helper_returns_rows_for_a_plot():
    rows = affine.time_scans(steps=(4, 9), state_size=2, batch=1, repeats=1)
    assert [r["steps"] for r in rows] == [4, 9]
    assert all(set(r) == {"steps", "sequential_s", "hillis_steele_s", "torch_scan_s"} for r in rows)


# ---- the nonlinear cell -------------------------------------------------------------------------

def _episodes(batch=4, steps=48, dtype=torch.float32, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, steps, 8, generator=g, dtype=torch.float64).to(dtype)
    h0 = (torch.rand(batch, 16, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    return x, h0


def test_chunks_from_zero_are_wrong():
    gru = cell.GRUCell.seeded(16, 8, seed=1, dtype=torch.float32)
    x, h0 = _episodes()
    exact = cell.rollout(gru, x, h0)
    err = cell.step_errors(cell.chunk_from_zero(gru, x, h0, 4), exact)        # (T,)
    assert err.shape == (48,) and torch.all(err[:12] == 0)                    # chunk 0 knew its start
    # Two correct evaluations of one step can differ by at most reordering_bound(.., 1, ..) (~1e-4 here);
    # the first step of every later chunk is off by over a hundred times that: no rounding explains it.
    one_step = cell.reordering_bound(gru, 1, float(x.abs().max()), FLOAT32_ROUNDOFF)
    assert torch.all(err[[12, 24, 36]] > 100 * one_step)


@pytest.mark.parametrize("steps, chunks", [(48, 4), (13, 5), (7, 7), (6, 1)])
def test_picard_is_exact_after_n_sweeps_bitwise(steps, chunks):
    gru = cell.GRUCell.seeded(16, 8, seed=1, dtype=torch.float32)
    x, h0 = _episodes(steps=steps)
    exact = cell.rollout(gru, x, h0)
    ends = [sum(costs.time_chunk_sizes(steps, chunks)[:k + 1]) for k in range(chunks)]
    for sweeps in range(1, chunks + 1):
        res = cell.picard(gru, x, h0, chunks, sweeps=sweeps)
        # After sweep k (k = sweeps - 1) the first k+1 chunks start from the true state bit for bit and
        # call the cell on the same tensors in the same order as rollout: bitwise equal.
        assert torch.equal(res.states[:, :ends[sweeps - 1]], exact[:, :ends[sweeps - 1]])
        assert res.work == costs.picard_work(steps, sweeps) == sweeps * steps
    assert torch.equal(res.states, exact) and res.errors[-1] == 0.0 and res.changes[-1] == 0.0
    assert all(c > 0 for c in res.changes[:-1])               # a rank sees convergence: no boundary moved
    assert res.errors[0] == float((cell.chunk_from_zero(gru, x, h0, chunks) - exact).abs().max())
    assert costs.picard_depth(steps, chunks, chunks) >= steps  # sweeping to exactness is never shallower


def test_picard_error_is_not_monotone_in_general():
    # Guaranteed only for a step that is a contraction in the max norm: then a chunk's error never grows
    # along it, so sweep k's worst error (which starts where sweep k-1 ended) is at most sweep k-1's.
    x = torch.full((1, 12, 1), -1.0, dtype=torch.float64)
    h0 = torch.ones(1, 1, dtype=torch.float64)
    # h -> 2h - 1 from h0 = 1 stays at 1. Chunks of 3 started from 0 go 0 -> -1, -3, -7 (worst error 8);
    # the next sweep restarts from -7 and reaches -63 (error 64), then -511: the errors grow 8x a sweep.
    expanding = cell.picard(lambda h, xt: 2 * h + xt, x, h0, chunks=4)
    assert expanding.errors == [8.0, 64.0, 512.0, 0.0]
    contracting = cell.picard(lambda h, xt: 0.5 * h + xt, x, h0, chunks=4)
    assert all(b <= a for a, b in zip(contracting.errors, contracting.errors[1:]))
    assert contracting.errors[-1] == 0.0


def test_independent_episodes_split_exactly():
    gru = cell.GRUCell.seeded(16, 8, seed=1, scale=0.5, dtype=torch.float64)
    x, h0 = _episodes(batch=7, steps=8, dtype=torch.float64)
    full = cell.rollout(gru, x, h0)
    # Nothing flows between episodes: rewriting the others leaves episode 0 bit for bit unchanged.
    x2, h2 = x.clone(), h0.clone()
    x2[1:], h2[1:] = -x2[1:], -h2[1:]
    assert torch.equal(cell.rollout(gru, x2, h2)[0], full[0])
    # Split over ranks, only the number of rows in each matrix product changes, and with it the CPU
    # kernel's summation order (not bitwise here): bounded by reordering_bound (float64, T = 8).
    bound = cell.reordering_bound(gru, 8, float(x.abs().max()), FLOAT64_ROUNDOFF)
    for world in (1, 2, 3, 7):
        shards = cell.split_episodes(x, h0, world)
        assert [s[0].shape[0] for s in shards] == [len(c) for c in torch.tensor_split(torch.arange(7), world)]
        split = torch.cat([cell.rollout(gru, xs, hs) for xs, hs in shards])
        assert float((split - full).abs().max()) <= bound


@pytest.mark.parametrize("call, message", [
    (lambda g, x, h: cell.rollout(g, x[:, :0], h), "x must be"),
    (lambda g, x, h: cell.rollout(g, x, h[:, :3]), "cell takes n=16"),
    (lambda g, x, h: cell.rollout(g, x[0], h), "x must be"),
    (lambda g, x, h: cell.chunk_from_zero(g, x[:, :3], h, 4), "chunks must be <= steps"),
    (lambda g, x, h: cell.picard(g, x, h, 4, sweeps=0), "sweeps must be an integer >= 1"),
    (lambda g, x, h: cell.split_episodes(x, h, 5), "world_size must be <= batch"),
    (lambda g, x, h: cell.GRUCell.seeded(0, 8), "state_size must be"),
    (lambda g, x, h: cell.step_errors(x, x[:, :2]), "need two"),
])
def test_bad_cell_inputs_are_refused_clearly(call, message):
    gru = cell.GRUCell.seeded(16, 8, seed=1, dtype=torch.float32)
    x, h0 = _episodes()
    with pytest.raises(ValueError, match=message):
        call(gru, x, h0)


def test_sequential_compare_with_scan_work():
    # The scan buys depth with work: Hillis-Steele composes ~T log2 T maps where the loop applies T.
    t = 1024
    hs, bl = costs.hillis_steele_ops(t), costs.blelloch_ops(t)
    assert hs.composes / (t - 1) == pytest.approx(math.log2(t) - 1, rel=0.01)
    assert bl.composes < 2 * (t - 1) and bl.depth < 2 * hs.depth
    assert hs.depth == 11 and costs.sequential_ops(t).depth == t
