"""Chapter 01: replicas that drift while every all-reduce succeeds, the check that catches them, batch vs lr."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from wmdist.comm import broadcast
from wmdist.course.compare import bound_ratio
from wmdist.data_parallel import drift, drift_demo as dd
from wmdist.models.world import flat_params, make_model
from wmdist.runtime import run

SIZES = dd.DRIFT_DEMO.world_sizes


# --- pure parts, no processes ------------------------------------------------------

def test_specs_refuse_bad_input_naming_the_argument():
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        drift.DriftSpec(world_size=1)
    with pytest.raises(ValueError, match="world_size must be <= batch_size 12"):
        drift.DriftSpec(world_size=13)
    with pytest.raises(ValueError, match="odd_rank"):
        drift.DriftSpec(world_size=2, odd_rank=2)
    with pytest.raises(ValueError, match="odd_seed must differ"):
        drift.DriftSpec(world_size=2, odd_seed=0)
    with pytest.raises(ValueError, match="odd_lr must differ"):
        drift.DriftSpec(world_size=2, odd_lr=0.05)
    with pytest.raises(ValueError, match="lr must be > 0"):
        drift.DriftSpec(world_size=2, lr=0.0)
    with pytest.raises(ValueError, match="how must be one of"):
        drift.replicas_agree(None, torch.zeros(2), how="md5")        # refused before any communication
    with pytest.raises(ValueError, match="world_size must be 1"):
        drift.BatchLRSpec(world_size=2)
    with pytest.raises(ValueError, match="samples must be a multiple of factor . batch_size = 32"):
        drift.BatchLRSpec(samples=100)
    with pytest.raises(ValueError, match="seeds needs at least 2"):
        drift.BatchLRSpec(seeds=(0,))
    with pytest.raises(TypeError, match="base_lrs"):
        drift.BatchLRSpec(base_lrs=[0.1])


def test_sizes_refused_before_any_process_starts(no_processes):
    for bad in (0, 1, 13):
        with pytest.raises(ValueError, match="world_size"):
            dd.drift_demo(bad)
        assert dd.DRIFT_DEMO.refuses(bad) is not None
    with pytest.raises(ValueError, match="world_size must be 1"):
        dd.BATCH_LR_DEMO.run(2)
    assert all(dd.DRIFT_DEMO.refuses(n) is None for n in SIZES) and dd.BATCH_LR_DEMO.refuses(1) is None


def test_check_bytes_formula():
    assert dd.check_bytes("hash", 2105, 4, 0) == (8, 24)
    assert dd.check_bytes("broadcast", 2105, 4, 0) == (4 * 2105 + 8, 8)
    assert dd.check_bytes("broadcast", 2105, 4, 3) == (8, 4 * 2105 + 8)


def test_digest_is_of_the_exact_bits():
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    one_ulp = x.clone()
    one_ulp[17] = torch.nextafter(one_ulp[17], torch.tensor(math.inf))
    assert torch.equal(drift.param_digest(x), drift.param_digest(x.clone()))
    assert not torch.equal(drift.param_digest(x), drift.param_digest(one_ulp))
    assert not torch.equal(drift.param_digest(torch.tensor([0.0])), drift.param_digest(torch.tensor([-0.0])))


def _sgd_rank(w: torch.Tensor, grads: list[torch.Tensor], lr: float, *,
              claimed_lr: float | None = None) -> drift.DriftRank:
    """What a rank records after plain-SGD steps on `grads` from `w` (torch's SGD, as the rank runs it)."""
    p = torch.nn.Parameter(w.clone())
    opt, params = torch.optim.SGD([p], lr=lr), [w.clone()]
    for g in grads:
        p.grad = g.clone()
        opt.step()
        params.append(p.detach().clone())
    return drift.DriftRank(case="x", lr=lr if claimed_lr is None else claimed_lr, params=tuple(params),
                           grads=tuple(grads), reduces=0, reduce_bytes=0, agree={}, check_bytes={})


@pytest.mark.parametrize("lr_other", [0.05, 0.1])
def test_gap_algebra_holds_and_has_teeth(lr_other):
    """gap(t) - gap(0) == (lr_0 - lr_1) sum g within the stated bound; an lr off by 0.1 % is caught."""
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(500, generator=gen) for _ in range(8)]
    w0, w1 = torch.randn(500, generator=gen), torch.randn(500, generator=gen)
    zero, other = _sgd_rank(w0, grads, 0.05), _sgd_rank(w1, grads, lr_other)
    ratios = [bound_ratio(m, p, b) for m, p, b in zip(*dd.gap_change(zero, other))]
    assert max(ratios) <= 1.0 and ratios[0] == 0.0
    wrong = _sgd_rank(w1, grads, lr_other, claimed_lr=lr_other * 1.001)
    assert max(bound_ratio(m, p, b) for m, p, b in zip(*dd.gap_change(zero, wrong))) > 10


# --- on real ranks -----------------------------------------------------------------

@pytest.fixture(scope="module")
def drift_runs():
    """Per declared world size: the spec, every rank's results, and the verdict."""
    out = {}
    for n in SIZES:
        spec = dd.drift_spec(n)
        results = run(drift.drift_runs, n, spec)
        out[n] = spec, results, dd.compare_drift(spec, results)
    return out


def _case(results: list[drift.DriftRanks], case: str) -> list[drift.DriftRank]:
    return [r.runs[drift.CASES.index(case)] for r in results]


@pytest.mark.parametrize("n", SIZES)
def test_each_case_fact_holds(drift_runs, n):
    spec, results, verdict = drift_runs[n]
    failed = [c.describe() for c in verdict.checks if not c.passed] + [c.label for c in verdict.exact if not c.passed]
    assert not failed, failed
    same, init, lr = (_case(results, c) for c in drift.CASES)
    for runs in (same, init, lr):           # the all-reduce did its job in every case: one gradient everywhere
        assert all(torch.equal(torch.stack(r.grads), torch.stack(runs[0].grads)) for r in runs)
    assert all(torch.equal(torch.stack(r.params), torch.stack(same[0].params)) for r in same)
    by_case = {c.case: c for c in verdict.data.cases}
    assert by_case["same"].moved == (0.0,) * (spec.steps + 1)
    init_data, lr_data = by_case["init"], by_case["lr"]
    assert init_data.initial_gap > 0.1 and all(m <= b for m, b in zip(init_data.moved, init_data.bound))
    assert abs(init_data.final_gap - init_data.initial_gap) <= init_data.bound[-1]
    assert lr_data.initial_gap == 0.0 and lr_data.moved[-1] > dd.DRIFT_BY * lr_data.bound[-1]
    assert all(a < b for a, b in zip(lr_data.moved, lr_data.moved[1:])), "the lr gap grows at every step here"


@pytest.mark.parametrize("n", SIZES)
def test_check_catches_init_and_lr_and_passes_same(drift_runs, n):
    _, results, _ = drift_runs[n]
    for case in drift.CASES:
        answers = {(r.agree["hash"], r.agree["broadcast"]) for r in _case(results, case)}
        assert answers == {(case == "same",) * 2}, (case, answers)


@pytest.mark.parametrize("n", SIZES)
def test_every_all_reduce_and_check_counted(drift_runs, n):
    spec, results, verdict = drift_runs[n]
    numel = results[0].runs[0].params[0].numel()
    assert numel == 2105
    for case in drift.CASES:
        rows = _case(results, case)
        assert [r.reduces for r in rows] == [spec.steps] * n
        assert [r.reduce_bytes for r in rows] == [spec.steps * 4 * numel] * n
        assert [r.check_bytes["hash"] for r in rows] == [(8, 8 * (n - 1))] * n
        assert [r.check_bytes["broadcast"] for r in rows] == [(4 * numel + 8, 8)] + [(8, 4 * numel + 8)] * (n - 1)
    assert len(verdict.exact) == len(drift.CASES) * (2 + 2 * len(drift.HOWS)) * n


def _real_and_broken(ctx, spec):
    """Case "init"'s starting weights; the real check, and a broken one that skips the vote."""
    seed, _ = spec.setup("init", ctx.rank)
    params = flat_params(make_model(seed=seed))
    real = drift.replicas_agree(ctx, params, how="broadcast")
    broken = torch.equal(broadcast(ctx, params.clone(), 0), params)   # rank 0 compares its weights with themselves
    return real, broken


def test_a_check_that_compares_rank_0_with_itself_is_caught(drift_runs):
    spec, results, _ = drift_runs[2]
    answers = run(_real_and_broken, 2, spec)
    assert [a[0] for a in answers] == [False, False]
    assert [a[1] for a in answers] == [True, False]          # rank 0 is fooled: the broken check passes there
    at = drift.CASES.index("init")
    fooled = [replace(results[0], runs=tuple(replace(r, agree={"hash": False, "broadcast": True}) if i == at else r
                                             for i, r in enumerate(results[0].runs)))] + results[1:]
    verdict = dd.compare_drift(spec, fooled)
    assert [c.name for c in verdict.checks if not c.passed] == ["init: replicas_agree says False on every rank "
                                                                "(hash and broadcast)"]


def test_registered_run_is_the_same_verdict():
    report = dd.DRIFT_DEMO.run(3)
    assert report.passed, report.failures
    assert report.name == "dp-drift" and report.world_size == 3 and report.data.check_bytes["hash"] == (8, 16)


# --- batch size and learning rate, one process --------------------------------------

@pytest.fixture(scope="module")
def batch_lr():
    return dd.batch_lr_demo()


def test_same_lr_at_4x_batch_trains_differently_beyond_seed_noise(batch_lr):
    assert batch_lr.passed, batch_lr.failures
    low, high = batch_lr.data.rules
    for rule in (low, high):
        assert rule.small.trained and rule.same.trained
        assert rule.same_gap > rule.spread > 0                   # higher loss, by more than the seeds disagree
    assert all(c.samples[-1] == 512 for c in batch_lr.data.curves)


def test_linear_scaling_is_measured_not_assumed(batch_lr):
    """What the notebook says about 4 x lr, pinned: close at base lr 0.1, diverged at 0.2 (seeded)."""
    low, high = batch_lr.data.rules
    assert low.scaled.trained and abs(low.scaled_gap) < 0.1 * low.same_gap and abs(low.scaled_gap) < low.spread
    assert not high.scaled.trained and (not math.isfinite(high.scaled.mean) or high.scaled.mean > 10)
    lines = dd.rule_lines(batch_lr.data)
    assert len(lines) == 2 and "diverged" in lines[1] and "diverged" not in lines[0]


def test_batch_lr_checks_fail_when_the_runs_agree():
    spec = drift.BatchLRSpec(samples=64, seeds=(0, 1), base_lrs=(0.1,))
    curves = drift.batch_lr_curves(spec)
    assert curves == drift.batch_lr_curves(spec)                 # seeded, one thread: the same floats again
    assert dd.compare_batch_lr(spec, [curves]).checks[1].passed
    small = {c.seed: c for c in curves if c.batch_size == spec.batch_size}
    copied = tuple(replace(small[c.seed], batch_size=c.batch_size, lr=c.lr) if c.batch_size != spec.batch_size else c
                   for c in curves)
    verdict = dd.compare_batch_lr(spec, [copied])
    assert not verdict.checks[1].passed                          # no gap at all: the claim is refused
    nan = tuple(replace(c, losses=c.losses[:-1] + (math.nan,)) if c.batch_size == spec.batch_size else c
                for c in curves)
    assert not any(c.passed for c in dd.compare_batch_lr(spec, [nan]).checks)
