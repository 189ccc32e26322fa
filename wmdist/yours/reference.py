"""One process, the whole batch: what every run on your model is checked against, and how closely.

The gradient. Data parallelism changes two things about the step's gradient, and this module bounds
each, per entry, from quantities measured on the reference's own run (`batch_gradient_bound`):

1. The kernels. Each rank runs the forward and backward on B/N examples, one process on B. A CPU
   matrix product or convolution picks its blocking, and so the order of its inner sums, by the
   shapes, so the same example's activations, and its gradient contribution g_i / B, come out in other
   last bits at B/N than at B (a correct MLP of width 256 at 2 examples a rank: activations 6e-7 apart,
   the gradient up to 68x what reordering the B terms alone can do, in plain torch as in wmdist). No
   short formula bounds that through a network (it is every dot product's rounding carried through
   every layer after it), so it is measured: this process computes the step's gradient again laid out
   as the ranks lay it out, the N shards of B/N consecutive examples (with torch's scale 1/(B/N), / N
   too, when N is not a power of two and that scale rounds otherwise), and laid out one example at a
   time, each sum of parts taken in float64; `kernel` is the largest |layout - whole batch| per entry.
   The layouts are the ranks' own shapes, plus one more, so that a kernel that also varies with memory
   alignment or a batch of one is inside the measured spread, not only the exact shard shape.
2. The order of the sum. Within a rank and across ranks (the ring adds the N shard sums chunk by
   chunk), the B contributions are added in another order than the reference's. Two sums of the same
   B terms differ by at most `costs.reordered_sum_bound(B, sum_i |g_i| / B)` per entry: every partial
   sum is at most the sum of the terms' absolute values (not |the sum|: the terms cancel), each of the
   2(B-1) additions rounds by at most u of it, plus GRAD_EXTRA_ROUNDINGS roundings of the loss scale.
   The g_i are the per-example gradients of the one-at-a-time layout (float64 for the sum of |g_i|).

So bound = kernel + (2(B-1) + 3) u sum_i |g_i| / B. Where the ranks compute exactly as this process
does at B/N rows, kernel is the whole difference but for the order, and a correct run lands just
inside (0.40 to 0.998 of the bound over 48 correct runs of that MLP: 1, 2, 8 a rank, 2 and 4 ranks). Tight where it matters: a wrong average (x N or / N),
a missing all-reduce or an off-by-one shard moves entries by a sizeable part of |g| itself, and
tests/test_yours_small_batch.py plants each (and a skipped step) and sees it fail by more than 10x,
while correct runs of an MLP at 1, 2 and 8 examples a rank on 2 and 4 ranks pass. For a conv net and a GRU
(tests/test_yours.py) the layouts are the same, so the same two parts apply; a GRU's weight gradient
sums B x T terms, whose order within each example the kernel term measures at both shapes.

The parameters after several steps. How far such gradient differences carry through the optimizer
(curvature; Adam's 1/sqrt(v), large where |g| is near its eps) has no short bound, so it is measured,
as chapters 01 and 03 do: the reference is run again with every gradient entry of every step moved by
its full bound, with random signs kept from step to step (PROBE_SEEDS, each pattern and its negation:
an error of the same sign every step adds up), and the largest displacement of the final parameters,
plus one float32 rounding of |theta| per step, is the tolerance (`workload_param_tolerance`; its formula is
written out in tests/test_pinned_numbers.py). Measured, not derived, and the checks say so.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.course.compare import one_thread
from wmdist.yours.footprint import release_freed_memory
from wmdist.yours.refusals import require_finite
from wmdist.yours.training import workload_optimizer
from wmdist.yours.workload import (Workload, batch_size, build_model, flat, frozen, rows, set_trainable_grads,
                                   trainable, trainable_grads)

GRAD_EXTRA_ROUNDINGS = 3    # the loss scale in each run (2: 1/B, or 1/(B/N) for torch's), a division by N (1)
PROBE_SEEDS = (1, 2)        # the sign patterns the reference is perturbed with (each, and its negation)


@dataclass(frozen=True, kw_only=True)
class OneProcessRun:
    """The reference's result: the step-0 gradient, the final parameters, each step's gradient bound."""
    grad0: torch.Tensor                       # (P,) the whole batch's mean-loss gradient at step 0
    params: torch.Tensor                      # (P,) the trainable parameters after the last step
    frozen: torch.Tensor                      # the frozen ones at the start, flat: every run must end with these
    grad_bounds: tuple[torch.Tensor, ...]     # per step, (P,) float32 (rounded up): how far a split gradient may move


def _gradients(work: Workload, model: torch.nn.Module, part: object, scale: float, *,
               then_divide: int = 1) -> tuple[torch.Tensor, ...]:
    """The gradient of sum(loss(model, part)) * scale, per parameter (then / then_divide, in float32 as DDP's
    bucket is)."""
    grads = torch.autograd.grad(work.loss(model, part).sum() * scale, trainable(model))
    return tuple(g / then_divide for g in grads) if then_divide != 1 else grads


def _up(t: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded up, never down: a bound stored in half the bytes is still a bound."""
    low = t.float()
    return torch.where(low.double() < t, torch.nextafter(low, torch.tensor(torch.inf)), low)


CHUNK = 1 << 18             # elements per piece of an elementwise float64 step: its temporaries stay ~2 MiB


@dataclass(frozen=True, kw_only=True)
class GradientTerms:
    """What one step's gradient bound is made of, per entry, (P,) float32 each, rounded up (see the module doc)."""
    abs_sum: torch.Tensor        # sum_i |g_i| / B, the examples' contributions one at a time (summed in float64)
    kernel: torch.Tensor         # max over the layouts of |layout's sum - the whole batch's| (float64 sums)


def _max_gap_into(kernel: torch.Tensor, total: torch.Tensor, whole: torch.Tensor) -> None:
    """kernel = max(kernel, |total - whole| rounded up), piece by piece: kernel and whole float32, total float64,
    all flat views of one parameter."""
    for start in range(0, total.numel(), CHUNK):
        piece = slice(start, start + CHUNK)
        gap = _up((total[piece] - whole[piece].double()).abs_())
        torch.maximum(kernel[piece], gap, out=kernel[piece])


def gradient_terms(work: Workload, model: torch.nn.Module, batch: object, world_size: int,
                   whole: torch.Tensor) -> GradientTerms:
    """The step's gradient laid out one example at a time and as world_size shards, against `whole` (the whole
    batch's (P,) gradient at these parameters). Per parameter, in running float64 sums (P float64 each, the
    one-at-a-time sum of |g_i| freed before the shards): one example's (or shard's) gradient held at a time."""
    b = batch_size(batch, where="batch")
    each = b // world_size
    sizes = [p.numel() for p in trainable(model)]
    abs_out, kernel = torch.empty(sum(sizes)), torch.zeros(sum(sizes))
    abs_parts, kernel_parts = torch.split(abs_out, sizes), torch.split(kernel, sizes)
    wholes = torch.split(whole, sizes)
    abs_sum = [torch.zeros(n, dtype=torch.float64) for n in sizes]
    total = [torch.zeros(n, dtype=torch.float64) for n in sizes]
    for i in range(b):
        for a, t, g in zip(abs_sum, total, _gradients(work, model, rows(batch, i, i + 1), 1 / b)):
            a += g.reshape(-1).abs()
            t += g.reshape(-1)
    for out, a in zip(abs_parts, abs_sum):
        for start in range(0, a.numel(), CHUNK):
            out[start:start + CHUNK] = _up(a[start:start + CHUNK])
    del abs_sum
    for k, t, w in zip(kernel_parts, total, wholes):
        _max_gap_into(k, t, w)
    layouts = [(1 / b, 1)] + ([(1 / each, world_size)] if world_size & (world_size - 1) else [])
    for scale, divide in layouts:              # torch's 1/(B/N), / N rounds otherwise than 1/B when N is no 2^k
        for t in total:
            t.zero_()
        for r in range(world_size):
            part = rows(batch, r * each, (r + 1) * each)
            for t, g in zip(total, _gradients(work, model, part, scale, then_divide=divide)):
                t += g.reshape(-1)
        for k, t, w in zip(kernel_parts, total, wholes):
            _max_gap_into(k, t, w)
    return GradientTerms(abs_sum=abs_out, kernel=kernel)


def roundoff(dtype: torch.dtype) -> float:
    """The unit roundoff u of the parameters' dtype: costs.FLOAT32_ROUNDOFF or costs.FLOAT64_ROUNDOFF."""
    return costs.FLOAT64_ROUNDOFF if dtype == torch.float64 else costs.FLOAT32_ROUNDOFF


def batch_gradient_bound(b: int, terms: GradientTerms, *,
                         unit_roundoff: float = costs.FLOAT32_ROUNDOFF) -> torch.Tensor:
    """Per entry, how far a data-parallel gradient of a batch of b may differ from the whole batch's: (P,),
    float32 rounded up. kernel + (2(b-1) + GRAD_EXTRA_ROUNDINGS) u abs_sum (the module doc derives it), u the
    parameters' unit roundoff."""
    order = costs.reordered_sum_bound(b, 1.0, extra_roundings=GRAD_EXTRA_ROUNDINGS, unit_roundoff=unit_roundoff)
    out = torch.empty_like(terms.kernel)
    for start in range(0, out.numel(), CHUNK):
        piece = slice(start, start + CHUNK)
        out[piece] = _up(terms.kernel[piece].double() + order * terms.abs_sum[piece].double())
    return out


def one_process(work: Workload, world_size: int, *,
                perturb: tuple[tuple[torch.Tensor, ...], torch.Tensor] | None = None) -> OneProcessRun:
    """Your model trained on the whole batch in this process, on one thread (as every rank runs).

    Each step's gradient bound is for `world_size` ranks (their shards are one of its layouts).
    `perturb=(bounds, signs)` adds signs * bounds[step] to each step's gradient before the optimizer sees it
    (signs: (P,) of +-1, the same at every step), and skips computing the bounds: what `workload_param_tolerance`
    measures with.
    """
    with one_thread():
        model = build_model(work)
        start_frozen = flat(frozen(model)).clone()
        opt, bounds = workload_optimizer(model, work), []
        for step in range(work.steps):
            batch = work.batch(step)
            b = batch_size(batch, where="batch")
            opt.zero_grad()
            losses = work.loss(model, batch)
            require_finite(losses, step=step, where="the one-process reference" + (", a tolerance probe" if perturb else ""))
            (losses.sum() / b).backward()
            grad = trainable_grads(model)
            if step == 0:
                grad0 = grad.clone()
            if perturb is None:
                bounds.append(batch_gradient_bound(b, gradient_terms(work, model, batch, world_size, grad),
                                             unit_roundoff=roundoff(grad.dtype)))
            else:                                                                     # sign * bound: exact
                set_trainable_grads(model, (grad.double() + perturb[1] * perturb[0][step]).to(grad.dtype))
            opt.step()
    return OneProcessRun(grad0=grad0, params=flat(trainable(model)), frozen=start_frozen, grad_bounds=tuple(bounds))


def probe_signs(numel: int) -> Iterator[torch.Tensor]:
    """The sign patterns param_tolerance perturbs with: per seed of PROBE_SEEDS a random (numel,) pattern of +-1,
    and its negation. Each is kept at every step: an entry's rounding error can have the same sign step after
    step and add up (Adam moves an entry whose |g| is near eps by up to lr per step), which signs redrawn each
    step would mostly cancel. (numel,) float32 each, made one at a time."""
    for seed in PROBE_SEEDS:
        sign = (torch.randint(0, 2, (numel,), generator=torch.Generator().manual_seed(seed)) * 2 - 1).float()
        yield sign
        yield sign.neg_()


def probe_displacement(work: Workload, reference: OneProcessRun) -> float:
    """The largest |final parameter - reference's| over the probe runs (bounds applied with probe_signs)."""
    moved = 0.0
    for sign in probe_signs(reference.params.numel()):
        probe = one_process(work, 1, perturb=(reference.grad_bounds, sign))
        moved = max(moved, float((probe.params - reference.params).abs().max()))
        del probe
        release_freed_memory()
    return moved


def workload_param_tolerance(work: Workload, reference: OneProcessRun) -> float:
    """Allowed max |difference| of the final parameters from the reference's (measured; see the module doc):
    probe_displacement + steps * u * max|theta|, u the parameters' unit roundoff."""
    u = roundoff(reference.params.dtype)
    return probe_displacement(work, reference) + work.steps * u * float(reference.params.abs().max())


PARAM_WHY = ("measured: one process moved by at most this when every gradient entry of its {steps} {optimizer} "
             "steps was moved by its full bound (random signs, each pattern and its negation, kept step to step), plus one "
             "rounding of |theta| a step")
GRAD_WHY = ("per entry: the kernels' measured change between the whole batch and the same gradient laid out "
            "as the ranks' shards or one example at a time, plus reordered_sum_bound(B, sum_i |g_i| / B) for the "
            "order of the sum; shown in units of that bound")
