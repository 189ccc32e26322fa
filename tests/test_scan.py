"""Chapter 07 on ranks: the affine scan across ranks equals the loop with T-independent bytes; the nonlinear
cell's time split is wrong from zero, exact but sequential with boundary states, exact and parallel over
episodes; Picard sweeps are exact after at most N sweeps at N times the work."""
from __future__ import annotations

import functools
import re

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure

from wmdist.costs import scan as costs
from wmdist.course.experiment import Experiment
from wmdist.scan import affine_demos, affine_ranks, boundaries, bounds, cell_demos, figures, one_process, picard_ranks
from wmdist.scan.cell import GRUCell, rollout
from wmdist.scan.chapter import DEMOS, EXERCISES

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks
matplotlib.use("Agg")
DEMO_NAMES = ("scan-affine", "scan-bytes", "scan-one-process", "scan-cell", "scan-picard")


# --- pure parts and refusals: no processes ----------------------------------------------------------

def test_demos_are_registered_for_chapter_07():
    from wmdist.registry.demos import exercises, registry  # imports every chapter: fails if any chapter is broken

    demos = registry()
    assert [d.name for d in DEMOS] == list(DEMO_NAMES) and all(demos[d.name] == d for d in DEMOS)
    assert {d.chapter for d in DEMOS} == {"07"} and all(isinstance(d, Experiment) for d in DEMOS)
    assert [d.name for d in DEMOS if d.local is not None] == ["scan-one-process"]   # runs here, starts no rank
    assert [n for n in range(1, 9) if demos["scan-cell"].refuses(n)] == [1]      # the only demo that needs 2
    assert exercises()["incoming state"] is EXERCISES[0]


@pytest.mark.parametrize("call, message", [
    (lambda: affine_demos.affine_demo(8, steps=5), "world_size must be <= T"),
    (lambda: affine_demos.affine_demo(2, steps=0), "steps must be an integer >= 1"),
    (lambda: affine_demos.affine_demo(0), "world_size must be an integer >= 1"),
    (lambda: affine_demos.bytes_demo(4, steps=(2, 64)), "world_size must be <= T"),
    (lambda: affine_ranks.scan_cases(2, [affine_ranks.AffineCase("x", torch.zeros(1, 4, 3, 3), torch.zeros(1, 4, 3),
                                                                 torch.zeros(1, 2))]), "h0 must be (B, n) = (1, 3)"),
    (lambda: affine_ranks.AffineCase("x", torch.zeros(1, 4, 2, 2), torch.zeros(1, 4, 3), torch.zeros(1, 3)),
     "A must be (1, 4, 3, 3) to match b (1, 4, 3) (state size n=3)"),
    (lambda: affine_ranks.scan_cases(2, []), "cases must hold at least one"),
    (lambda: one_process.scan_demo(9, steps=8), "chunks must be <= steps"),
    (lambda: cell_demos.cell_demo(1), "world_size must be an integer >= 2"),
    (lambda: cell_demos.cell_demo(8, steps=5), "chunks must be <= steps"),
    (lambda: cell_demos.cell_demo(8, batch=4), "world_size must be <= batch B=4"),
    (lambda: cell_demos.cell_demo(2, steps=0), "steps must be an integer >= 1"),
    (lambda: picard_ranks.sweeps_demo(4, steps=3), "chunks must be <= steps"),
    (lambda: picard_ranks.sweeps_demo(2, stop_below=-1.0), "stop_below must be a finite number >= 0.0"),
    (lambda: picard_ranks.run_picard(2, *cell_demos.episodes(batch=4, steps=6), max_sweeps=0), "max_sweeps must be"),
    (lambda: boundaries.run_boundaries(2, GRUCell.seeded(16, 8), torch.zeros(2, 6, 8), torch.zeros(2, 3)),
     "state size mismatch: the cell takes n=16, m=8; got h0 with n=3"),
    (lambda: boundaries.run_boundaries(2, GRUCell.seeded(16, 8), torch.zeros(2, 6, 5), torch.zeros(2, 16)),
     "state size mismatch"),
])
def test_bad_inputs_are_refused_before_any_process_starts(no_processes, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_brent_steps_and_when_a_scan_pays():
    t = 1024
    hs = costs.hillis_steele_ops(t)
    assert costs.brent_steps(hs, 1) == hs.composes + hs.applies          # one worker does all the work
    assert costs.brent_steps(hs, 10 ** 9) == pytest.approx(hs.depth, abs=1e-3)
    for ops in (hs, costs.blelloch_ops(t)):
        p = costs.workers_to_pay(ops, t)
        assert costs.brent_steps(ops, p) < t <= costs.brent_steps(ops, p - 1) if p > 1 else True
    assert costs.workers_to_pay(hs, t) == 11 and costs.workers_to_pay(costs.blelloch_ops(t), t) == 4
    with pytest.raises(ValueError, match="never beats"):
        costs.workers_to_pay(costs.sequential_ops(t), t)


def test_amplification_of_a_known_linear_step():
    # J_t = a I: a gap opened at step s has grown by a^(t-s) at step t, so the sum is a geometric series.
    a, steps = 0.5, 6
    jac = (a * torch.eye(3, dtype=torch.float64)).expand(2, steps, 3, 3)
    got = bounds.amplification(jac)
    assert torch.allclose(got, torch.tensor([(1 - a ** (t + 1)) / (1 - a) for t in range(steps)],
                                            dtype=torch.float64), rtol=1e-15, atol=0)


def test_propagated_bound_is_far_tighter_than_the_worst_case_and_not_vacuous():
    cell, x, h0 = cell_demos.episodes()
    exact = rollout(cell, x, h0)
    bound = bounds.propagated_bound(cell, x, h0, exact, 2.0 ** -24)
    from wmdist.scan.cell import reordering_bound
    assert bound < 1e-3 < reordering_bound(cell, x.shape[1], float(x.abs().max()), 2.0 ** -24)
    split = torch.cat([rollout(cell, xs, hs) for xs, hs in zip(x.tensor_split(3), h0.tensor_split(3))])
    assert 0 < float((split - exact).abs().max()) <= bound                # not bitwise, and within the bound


# --- on ranks -----------------------------------------------------------------------------------------

@functools.cache
def _report(name, n):
    """Each registered demo's Report at N ranks, run once for every test that reads it (deterministic)."""
    return next(d for d in DEMOS if d.name == name).run(n)


@pytest.mark.parametrize("n", [1, 4, 8])     # T = 37 is prime: no N > 1 divides it. (1..8 all pass: wmdist verify)
def test_every_demo_passes_or_refuses(n):
    for demo in DEMOS:
        if demo.refuses(n):
            assert "world_size must be an integer >= 2" in demo.refuses(n)
            with pytest.raises(ValueError, match="world_size must be an integer >= 2"):
                demo.run(n)
            continue
        report = _report(demo.name, n)
        assert report.passed, (demo.name, report.failures)


def test_affine_bytes_do_not_depend_on_t_but_grow_with_n():
    report = _report("scan-bytes", 4)
    assert report.passed and set(affine_demos.spread_over_steps(report).values()) == {0}
    sweep = report.data
    dense = {r.state_size: r.total for r in sweep.select("gathered", diagonal=False, over="state_size")}
    diag = {r.state_size: r.total for r in sweep.select("gathered", diagonal=True, over="state_size")}
    hand = {r.state_size: r.total for r in sweep.select("handoff", diagonal=False, over="state_size")}
    # Measured: all ranks together send N (N-1) B (n^2 + n) * 4 bytes for dense summaries, N (N-1) B 2n * 4
    # for diagonal, and (N-1) B n * 4 for the hand-off (dense or not).
    assert dense[16] == 4 * 3 * 2 * (16 * 16 + 16) * 4 and diag[16] == 4 * 3 * 2 * 32 * 4 and hand[16] == 3 * 2 * 16 * 4
    assert dense[16] / dense[8] > 3.7 and diag[16] / diag[8] == 2 and hand[16] / hand[8] == 2


def test_chunks_from_zero_fail_and_the_hand_off_waits():
    step = 2e-3
    report = cell_demos.cell_demo(4, step_seconds=step)
    assert report.passed
    wrong = report.check("chunks started from zero are WRONG")
    assert wrong.error > 0.1 > 100 * wrong.tolerance                    # a different trajectory, not rounding
    data = report.data
    first = data.chunk_sizes[0]
    assert all(e == 0 for e in data.from_zero_errors[:first]) and data.from_zero_errors[first] > 0.1
    # Rank r cannot receive its state before every earlier rank slept through its chunk: a lower bound the
    # sleeps guarantee whatever the machine's load (sleeping ranks do not compete for the CPU).
    assert all(w >= least for w, least in zip(data.waits, data.least_waits)) and data.waits[3] >= 3 * 9 * 8 * step
    compute = {s.row: s for s in data.timelines["hand-off"] if s.kind == "compute"}
    assert all(compute[r].start >= compute[r - 1].end for r in range(1, 4))    # strictly one after another
    assert not [s for s in data.timelines["episodes"] if s.kind != "compute"]  # nothing to wait for


def test_picard_is_exact_within_n_sweeps_and_costs_n_times_the_work():
    report = _report("scan-picard", 4)
    assert report.passed
    data = report.data
    assert data.sweeps <= 4 and data.errors[-1] == 0 and data.changes[-1] == 0
    assert all(e > 0 for e in data.errors[:-1])
    assert data.work[-1] == costs.picard_work(37, data.sweeps) == data.sweeps * 37
    assert data.depth[-1] == costs.picard_depth(37, 4, data.sweeps) >= 37   # never shallower than the loop


def test_picard_stopped_early_is_an_approximation_with_its_error_measured():
    report = picard_ranks.sweeps_demo(8, stop_below=1e-2)
    assert report.passed and report.data.sweeps < 8
    assert 0 < report.data.errors[-1] < 0.1 and report.data.changes[-1] <= 1e-2
    with pytest.raises(KeyError):
        report.check("after the last sweep (at most N) == loop")          # no exactness claimed


def test_figures_are_single_figures():
    before = set(plt.get_fignums())                  # other tests' figures are not this test's business
    one = one_process.measure_times(steps=(4, 8), state_size=2, batch=1, repeats=1)
    cell_data = _report("scan-cell", 4).data
    figs = [figures.bytes_figure(_report("scan-bytes", 4).data), figures.ops_figure(times=[one]), figures.ops_figure(),
            figures.from_zero_figure(cell_data), figures.sweeps_figure(_report("scan-picard", 4).data),
            figures.schedules_figure(cell_data.timelines)]
    assert all(isinstance(f, Figure) for f in figs)
    assert set(plt.get_fignums()) == before          # released: Jupyter shows each one once
