"""One process, the whole batch: what every run on your model is checked against, and how closely.

The gradient. Splitting the batch over N ranks changes how the batch's per-example gradient
contributions are added up (per shard, then across ranks) and nothing else, if each example's
contribution g_i / B is computed by the same float32 operations whatever batch it sits in. Two sums of
the same B terms in other orders differ by at most `costs.reordered_sum_bound(B, sum_i |g_i| / B)` per
entry: every partial sum is at most sum_i |g_i| / B. The per-example gradients g_i are computed here by
looping over the examples (a batch of one each; float64 for the sum of their absolute values), plus
GRAD_EXTRA_ROUNDINGS roundings of the loss scale. torch's DDP and FSDP2 scale by 1/(B/N) and divide the
sum by N: the same scale exactly when N is a power of two (as in the tests); otherwise every backward
operation may round differently, which those roundings do not cover.

What that assumes, and what this build does. The assumption is that a kernel computes each example's
share the same way at every batch size (batch-size invariance). On this build (torch 2.13, CPU) it does
not hold exactly: the per-example losses of a Conv2d + ReLU + Linear net and of a GRU + Linear differ in
their last bits between a batch of 1, of B/N and of B (the convolution and matrix-product kernels pick
their blocking by shape; conv net, 5 seeds: 24 of 80 examples differ between B/N = 4 and B = 16), and a
GRU's weight gradient is one sum over B x T terms, not B sums of T. So the bound is not a proof for such
models. Measured through data_parallel and zero(stage=3) (tests/test_yours.py's two models, 5 seeds each,
B/N = 8/2, 16/4, 12/3, 32/2): the largest |difference| / bound was 0.46 (conv net, B = 12 on 3 ranks) and
0.19 (GRU, B = 8 on 2), so every gradient check passed inside it. A check that fails on your model is a
finding (its kernels' differences add up, or it mixes examples), not a reason to widen the bound.

The parameters after several steps. How far such gradient differences carry through the optimizer
(curvature; Adam's 1/sqrt(v)) has no short bound, so it is measured, as chapters 01 and 03 do: the
reference is run again with every gradient entry of every step moved by its full bound, with random
signs (PROBE_SEEDS), and the largest displacement of the final parameters, plus one float32 rounding
of |theta| per step, is the tolerance. Measured, not derived, and the checks say so.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.compare import one_thread
from wmdist.models import flat_grads, flat_params, set_flat_grads
from wmdist.yours.training import make_optimizer
from wmdist.yours.workload import Workload, batch_size, build_model, rows

GRAD_EXTRA_ROUNDINGS = 3    # the loss scale in each run (2: 1/B, or 1/(B/N) for torch's), a division by N (1)
PROBE_SEEDS = (1, 2)        # sign patterns the reference is perturbed with


@dataclass(frozen=True, kw_only=True)
class OneProcessRun:
    """The reference's result: the step-0 gradient, the final parameters, each step's gradient bound."""
    grad0: torch.Tensor                       # (P,) the whole batch's mean-loss gradient at step 0
    params: torch.Tensor                      # (P,) after the last step
    grad_bounds: tuple[torch.Tensor, ...]     # per step, (P,) float64: how far rounding may move a split gradient


def example_terms(work: Workload, model: torch.nn.Module, batch: object) -> torch.Tensor:
    """sum_i |g_i| / B over the batch's examples, each g_i from a batch of one: (P,), float64."""
    b = batch_size(batch, where="batch")
    params = list(model.parameters())
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for i in range(b):
        grads = torch.autograd.grad(work.loss(model, rows(batch, i, i + 1)).sum() / b, params)
        total += torch.cat([g.reshape(-1) for g in grads]).double().abs()
    return total


def gradient_bound(work: Workload, model: torch.nn.Module, batch: object) -> torch.Tensor:
    """Per entry, how far two sums of the batch's B per-example contributions may differ: (P,), float64."""
    b = batch_size(batch, where="batch")
    return costs.reordered_sum_bound(b, 1.0, extra_roundings=GRAD_EXTRA_ROUNDINGS) * example_terms(work, model, batch)


def one_process(work: Workload, *, perturb: tuple[tuple[torch.Tensor, ...], int] | None = None) -> OneProcessRun:
    """Your model trained on the whole batch in this process, on one thread (as every rank runs).

    `perturb=(bounds, seed)` adds +-bounds[step] (random signs from `seed`) to each step's gradient before
    the optimizer sees it, and skips computing the bounds: what `param_tolerance` measures with.
    """
    with one_thread():
        model = build_model(work)
        opt, bounds = make_optimizer(model, work), []
        signs = torch.Generator().manual_seed(perturb[1]) if perturb else None
        for step in range(work.steps):
            batch = work.batch(step)
            opt.zero_grad()
            (work.loss(model, batch).sum() / batch_size(batch, where="batch")).backward()
            grad = flat_grads(model)
            if step == 0:
                grad0 = grad.clone()
            if perturb is None:
                bounds.append(gradient_bound(work, model, batch))
            else:
                sign = torch.randint(0, 2, grad.shape, generator=signs) * 2 - 1              # (P,) of +-1
                set_flat_grads(model, (grad.double() + sign * perturb[0][step]).float())
            opt.step()
    return OneProcessRun(grad0=grad0, params=flat_params(model), grad_bounds=tuple(bounds))


def param_tolerance(work: Workload, reference: OneProcessRun) -> float:
    """Allowed max |difference| of the final parameters from the reference's (measured; see the module doc)."""
    moved = max(float((one_process(work, perturb=(reference.grad_bounds, seed)).params - reference.params)
                      .abs().max()) for seed in PROBE_SEEDS)
    return moved + work.steps * costs.FLOAT32_ROUNDOFF * float(reference.params.abs().max())


PARAM_WHY = ("measured: one process moved by at most this when every gradient entry of its {steps} {optimizer} "
             "steps was perturbed by its full reordering bound (random signs), plus one rounding of |theta| a step")
GRAD_WHY = ("the batch's per-example gradient contributions summed in another order: per entry at most "
            "reordered_sum_bound(B, sum_i |g_i| / B) (assumes each example's share is computed alike at any "
            "batch size); shown in units of that bound")
