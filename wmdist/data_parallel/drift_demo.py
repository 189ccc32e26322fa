"""Chapter 01's drift and batch-size demos: specs, comparisons with their reasons, and the Experiments.

dp-drift (2, 3 or 4 ranks): in case "same" the replicas are bitwise equal after every step; in
"init" rank 1's weights minus rank 0's stay what they were at init, and in "lr" they move by
(lr_0 - lr_1) * g each step, while every all-reduce completes and the gradient every rank applies
is bitwise the same. `replicas_agree` says True in "same" and False in the others, on every rank.

dp-batch-lr (one process): the same samples at batch B and k B. The same learning rate at k B ends
elsewhere, by more than the seed-to-seed spread; k times the learning rate is measured and
reported as data (how much of the gap it closes, or that it diverged), not promised by a check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from wmdist.course.compare import bound_ratio, worst
from wmdist.costs import FLOAT32_ROUNDOFF as U32, FLOAT64_ROUNDOFF as U64
from wmdist.data_parallel.drift import (CASES, DIGEST_BYTES, HOWS, VOTE_BYTES, BatchLRSpec, Curve, DriftRank,
                                        DriftRanks, DriftSpec, How, batch_lr_curves, drift_runs)
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, counts_per_rank, differ_check, exact_check, fact_check

SUBNORMAL = 2.0 ** -149      # the most one float32 rounding can move a result in the subnormal range
DRIFT_BY = 1000.0            # case "lr": the gap must move by at least this many rounding bounds


def check_bytes(how: How, numel: int, world_size: int, rank: int, *, elem_size: int = 4) -> tuple[int, int]:
    """(sent, received) payload bytes of `replicas_agree` on `rank`: the formula its Counts are held to.

    hash: an 8-byte digest out, the N-1 others in. broadcast: rank 0 sends the P parameters,
    every other rank receives them, then each rank all-reduces an 8-byte vote.
    """
    if how == "hash":
        return DIGEST_BYTES, (world_size - 1) * DIGEST_BYTES
    params = numel * elem_size
    return (params if rank == 0 else 0) + VOTE_BYTES, (0 if rank == 0 else params) + VOTE_BYTES


def gap_change(zero: DriftRank, other: DriftRank) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """For t = 0..T, (P,) float64 each: how far `other - zero` moved since init, what SGD predicts, the bound.

    Predicted: both apply the same gradient g(s), rank q subtracting lr_q * g(s), so the gap moves
    by (lr_zero - lr_other) * sum_{s<t} g(s): zero when the learning rates agree. Bound: on each
    rank and step, lr_q * g rounds twice at most (lr_q to float32, the product) and the new weight
    once: 2(1+u) u lr_q |g| + u/(1-u) |w_q(s+1)| + 2^-149 (subnormals); plus the float64 arithmetic
    of this comparison itself.
    """
    w0, wr = [p.double() for p in zero.params], [p.double() for p in other.params]
    dlr = zero.lr - other.lr
    moved, predicted, bounds = [], [], []
    total, bound, g_abs = torch.zeros_like(w0[0]), torch.zeros_like(w0[0]), torch.zeros_like(w0[0])
    for t in range(len(w0)):
        moved.append((wr[t] - w0[t]) - (wr[0] - w0[0]))
        predicted.append(dlr * total)
        f64 = 4 * U64 * (w0[0].abs() + wr[0].abs() + w0[t].abs() + wr[t].abs()) + (t + 1) * U64 * abs(dlr) * g_abs
        bounds.append(bound + f64)
        if t < len(zero.grads):
            g = zero.grads[t].double()
            total, g_abs = total + g, g_abs + g.abs()
            bound = bound + sum(2 * (1 + U32) * U32 * lr * g.abs() + U32 / (1 - U32) * w[t + 1].abs() + SUBNORMAL
                                for lr, w in ((zero.lr, w0), (other.lr, wr)))
    return moved, predicted, bounds


@dataclass(frozen=True, kw_only=True)
class CaseDrift:
    """One case seen from rank 0 and the odd rank: the gap, how far it moved, its bound, the check's answer."""
    case: str
    initial_gap: float            # max |w_odd - w_0| after init
    final_gap: float              # ... after the last step
    moved: tuple[float, ...]      # max |gap(t) - gap(0)|, t = 0..T
    bound: tuple[float, ...]      # max of the rounding bound on that, t = 0..T
    agree: dict[str, bool]        # replicas_agree's answer (every rank's is checked to be the same)


@dataclass(frozen=True, kw_only=True)
class DriftData:
    """What the notebook prints: each case's CaseDrift, the parameter count, rank 0's check bytes by how."""
    cases: tuple[CaseDrift, ...]
    numel: int
    check_bytes: dict[str, tuple[int, int]]


def drift_spec(world_size: int, *, steps: int = 5, seed: int = 0) -> DriftSpec:
    """Five plain-SGD steps per case on `world_size` >= 2 ranks; rank 1 is the odd one."""
    return DriftSpec(world_size=world_size, steps=steps, seed=seed, odd_seed=seed + 1)


def _case_checks(spec: DriftSpec, case: str, runs: list[DriftRank]) -> tuple[list[Check], CaseDrift]:
    n, odd, zero = spec.world_size, spec.odd_rank, runs[0]
    stack = torch.stack
    checks = [exact_check(f"{case}: the all-reduced gradient is identical on every rank, every step",
                          [stack(r.grads) for r in runs], [stack(zero.grads)] * n,
                          "every rank receives the same sum from the all-reduce: bitwise")]
    others = [r for rank, r in enumerate(runs) if rank not in (0, odd)]
    if case == "same":
        checks.append(exact_check("same: every rank's parameters == rank 0's after init and after every step",
                                  [stack(r.params) for r in runs], [stack(zero.params)] * n,
                                  "same start, same gradient, same lr: the same float32 operations in the same order"))
    elif others:
        checks.append(exact_check(f"{case}: ranks other than {odd} == rank 0 after every step",
                                  [stack(r.params) for r in others], [stack(zero.params)] * len(others),
                                  "they share rank 0's start and lr and apply its gradient: bitwise"))
    moved, predicted, bounds = gap_change(zero, runs[odd])
    ratios = [bound_ratio(m, p, b) for m, p, b in zip(moved, predicted, bounds)]
    why = "one float32 rounding of each update on each rank (and of lr * g), summed over the steps"
    if case == "init":
        checks.append(Check(name=f"init: rank {odd} minus rank 0 stays its value at init after every step "
                                 "(in units of the rounding bound)", error=ratios[worst(ratios)], tolerance=1.0,
                            reason=why))
        checks.append(differ_check(f"init: rank {odd} still differs from rank 0 after the last step",
                                   runs[odd].params[-1], zero.params[-1], 1e-2,
                                   "other seeds give weights that differ by ~0.1; rounding moves them by < 1e-6"))
    elif case == "lr":
        checks.append(Check(name=f"lr: rank {odd} minus rank 0 moves by (lr_0 - lr_{odd}) x the shared gradient "
                                 "each step (in units of the rounding bound)", error=ratios[worst(ratios)],
                            tolerance=1.0, reason=why))
        grew = bound_ratio(moved[-1], torch.zeros_like(moved[-1]), bounds[-1])
        checks.append(Check(name=f"lr: rank {odd} minus rank 0 moved away from 0 (in units of the rounding bound)",
                            error=grew, tolerance=DRIFT_BY, must_differ=True,
                            reason=f"more than {DRIFT_BY:g}x what rounding can do: the replicas are drifting"))
    expected = case == "same"
    answers = [r.agree[how] for r in runs for how in HOWS]
    checks.append(fact_check(f"{case}: replicas_agree says {expected} on every rank (hash and broadcast)",
                             holds=all(a is expected for a in answers),
                             reason="rank 0's parameters compared with every rank's, bit for bit"))
    gap = lambda t: float((runs[odd].params[t].double() - zero.params[t].double()).abs().max())  # noqa: E731
    data = CaseDrift(case=case, initial_gap=gap(0), final_gap=gap(-1),
                     moved=tuple(float(m.abs().max()) for m in moved), bound=tuple(float(b.max()) for b in bounds),
                     agree=dict(zero.agree))
    return checks, data


def compare_drift(spec: DriftSpec, results: list[DriftRanks]) -> Verdict:
    """Each case's facts against the plain-SGD algebra; every all-reduce and check counted against its formula."""
    n = spec.world_size
    by_case = [list(runs) for runs in zip(*(r.runs for r in results), strict=True)]
    numel = by_case[0][0].params[0].numel()
    checks, exact, cases = [], [], []
    for case, runs in zip(CASES, by_case, strict=True):
        rows, data = _case_checks(spec, case, runs)
        checks += rows
        cases.append(data)
        exact += counts_per_rank("gradient all-reduces completed", [r.reduces for r in runs], [spec.steps] * n,
                                 case=case)
        exact += counts_per_rank("gradient all-reduce bytes sent", [r.reduce_bytes for r in runs],
                                 [spec.steps * 4 * numel] * n, case=case)
        for how in HOWS:
            formula = [check_bytes(how, numel, n, r) for r in range(n)]
            for i, quantity in enumerate(("check bytes sent", "check bytes received")):
                exact += counts_per_rank(quantity, [r.check_bytes[how][i] for r in runs], [f[i] for f in formula],
                                         case=f"{case}, {how}")
    data = DriftData(cases=tuple(cases), numel=numel, check_bytes=dict(by_case[0][0].check_bytes))
    return Verdict(checks=checks, exact=exact, data=data,
                   params={"steps": spec.steps, "lr": spec.lr, "odd_lr": spec.odd_lr, "odd_rank": spec.odd_rank})


DRIFT_DEMO = Experiment(name="dp-drift", chapter="01", world_sizes=(2, 3, 4), spec=drift_spec,
                        title="Replicas from other weights or another lr drift while every all-reduce succeeds",
                        ranks=drift_runs, compare=compare_drift)


def drift_demo(world_size: int, *, steps: int = 5, seed: int = 0) -> Report:
    """Same start, another start, another learning rate: what gradient sync keeps equal and what it does not."""
    return DRIFT_DEMO.run_spec(drift_spec(world_size, steps=steps, seed=seed))


# --- batch size and learning rate, one process --------------------------------------

@dataclass(frozen=True, kw_only=True)
class Arm:
    """One (batch size, lr) over the seeds: its final held-out losses and mean curve."""
    batch_size: int
    lr: float
    finals: tuple[float, ...]     # per seed
    mean_curve: tuple[float, ...] # mean over seeds at each point of equal samples seen
    trained: bool                 # every loss finite and the last below the first, on every seed

    @property
    def mean(self) -> float:
        return sum(self.finals) / len(self.finals)

    @property
    def spread(self) -> float:
        """max - min of the final loss over seeds (NaN once any is not finite)."""
        return max(self.finals) - min(self.finals) if all(map(math.isfinite, self.finals)) else math.nan


@dataclass(frozen=True, kw_only=True)
class ScalingRule:
    """One base lr: batch B at lr, k B at lr, k B at k lr, and what was measured between them."""
    base_lr: float
    small: Arm
    same: Arm
    scaled: Arm
    spread: float        # the larger seed-to-seed spread of `small` and `same`
    same_gap: float      # same.mean - small.mean
    scaled_gap: float    # scaled.mean - small.mean (not finite when it diverged)
    worst_gap: float     # max over equal-samples points of |scaled - small| mean curves


@dataclass(frozen=True, kw_only=True)
class BatchLRData:
    """Every curve, one ScalingRule per base lr, and the samples-seen axis they share."""
    rules: tuple[ScalingRule, ...]
    curves: tuple[Curve, ...]
    samples: tuple[int, ...]


def _arm(curves: list[Curve]) -> Arm:
    points = list(zip(*(c.losses for c in curves)))
    ok = all(all(map(math.isfinite, c.losses)) and c.losses[-1] < c.losses[0] for c in curves)
    return Arm(batch_size=curves[0].batch_size, lr=curves[0].lr, finals=tuple(c.losses[-1] for c in curves),
               mean_curve=tuple(sum(p) / len(p) for p in points), trained=ok)


def scaling_rules(spec: BatchLRSpec, curves: tuple[Curve, ...]) -> tuple[ScalingRule, ...]:
    """The measured relations per base lr (pure arithmetic over the curves)."""
    arms = {(a.batch_size, a.lr): a for a in (_arm([c for c in curves if (c.batch_size, c.lr) == key])
                                               for key in spec.arms())}
    big, out = spec.batch_size * spec.factor, []
    for lr in spec.base_lrs:
        small, same, scaled = arms[(spec.batch_size, lr)], arms[(big, lr)], arms[(big, spec.factor * lr)]
        worst_gap = max((abs(x - y) if math.isfinite(x) else math.inf)
                        for x, y in zip(scaled.mean_curve, small.mean_curve))
        out.append(ScalingRule(base_lr=lr, small=small, same=same, scaled=scaled,
                               spread=max(small.spread, same.spread), same_gap=same.mean - small.mean,
                               scaled_gap=scaled.mean - small.mean, worst_gap=worst_gap))
    return tuple(out)


def compare_batch_lr(spec: BatchLRSpec, results: list[tuple[Curve, ...]]) -> Verdict:
    """The text's claim as checks (the same lr at k B trains differently, beyond seed noise); k lr as data."""
    curves = results[0]
    rules, big = scaling_rules(spec, curves), spec.batch_size * spec.factor
    checks: list[Check] = []
    for r in rules:
        checks.append(fact_check(f"lr {r.base_lr:g}: batch {spec.batch_size} trains (finite, loss falls) on every seed",
                                 holds=r.small.trained, reason="the baseline the other runs are measured against"))
        checks.append(fact_check(f"lr {r.base_lr:g}: batch {big} at the same lr ends away from batch "
                                 f"{spec.batch_size} by more than the seed-to-seed spread",
                                 holds=r.same.trained and abs(r.same_gap) > r.spread,
                                 reason=f"same samples, {spec.factor}x fewer steps: mean final loss "
                                        f"{r.same.mean:.4f} vs {r.small.mean:.4f}, spread {r.spread:.4f}"))
    exact: list[Count] = []
    for b, lr in spec.arms():        # equal samples seen is what makes the curves comparable
        first = next(c for c in curves if (c.batch_size, c.lr, c.seed) == (b, lr, spec.seeds[0]))
        exact += counts_per_rank("samples seen", [first.samples[-1]], [spec.samples], case=f"batch {b}, lr {lr:g}")
        exact += counts_per_rank("held-out points", [len(first.losses)], [spec.samples // big + 1],
                                 case=f"batch {b}, lr {lr:g}")
    return Verdict(checks=checks, exact=exact, data=BatchLRData(rules=rules, curves=curves, samples=curves[0].samples),
                   params={"batch_size": spec.batch_size, "factor": spec.factor, "samples": spec.samples,
                           "base_lrs": spec.base_lrs, "seeds": spec.seeds})


def batch_lr_spec(world_size: int) -> BatchLRSpec:
    """Batch 8 vs 32 on 512 samples, base lr 0.1 and 0.2, four seeds; runs in this process (world_size 1)."""
    return BatchLRSpec(world_size=world_size)


BATCH_LR_DEMO = Experiment(name="dp-batch-lr", chapter="01", world_sizes=(1,), spec=batch_lr_spec,
                           title="Batch B vs 4B on the same samples: the same lr trains differently; 4x lr measured",
                           local=batch_lr_curves, compare=compare_batch_lr)


def batch_lr_demo(*, spec: BatchLRSpec | None = None) -> Report:
    """The batch-size runs (one process, a few seconds): the checks, and the measured rule in `report.data`."""
    return BATCH_LR_DEMO.run_spec(spec or batch_lr_spec(1))


def rule_lines(data: BatchLRData) -> list[str]:
    """One line per base lr, numbers to 3 decimals: what the notebook prints about the k x lr guess.

    "diverged" means the run did not train (`Arm.trained` is False): on some seed its loss ended
    above where it started, or stopped being finite.
    """
    out = []
    for r in data.rules:
        big = r.same.batch_size
        left = f" ({r.scaled_gap / r.same_gap:.0%} of the same-lr gap left)" if r.same_gap else ""
        scaled = f"{r.scaled.mean:.3f}{left}" if r.scaled.trained else "diverged"
        out.append(f"base lr {r.base_lr:g}: batch {r.small.batch_size} -> {r.small.mean:.3f} | batch {big}, lr "
                   f"{r.same.lr:g} -> {r.same.mean:.3f} | batch {big}, lr {r.scaled.lr:g} -> {scaled} | "
                   f"seed spread {r.spread:.3f}")
    return out


DEMOS = [DRIFT_DEMO, BATCH_LR_DEMO]
