"""Closed forms: the text's numbers come out, and nonsense inputs are refused."""
from __future__ import annotations

import math

import pytest

from wmdist import costs


def test_chunk_sizes_follow_tensor_split():
    import torch
    for numel in (0, 1, 5, 8, 100_003):
        for n in range(1, 9):
            sizes = costs.ring_chunk_sizes(numel, n)
            assert sizes == [c.numel() for c in torch.tensor_split(torch.empty(numel), n)]
            assert sum(sizes) == numel
            assert [costs.ring_chunk_size(numel, n, i) for i in range(n)] == sizes      # the closed form, alone


def test_ring_costs_of_a_huge_world_need_no_list_of_its_chunks():
    n = 10 ** 12                                         # a list of n sizes would take terabytes
    assert costs.ring_chunk_size(7 * 10 ** 9, n, 0) == 1 and costs.ring_chunk_size(7 * 10 ** 9, n, n - 1) == 0
    assert costs.ring_reduce_scatter_bytes(7 * 10 ** 9, n, 0) == (7 * 10 ** 9 - 1) * 4
    assert costs.ring_all_gather_bytes(7 * 10 ** 9, n, n - 1) == (7 * 10 ** 9 - 1) * 4     # right neighbour: rank 0


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_bytes_equal_the_bound_when_n_divides(n):
    numel = 840 * 16   # divisible by 1..8
    for r in range(n):
        assert costs.ring_allreduce_bytes(numel, n, r) == costs.ring_allreduce_ideal_bytes(numel * 4, n)


def test_ring_bytes_with_uneven_chunks_are_exact_per_rank():
    # 10 elements on 4 ranks: chunks 3,3,2,2. Rank r sends G - c_r - c_{r+1} elements.
    assert [costs.ring_allreduce_bytes(10, 4, r, elem_size=1) for r in range(4)] == \
        [20 - 3 - 3, 20 - 3 - 2, 20 - 2 - 2, 20 - 2 - 3]
    assert costs.ring_allreduce_rounds(4) == 6 and costs.ring_allreduce_rounds(1) == 0


def test_allreduce_time_model():
    assert costs.allreduce_time(1, 1.0, 1.0, 1e9) == 0.0                      # T(1) = 0
    assert costs.allreduce_time(4, 2e-5, 1e-9, 1e8) == pytest.approx(6 * 2e-5 + 1.5 * 1e-9 * 1e8)
    lat, byte = costs.allreduce_terms(1000, 1e-5, 1e-9, 1e8)
    assert byte == pytest.approx(2 * 1e-9 * 1e8, rel=1e-2)                    # byte term -> 2bG
    assert lat == pytest.approx(2 * 999 * 1e-5)                                # latency term grows
    assert costs.allreduce_terms(64, 1e-5, 1e-9, 1e8)[1] < byte


def test_speedup_and_efficiency_of_the_texts_example():
    assert costs.speedup(24, 1) == 24
    assert costs.efficiency(24, 1, 32) == 0.75


def test_bubble_fraction():
    assert costs.bubble_fraction(4, 8) == 3 / 11
    assert costs.bubble_fraction(1, 5) == 0
    assert costs.bubble_fraction(8, 10_000) < 1e-3


@pytest.mark.parametrize("call, message", [
    (lambda: costs.bubble_fraction(0, 4), "stages must be an integer >= 1"),
    (lambda: costs.bubble_fraction(4, 0), "microbatches must be an integer >= 1"),
    (lambda: costs.allreduce_time(0, 1, 1, 1), "world_size must be an integer >= 1"),
    (lambda: costs.allreduce_time(2, -1, 1, 1), "alpha must be a finite number >= 0"),
    (lambda: costs.allreduce_time(2, 1, 1, -5), "payload_bytes must be a finite number >= 0"),
    (lambda: costs.allreduce_time(2, 1, math.nan, 1), "beta must be a finite number"),
    (lambda: costs.ring_chunk_sizes(-1, 2), "numel must be an integer >= 0"),
    (lambda: costs.ring_chunk_size(10, 4, 4), "index must be an integer from 0 to 3"),
    (lambda: costs.ring_reduce_scatter_bytes(10, 4, 4), "rank must be an integer from 0 to 3"),
    (lambda: costs.ring_all_gather_bytes(10, 0, 0), "world_size must be an integer >= 1"),
    (lambda: costs.efficiency(1, 1, 0), "workers must be an integer >= 1"),
    (lambda: costs.speedup(1, 0), "t_n must be > 0"),
    (lambda: costs.bubble_fraction(2.5, 4), "stages must be an integer"),
])
def test_nonsense_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_reordered_sum_bound_holds_and_is_not_vacuous():
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)                  # 8 terms per column, |x| < 8
    forward, backward = x.sum(1), x.flip(1).cumsum(1)[:, -1]
    bound = costs.reordered_sum_bound(8, float(x.abs().sum(1).max()))
    diff = float((forward - backward).abs().max())
    assert 0 < diff <= bound                                # reorder changes bits, within the bound
    assert costs.reordered_sum_bound(1, 5.0) == 0.0         # one term: nothing to round
    assert costs.reordered_sum_bound(3, 1.0, extra_roundings=2) == 6 * costs.FLOAT32_ROUNDOFF
    with pytest.raises(ValueError, match="terms must be an integer >= 1"):
        costs.reordered_sum_bound(0, 1.0)


def test_every_cost_function_takes_the_same_element_size_by_default():
    """One default (float32, 4 bytes: what the course's ranks send) for every `elem_size` in costs/; a caller
    pricing bf16 says so (elem_size=2), as chapter 06's device table does."""
    import ast
    from pathlib import Path
    defaults = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "wmdist" / "costs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                    if arg.arg == "elem_size" and default is not None:
                        defaults[f"{path.name}:{node.name}"] = ast.literal_eval(default)
    assert len(defaults) > 20 and set(defaults.values()) == {4}, {k: v for k, v in defaults.items() if v != 4}
