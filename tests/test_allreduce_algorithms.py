"""Ring, tree, halving-doubling and direct all-reduce: ledger == formula on every rank, sums within rounding.

The formulas (wmdist.costs.allreduce) are checked twice: against the ledger of real gloo runs at every
N in 1..8 on a length no N in 2..8 divides, and on their own against facts that do not come from the
code under test (equal chunks give the textbook volumes, a tree's edges carry 2(N-1)G in all).
"""
from __future__ import annotations

import pytest

from wmdist import costs
from wmdist.costs import allreduce
from wmdist.costs.collectives import ring_allreduce_bytes
from wmdist.data_parallel import algorithms_demo as demo

UNEVEN = 1003            # 1003 = 17 x 59: N = 2..8 never divides it, so chunks differ by one element
WORLD_SIZES = tuple(range(1, 9))


@pytest.fixture(scope="module")
def reports():
    """One run per N at the uneven length, and N = 8 at the registered default (100,003, prime)."""
    out = {n: demo.algorithms_demo(n, numel=UNEVEN) for n in WORLD_SIZES}
    out["default-8"] = demo.ALGORITHMS_DEMO.run(8)
    return out


@pytest.mark.parametrize("key", [*WORLD_SIZES, "default-8"])
def test_ledger_equals_every_formula_and_sums_within_rounding(reports, key):
    report = reports[key]
    n = report.world_size
    assert report.passed, str(report)
    for a in allreduce.ALGORITHMS:
        for quantity in ("bytes sent", "rounds"):
            rows = report.counts(quantity=quantity, case=a)
            assert [c.rank for c in rows] == list(range(n)), (a, quantity)
            assert all(c.measured == c.predicted for c in rows), (a, quantity, rows)
    assert len(report.checks) == 4 * 3 + 3                       # 4 algorithms x 3 checks, 3 against the ring


def test_counts_tell_the_algorithms_apart(reports):
    """A formula that ignored the algorithm (or was the ring's for all four) could not pass the demo."""
    report = reports["default-8"]
    numel, n = report.params["numel"], report.world_size
    sent = {a: tuple(report.measured(quantity="bytes sent", case=a)) for a in allreduce.ALGORITHMS}
    assert len(set(sent.values())) == 4, sent
    ring = [ring_allreduce_bytes(numel, n, r) for r in range(n)]
    assert all(list(sent[a]) != ring for a in ("tree", "halving-doubling", "direct"))
    rounds = {a: tuple(report.measured(quantity="rounds", case=a)) for a in allreduce.ALGORITHMS}
    assert rounds["ring"] == rounds["direct"] == (14,) * 8 and rounds["halving-doubling"] == (6,) * 8
    assert rounds["tree"] == (6, 2, 4, 2, 6, 2, 4, 2)


def test_orders_differ_so_bits_differ_but_stay_within_the_bound(reports):
    """No bitwise claim where the summation orders differ: at N = 8 some algorithm misses the ring's bits."""
    report = reports["default-8"]
    vs_ring = [report.check(f"{a} == ring (rank 0, in units of the rounding bound)") for a in
               ("tree", "halving-doubling", "direct")]
    assert any(c.error > 0 for c in vs_ring) and all(0 <= c.error <= 1 for c in vs_ring)
    assert all(c.tolerance == 1.0 for c in vs_ring)
    exact = report.check("tree on integer-valued inputs == the exact sum")
    assert exact.tolerance == 0 and exact.error == 0


def test_tolerance_is_the_reordering_bound():
    """In units of 2^-24 sum|x|: 2(N-1) between two orders, one more against the float64 sum rounded once."""
    assert costs.reordered_sum_bound(8, 1.0) == 14 * 2.0 ** -24
    assert costs.reordered_sum_bound(8, 1.0, extra_roundings=1) == 15 * 2.0 ** -24
    bound = demo.sum_bound(8, 5)
    magnitude = sum(demo.rank_vector(r, 5).double().abs() for r in range(8))
    assert bool((bound == 15 * 2.0 ** -24 * magnitude).all())


def test_refused_before_any_process_starts(monkeypatch):
    def no_processes(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr("wmdist.course.experiment.run", no_processes)
    with pytest.raises(ValueError, match="numel must be at least world_size"):
        demo.AllReduceAlgorithmsSpec(world_size=4, numel=3)
    with pytest.raises(ValueError, match="world_size"):
        demo.ALGORITHMS_DEMO.run(0)
    assert "world_size" in demo.ALGORITHMS_DEMO.refuses(0)
    assert demo.ALGORITHMS_DEMO.refuses(5) is None                   # not a power of two: folded, not refused



def test_the_comparison_can_fail(monkeypatch):
    """The same rank results judged with a wrong formula, a wrong sum or a NaN: each is caught."""
    from dataclasses import replace

    from wmdist.runtime import run
    spec = demo.AllReduceAlgorithmsSpec(world_size=4, numel=UNEVEN)
    results = run(demo.all_algorithms, 4, spec)
    assert all(c.passed for c in demo.compare_algorithms(spec, results).exact)
    bad_sum = [replace(res, outputs={**res.outputs, "tree": res.outputs["tree"] * (1 + 2.0 ** -10)})
               for res in results]
    failed = [c.name for c in demo.compare_algorithms(spec, bad_sum).checks if not c.passed]
    assert "tree == single-process sum (in units of the rounding bound)" in failed
    nan = [replace(res, outputs={**res.outputs, "direct": res.outputs["direct"].clone().fill_(float("nan"))})
           for res in results]
    nan_check = next(c for c in demo.compare_algorithms(spec, nan).checks if c.name.startswith("direct == ring"))
    assert not nan_check.passed and "not finite" in nan_check.describe()
    ring_for_all = lambda a, numel, n, r: ring_allreduce_bytes(numel, n, r)   # noqa: E731 - the wrong formula
    monkeypatch.setattr(demo.allreduce, "allreduce_bytes", ring_for_all)
    wrong = demo.compare_algorithms(spec, results).exact
    assert {c.case for c in wrong if not c.passed} == {"tree", "halving-doubling", "direct"}

# --- the formulas on their own -----------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 17))
def test_equal_chunks_give_the_textbook_volumes(n):
    g = 720720                                                        # divisible by 1..16
    ideal = 2 * (n - 1) * g // n * 4
    for a in ("ring", "direct"):
        assert [allreduce.allreduce_bytes(a, g, n, r) for r in range(n)] == [ideal] * n
    p = allreduce.halving_doubling_core(n)
    if p == n:
        assert [allreduce.halving_doubling_bytes(g, n, r) for r in range(n)] == [ideal] * n
        assert {allreduce.halving_doubling_rounds(n, r) for r in range(n)} == {2 * (n.bit_length() - 1)}
    tree = [allreduce.tree_allreduce_bytes(g, n, r) for r in range(n)]
    assert sum(tree) == 2 * (n - 1) * g * 4                           # N-1 edges, G up and G down each
    assert tree[0] == (n - 1).bit_length() * g * 4                    # the root: ceil(log2 N) children
    for a in allreduce.ALGORITHMS:
        assert allreduce.model_rounds(a, n) == max(allreduce.allreduce_rounds(a, n, r) for r in range(n))


def test_the_fold_costs_the_pairs_a_vector_each_way():
    n, g = 6, 720720                                                  # p' = 4: ranks 0 and 2 fold into 1 and 3
    roles = [allreduce.halving_doubling_role(n, r)[0] for r in range(n)]
    assert roles == ["folded", "partner", "folded", "partner", "core", "core"]
    sent = [allreduce.halving_doubling_bytes(g, n, r) for r in range(n)]
    assert sent[0] == g * 4 and sent[1] == sent[4] + g * 4
    assert [allreduce.halving_doubling_rounds(n, r) for r in range(n)] == [2, 6, 2, 6, 4, 4]


def test_fewer_rounds_or_fewer_bytes():
    """Large N: the tree takes fewer rounds than the ring; large G: the ring sends fewer bytes and wins."""
    n, g = 8, 10 ** 6
    assert allreduce.model_rounds("tree", n) < allreduce.model_rounds("ring", n)
    assert max(allreduce.tree_allreduce_bytes(g, n, r) for r in range(n)) > \
        max(ring_allreduce_bytes(g, n, r) for r in range(n))
    c = allreduce.algorithm_curves(n, 1e-4, 1e-10, [1e3, 1e9])
    assert c.times["tree"][0] < c.times["ring"][0] and c.times["ring"][1] < c.times["tree"][1]
    assert c.fastest == ("halving-doubling",) * 2                    # at N = 2^k it has both (no contention here)
    folded = allreduce.algorithm_curves(6, 1e-4, 1e-10, [1e3, 1e9])   # at N = 6 the fold's 2G costs it
    assert folded.fastest[1] == "ring" and folded.crossover("halving-doubling", "ring") is not None
    cross = c.crossover("tree", "ring")
    assert cross is not None and 1e3 < cross < 1e9
    assert allreduce.model_time("tree", n, 1e-4, 1e-10, cross) == pytest.approx(
        allreduce.model_time("ring", n, 1e-4, 1e-10, cross))
    assert allreduce.model_time("ring", n, 1e-4, 1e-10, 4e8) == costs.allreduce_time(n, 1e-4, 1e-10, 4e8)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="algorithm"):
        allreduce.allreduce_bytes("butterfly", 10, 2, 0)
    with pytest.raises(ValueError, match="rank"):
        allreduce.tree_allreduce_bytes(10, 2, 2)


def test_the_figure_draws_four_algorithms():
    from wmdist.data_parallel.allreduce_figures import algorithms_tradeoff_figure
    fig = algorithms_tradeoff_figure(8)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.lines]
    assert labels[:4] == ["ring", "tree", "halving-doubling", "direct (= ring in this model)"]
    assert "tree beats ring for G < 1.88 MB" in fig.texts[0].get_text()
