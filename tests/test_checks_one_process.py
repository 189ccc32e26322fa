"""The one-process demos' comparison paths (they have no rank results for the verify matrix to replay): NaN and inf
fail, and each tolerance is tight, by patching the computation that is compared (no processes)."""
from __future__ import annotations

import math

import pytest
import torch

from wmdist.memory import activation_recompute as ar
from wmdist.scan import one_process

U32 = 2.0 ** -24
EDGES = ((0.4, True), (3.0, False))      # (times the stated bound, check passes)

pytestmark = pytest.mark.usefixtures("one_thread", "no_processes")


def _hillis_steele_tolerance(A: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> float:
    """By hand: depth ceil(log2 37) + 1 = 7 against the loop's 37, c roundings per step, times the |.| loop's max."""
    diagonal = A.dim() == 3
    c = 2 if diagonal else b.shape[-1] + 1
    a, bb, h, top = A.double().abs(), b.double().abs(), h0.double().abs(), 0.0
    for t in range(b.shape[1]):
        h = (a[:, t] * h if diagonal else torch.einsum("bij,bj->bi", a[:, t], h)) + bb[:, t]
        top = max(top, float(h.max()))
    return sum(c * d * U32 / (1 - c * d * U32) for d in (7, 37)) * top


def _scan_report(monkeypatch, move):
    real = one_process.associative_scan

    def moved(A, b, h0, tally=None):
        out = real(A, b, h0, tally=tally).clone()
        out[0, -1, 0] += move(_hillis_steele_tolerance(A, b, h0))
        return out
    monkeypatch.setattr(one_process, "associative_scan", moved)
    report = one_process.scan_demo(2)
    return {c.name: c for c in report.checks if "hillis-steele" in c.name}, report


@pytest.mark.parametrize("times, passes", EDGES)
def test_scan_one_process_tolerance_is_tight(monkeypatch, times, passes):
    checks, report = _scan_report(monkeypatch, lambda tol: times * tol)
    assert len(checks) == 2 and all(c.passed is passes for c in checks.values())
    assert all(c.passed for c in report.checks if c.name not in checks)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_scan_one_process_fails_on_nan_and_inf(monkeypatch, bad):
    checks, report = _scan_report(monkeypatch, lambda tol: bad)
    assert not report.passed and all(not c.passed and "not finite" in c.describe() for c in checks.values())


def _checkpointing_report(monkeypatch, move):
    """The checkpointed run's last cell-gradient tensor (the bias; a max() would pass over a NaN there), element 0,
    moved by move(its bound)."""
    real = ar.measure
    per_unit = ar.reordered_sum_bound(64, 1.0)
    assert per_unit == 2 * 63 * U32                                          # T = 64 steps reordered, pinned

    def measure(cfg):
        out = real(cfg)
        if cfg.segment:
            grads, sums = [g.clone() for g in out["grads"]], ar.step_contributions(cfg)
            last = len(sums) - 1                                             # grads: the cell's, then z's
            grads[last].view(-1)[0] += move(float(per_unit * sums[last].reshape(-1)[0]))
            out = {**out, "grads": grads}
        return out
    monkeypatch.setattr(ar, "measure", measure)
    report = ar.checkpointing_report(repeats=1)
    return report.check("cell gradients with checkpoints == without (in units of the rounding bound)"), report


@pytest.mark.parametrize("times, passes", EDGES)
def test_checkpointed_gradient_check_is_tight(monkeypatch, times, passes):
    check, report = _checkpointing_report(monkeypatch, lambda bound: times * bound)
    assert check.passed is passes and report.check("z gradient with checkpoints == without").passed


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_checkpointed_gradient_check_fails_on_nan_and_inf(monkeypatch, bad):
    check, report = _checkpointing_report(monkeypatch, lambda bound: bad)
    assert not report.passed and "not finite" in check.describe()
