"""Every number a panel, a reveal or a listing shows is pinned to its one formula in costs/ (issue 26 §1).

Each test here was written against a wrong copy of the code it guards, and fails on it: the
bubble curve drawn from (P-1)/(M+P); the traffic panel's "hides the transfer" flipped; a reveal
reporting the formula's error as the guess's; a cache key that rounds floats to 3 digits; a
count listing that prints PASS for a wrong count; an Experiment of jobs that runs another
world size than it was given; the schedule size limit leaving out v.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from wmdist.comm import Context, all_reduce
from wmdist.costs import pipeline as pcosts
from wmdist.costs import ring_attention as ra
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.bubble import BubbleConfig, bubble_view
from wmdist.pipeline.panel import BubblePanel
from wmdist.pipeline.schedules import MAX_SLOTS, check_size
from wmdist.course.report import Count, Report
from wmdist.ring_attention.traffic import CUSTOM, TrafficConfig, traffic_model
from wmdist.ui.panel import stable
from wmdist.ui.predict import compare_guess

SETTINGS = [("gpipe", 4, 8, 1), ("1f1b", 2, 3, 1), ("1f1b", 8, 32, 1), ("interleaved", 4, 8, 2),
            ("interleaved", 2, 4, 4), ("gpipe", 1, 5, 1)]


@pytest.mark.parametrize("schedule, p, m, v", SETTINGS)
def test_the_bubble_panel_shows_the_formulas_of_costs_pipeline(schedule, p, m, v):
    config = BubbleConfig(schedule=schedule, stages=p, microbatches=m, chunks=v)
    view = bubble_view(config)
    r = pcosts.bubble_over_ideal(p, m, chunks=v)
    assert view.formula_over_ideal == r and view.formula_idle == pcosts.fraction_from_ratio(r)
    if v == 1:
        assert view.formula_idle == pytest.approx(pcosts.bubble_fraction(p, m), rel=1e-15)    # two roundings
    assert view.curve.formula == tuple(pcosts.fraction_from_ratio(pcosts.bubble_over_ideal(p, k, chunks=v))
                                       for k in view.curve.microbatches)
    assert view.transfers == pcosts.boundary_transfers(p, m, chunks=v)
    assert view.peak_formula == tuple(pcosts.peak_activations_in_flight(schedule, p, m, chunks=v, rank=k)
                                      for k in range(p))
    text = BubblePanel(config).describe(config, view)
    assert f"<b>{pcosts.fraction_from_ratio(r):.3f}</b>" in text and f"<b>{r:.3f}</b>" in text


def test_the_bubble_config_builds_its_schedule_once_and_the_view_uses_it():
    config = BubbleConfig(schedule="1f1b", stages=4, microbatches=8)
    assert bubble_view(config).schedule is config.built_schedule
    assert dataclasses.replace(config, microbatches=9).built_schedule.microbatches == 9


@pytest.mark.parametrize("tokens_over_min", [0.25, 0.5, 2.0, 4.0])
def test_the_traffic_panel_says_the_transfer_hides_exactly_when_the_block_is_large_enough(tokens_over_min):
    # c >= e F / 2B (doubled when causal) is costs.ring_attention.min_overlap_block_size: the panel's yes/no
    # must follow it on both sides, far enough from the boundary that its rounding up does not decide.
    n, flops = 4, 1e11
    for causal in (False, True):
        half = 2 if causal else 1
        tokens = 1024
        link = flops * 2 * half / (2 * tokens / tokens_over_min)       # B such that half * e F / 2B = tokens / x
        c = TrafficConfig(seq_len=tokens * n, world_size=n, device=CUSTOM, flops=flops, link=link, causal=causal,
                          dtype="bfloat16")
        r = traffic_model(c)
        assert r.min_block == half * ra.min_overlap_block_size(flops, link, elem_size=2)
        assert r.tokens_per_rank == tokens
        assert r.hides == (tokens_over_min >= 1), (causal, tokens, r.min_block, r.step_compute_s, r.step_comm_s)


def test_a_reveal_gives_the_guess_its_own_error_and_the_formula_its_own():
    v = compare_guess(8000, 6000, formula=5000)
    assert v.relative_error == pytest.approx(2000 / 6000) and v.ratio == pytest.approx(8000 / 6000)
    assert v.formula_relative_error == pytest.approx(-1000 / 6000)
    assert "33.3% above" in v.summary


def test_neighbouring_float_settings_get_their_own_pictures():
    assert stable(1.2345) != stable(1.2346) and stable(3.0e-3) != stable(3.0001e-3)
    assert stable(0.1 + 0.2) == stable(0.3)                        # 16th-digit noise is one setting


def test_a_count_listing_fails_a_wrong_count():
    right = [Count(quantity="bytes sent", rank=r, measured=100, predicted=100) for r in range(2)]
    wrong = [Count(quantity="bytes sent", rank=0, measured=100, predicted=100), Count(quantity="bytes sent", rank=1, measured=101, predicted=100)]
    assert "PASS bytes sent" in Report(name="x", world_size=2, exact=right).listing(counts=True)
    listed = Report(name="x", world_size=2, exact=wrong).listing(counts=True)
    assert "PASS" not in listed and "FAIL bytes sent: measured [100, 101], predicted [100, 100]" in listed


def test_the_schedule_size_limit_counts_the_chunks():
    p, m = 4, MAX_SLOTS // 4 // 4               # P * M is a quarter of the limit
    assert check_size(p, m, chunks=4) == (p, m, 4)
    with pytest.raises(ValueError, match="stages\\*microbatches\\*chunks must be at most"):
        check_size(p, m, chunks=5)


@dataclass(frozen=True)
class Sized:
    world_size: int


def summed_rank(ctx: Context, spec: Sized) -> int:
    import torch
    t = torch.ones(1)
    all_reduce(ctx, t)
    return int(t.item())


def test_an_experiment_of_jobs_runs_on_the_world_size_it_is_given():
    """A job launched on another size than the spec's (one rank fewer, as a resume on fewer ranks does)
    runs on that size: `launch`'s world size is the job's, never the spec's (a runner that swapped in
    spec.world_size would give n results each summing n, and the counts below name the difference)."""
    def jobs(spec: Sized, launch) -> list[int]:
        return launch(summed_rank, spec.world_size - 1, spec)

    def judge(spec: Sized, results: list[list[int]]) -> Verdict:
        ran = [Count(quantity="ranks launched", rank=0, measured=len(results[0]), predicted=spec.world_size - 1)]
        return Verdict(checks=[], exact=ran + [Count(quantity="ranks summed", rank=r, measured=got,
                                                     predicted=spec.world_size - 1)
                                               for r, got in enumerate(results[0])])

    exp = Experiment(name="toy-jobs", title="toy: sum of ones", chapter="99", world_sizes=(2, 3), spec=Sized,
                     jobs=jobs, compare=judge)
    for n in (2, 3):
        report = exp.run(n)
        assert report.world_size == n and report.passed and len(report.exact) == n, report.listing(counts=True)


# --- chapter 01's data-parallel hook bound (costs/compression.hook_bound_terms) -----------------------------

U32 = 2.0 ** -24


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_plain_hook_bound_is_two_gamma_n_u32_written_out(n):
    """torch's allreduce_hook divides by N then sums in float32, the reference sums then divides: N roundings
    each, so 2 gamma(N, u32) per entry (relative to A = sum |g_i| / N), and 2N half-subnormals absolute."""
    from wmdist.costs.compression import hook_bound_terms
    assert hook_bound_terms("none", n) == (2 * n * U32 / (1 - n * U32), 2 * n * 2.0 ** -150)


def test_the_plain_hook_check_is_tight_at_its_bound():
    """The demo's own check (`_ratio`, in units of the bound) on a fabricated run whose one entry is moved by
    0.4 and by 3 times the bound: the first passes, the second fails, NaN fails (a 100x looser bound passes 3x)."""
    import math

    import torch

    from wmdist.costs.compression import hook_bound_terms
    from wmdist.data_parallel.compression import MethodRun
    from wmdist.data_parallel.compression_demo import _ratio
    n = 4
    exact = torch.tensor([[0.5, -3.0, 2.0], [1.0, 0.25, -1.5]])              # (T, P) float32 averages
    abs_mean = exact.abs() * 2                                                # sum |g_i| / N, as if signs mixed
    rel, tiny = hook_bound_terms("none", n)
    bound = rel * float(abs_mean[1, 1]) + tiny
    for times, passes in ((0.4, True), (3.0, False), (math.nan, False)):
        applied = exact.double().clone()
        applied[1, 1] += times * bound
        run = MethodRun(label="none", hook_bytes=(0, 0), hook_calls=(1, 1), applied=applied, exact=exact,
                        abs_mean=abs_mean, losses=(1.0, 0.9, 0.8))
        ratio = _ratio(run, "none", n, range(2))
        assert (ratio <= 1.0) is passes, (times, ratio)


# --- wmdist.yours: the gradient bound and the parameter tolerance, written out (issue 35 §5) -----------------

def _yours_grad(work, model, part, scale, divide=1):
    import torch
    grads = torch.autograd.grad(work.loss(model, part).sum() * scale, list(model.parameters()))
    return (torch.cat([g.reshape(-1) for g in grads]) / divide).double()


@pytest.mark.parametrize("n", [2, 3])
def test_the_yours_gradient_bound_is_its_formula_written_out(no_processes, n):
    """bound = max over layouts |layout - whole| + (2(B-1) + 3) u sum_i |g_i| / B, the layouts being one example
    at a time, the N shards at 1/B, and (N not a power of two) the N shards at torch's 1/(B/N) then / N."""
    import torch

    from test_yours_small_batch import mlp_work
    from wmdist.course.compare import one_thread
    from wmdist.yours.reference import one_process
    from wmdist.yours.workload import build_model, rows
    work = mlp_work(2, n)
    b, each = 2 * n, 2
    with one_thread():
        model, batch = build_model(work), work.batch(0)
        whole = _yours_grad(work, model, batch, 1 / b).float().double()
        ones = [_yours_grad(work, model, rows(batch, i, i + 1), 1 / b) for i in range(b)]
        layouts = [sum(ones), sum(_yours_grad(work, model, rows(batch, r * each, (r + 1) * each), 1 / b)
                                  for r in range(n))]
        if n == 3:
            layouts.append(sum(_yours_grad(work, model, rows(batch, r * each, (r + 1) * each), 1 / each, divide=n)
                               for r in range(n)))
        by_hand = (torch.stack([(lay - whole).abs() for lay in layouts]).amax(0)
                   + (2 * (b - 1) + 3) * U32 * torch.stack([g.abs() for g in ones]).sum(0))
    got = one_process(work, n).grad_bounds[0].double()             # stored in float32, rounded up
    assert float(by_hand.max()) > 0 and bool((got >= by_hand).all()) and bool((got <= by_hand * (1 + 2 ** -21)).all())


def test_the_yours_parameter_tolerance_is_its_formula_written_out(no_processes):
    """One plain SGD step moves every entry by lr * (its gradient bound) under the probe, whatever the signs:
    tolerance = lr * max_j bound_j + 1 * u * max|theta|, up to float32's rounding of theta (a 100x looser one
    is outside)."""

    from test_yours_small_batch import mlp_work
    from wmdist.yours.reference import one_process, workload_param_tolerance
    work = mlp_work(2, 2, steps=1, lr=1.0)
    ref = one_process(work, 2)
    theta, g = float(ref.params.abs().max()), float(ref.grad0.abs().max())
    by_hand = work.lr * float(ref.grad_bounds[0].max()) + U32 * theta
    slack = 2 * U32 * theta + work.lr * U32 * g            # theta rounded in both runs; g + bound cast to float32
    assert work.lr * float(ref.grad_bounds[0].max()) > 4 * slack         # the bound's own term is resolved
    tol = workload_param_tolerance(work, ref)
    assert abs(tol - by_hand) <= slack, (tol, by_hand, slack)


@pytest.mark.parametrize("factor,passes", [(0.95, True), (1.05, False)])
def test_the_yours_checks_are_tight_at_their_tolerances(no_processes, factor, passes):
    """An entry moved by 0.95 of its bound (of the parameter tolerance) passes, by 1.05 fails: each check
    compares with the very tolerance pinned above, at an entry whose float32 spacing is far below 5% of it."""

    from test_yours import _dp_results
    from test_yours_small_batch import mlp_work
    from wmdist.yours import dp_check
    from wmdist.yours.reference import one_process, workload_param_tolerance
    from wmdist.yours.workload import prepare_workload
    spec = prepare_workload(mlp_work(2, 2, optimizer="adam"), 2)
    ref = one_process(spec.work, 2)
    tol, bound = workload_param_tolerance(spec.work, ref), ref.grad_bounds[0]
    j = int((bound / (ref.grad0.double().abs() + 1e-30)).argmax())       # the bound widest next to |g_j|
    k = int(ref.params.abs().argmin())
    grad0, params = ref.grad0.clone(), ref.params.clone()
    grad0[j] += factor * float(bound[j])
    params[k] += factor * tol
    checks = {c.name: c for c in dp_check.compare_dp(spec, _dp_results(spec, grad0, params)).checks}
    grad = checks["step-0 gradient == one process (in units of its rounding bound)"]
    param = checks["final parameters == one process (rank 0)"]
    assert grad.passed is passes and grad.error == pytest.approx(factor, rel=0.01)
    assert param.passed is passes and param.tolerance == tol and param.error == pytest.approx(factor * tol, rel=0.01)
