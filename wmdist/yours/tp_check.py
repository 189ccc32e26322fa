"""tensor_parallel(first, second, x, world_size=N): chapter 04's column -> row pair on your two nn.Linears.

`first` is split by output features (column-parallel: rank r keeps rows of its weight), `second` by input
features (row-parallel: the matching columns), with your elementwise `activation` between them, as
Megatron-LM splits an MLP. The layers are chapter 04's (wmdist.tensor_parallel.layers): forward has one
all-reduce (second's partial outputs), backward one (first's input-gradient shares). Forward and backward
run once with a fixed upstream gradient dY (seeded normal), so every rank and the reference backpropagate
the same numbers.

torch's own tensor parallelism runs the same pair on the same ranks (tp_torch.py: DTensor's
ColwiseParallel -> RowwiseParallel, where world_size divides the hidden width) and is judged the same way.

Checks, every rank against one process: the output, the input gradient, and each rank's slices of the
weight and bias gradients. Tolerance, as chapter 04 argues it (tensor_parallel/compare.py): splitting
regroups float32 sums and nothing else (second's output and first's input gradient are sums over the
hidden features, computed as N partials and added around the ring; the other sums keep their terms but
a kernel may order them differently at another shard width, which on this build it does), so each
tensor X may differ by 2(K-1) u max|X| with K = max(in, hidden, out, rows), the longest sum involved.
A first-order allowance, not a bound: it takes partial sums within max|X| and does not add up how the
activation passes an earlier difference on. Exact counts (tensor_parallel.compare.collective_counts):
collectives, calls of each op, bytes sent by each against costs.tensor_parallel.Collective, rounds,
order. On one rank the bias is still added after the (trivial) sum, where F.linear may fuse it into its
matrix product, so one rank is checked to the same allowance: it happens to be bitwise on this build.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmdist import costs
from wmdist.comm import Context
from wmdist.costs.tensor_parallel import Collective
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.compare import worst as worst_of
from wmdist.course.report import Check, Report, max_abs_error
from wmdist.tensor_parallel.compare import collective_counts
from wmdist.tensor_parallel.layers import (ColumnSpec, Measured, RowSpec, column_linear, measured_collectives,
                                           row_linear, tp_group)
from wmdist.yours.tp_torch import NOT_RUN, dtensor_pair, torch_runs
from wmdist.yours.workload import ship_by_value

NAMES = ("output", "input grad", "first.weight grad", "first.bias grad", "second.weight grad", "second.bias grad")


@dataclass(frozen=True, kw_only=True)
class LinearPairSpec:
    """Your two layers, input and upstream gradient, checked before any process starts."""
    world_size: int
    w1: torch.Tensor              # (F, in)
    b1: torch.Tensor              # (F,), zeros if `first` has no bias
    w2: torch.Tensor              # (out, F)
    b2: torch.Tensor              # (out,)
    x: torch.Tensor               # (..., in)
    dy: torch.Tensor              # (..., out): the upstream gradient
    activation: Callable[[torch.Tensor], torch.Tensor]

    @property
    def hidden_sizes(self) -> list[int]:
        """Hidden features per rank (tensor_split layout)."""
        return costs.ring_chunk_sizes(self.w1.shape[0], self.world_size)


@dataclass(frozen=True)
class PairResult:
    """One rank's output, gradients (its slices of the split weights) and its collectives as measured."""
    tensors: dict[str, torch.Tensor]
    collectives: list[Measured]
    torch: dict[str, torch.Tensor] | None = None    # the same pair by DTensor (None where it cannot run)


def hidden_slice(spec: LinearPairSpec, rank: int) -> slice:
    """Rank `rank`'s hidden features."""
    sizes = spec.hidden_sizes
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def pair_rank(ctx: Context, spec: LinearPairSpec) -> PairResult:
    """Rank function: first column-parallel, activation, second row-parallel; forward, then backward with dY."""
    tp = tp_group(ctx)
    mine = hidden_slice(spec, ctx.rank)
    w1, b1 = spec.w1[mine].clone().requires_grad_(), spec.b1[mine].clone().requires_grad_()
    w2, b2 = spec.w2[:, mine].contiguous().requires_grad_(), spec.b2.clone().requires_grad_()
    x = spec.x.clone().requires_grad_()
    hidden = spec.activation(column_linear(x, w1, b1, tp, ColumnSpec(site="first")))        # (..., F_r)
    y = row_linear(hidden, w2, b2, tp, RowSpec(site="second"))                                # (..., out)
    y.backward(spec.dy)
    values = (y, x.grad, w1.grad, b1.grad, w2.grad, b2.grad)
    ours = PairResult(dict(zip(NAMES, (v.detach() for v in values))), measured_collectives(ctx.ledger))
    if not torch_runs(ctx.world_size, spec.w1.shape[0]):
        return ours
    theirs = dtensor_pair(ctx, spec.w1, spec.b1, spec.w2, spec.b2, spec.x, spec.dy, spec.activation)
    return PairResult(ours.tensors, ours.collectives, theirs)


def one_device(spec: LinearPairSpec) -> dict[str, torch.Tensor]:
    """The pair in this process on the whole weights: output and every gradient."""
    w1, b1, w2, b2, x = (t.clone().requires_grad_() for t in (spec.w1, spec.b1, spec.w2, spec.b2, spec.x))
    y = F.linear(spec.activation(F.linear(x, w1, b1)), w2, b2)
    y.backward(spec.dy)
    return dict(zip(NAMES, (v.detach() for v in (y, x.grad, w1.grad, b1.grad, w2.grad, b2.grad))))


def expected_slice(full: dict[str, torch.Tensor], spec: LinearPairSpec, rank: int) -> dict[str, torch.Tensor]:
    """What rank `rank` should hold: the whole output and input gradient, its slices of the split weights."""
    mine = hidden_slice(spec, rank)
    return {**full, "first.weight grad": full["first.weight grad"][mine],
            "first.bias grad": full["first.bias grad"][mine], "second.weight grad": full["second.weight grad"][:, mine]}


def schedule(spec: LinearPairSpec) -> list[Collective]:
    """The pair's collectives: second's forward all-reduce of (rows, out), first's backward one of (rows, in)."""
    n = spec.world_size
    return [Collective("second", "forward", "all-reduce", tuple(costs.ring_chunk_sizes(spec.dy.numel(), n))),
            Collective("first", "backward", "all-reduce", tuple(costs.ring_chunk_sizes(spec.x.numel(), n)))]


def pair_terms(spec: LinearPairSpec) -> int:
    """K = max(in, hidden, out, rows): the longest float32 sum the split regroups or reorders."""
    rows = spec.x.numel() // spec.x.shape[-1]
    return max(spec.w1.shape[1], spec.w1.shape[0], spec.w2.shape[0], rows)


def compare_pair(spec: LinearPairSpec, results: list[PairResult]) -> Verdict:
    """Every rank's output and gradients against one process; the collectives against their formula."""
    full, k = one_device(spec), pair_terms(spec)
    why = (f"first-order allowance for float32 sums regrouped by rank: 2(K-1) 2^-24 max|X|, K = max(in, hidden, "
           f"out, rows) = {k} (assumes partial sums within max|X|)")
    checks: list[Check] = []
    for name in NAMES:
        errors = [max_abs_error(r.tensors[name], expected_slice(full, spec, i)[name]) for i, r in enumerate(results)]
        worst = worst_of(errors)                                             # a NaN before any number
        want = expected_slice(full, spec, worst)[name]
        tol = costs.reordered_sum_bound(k, float(want.abs().max())) if torch.isfinite(want).all() else float("nan")
        checks.append(Check(name=f"{name} == one process, every rank", error=errors[worst], tolerance=tol,
                            reason=why, detail=f"rank {worst}"))
    if all(r.torch is not None for r in results):       # torch's DTensor: the same slices, the same allowance
        for name in NAMES:
            errors = [max_abs_error(r.torch[name], expected_slice(full, spec, i)[name]) for i, r in enumerate(results)]
            worst = worst_of(errors)
            tol = next(c.tolerance for c in checks if c.name.startswith(f"{name} =="))
            checks.append(Check(name=f"DTensor {name} == one process, every rank", error=errors[worst],
                                tolerance=tol, reason=why, detail=f"rank {worst}"))
    exact = collective_counts([r.collectives for r in results], schedule(spec), "column -> row")
    params = {"in": spec.w1.shape[1], "hidden": spec.w1.shape[0], "out": spec.w2.shape[0],
              "rows": spec.x.numel() // spec.x.shape[-1], "hidden_per_rank": spec.hidden_sizes,
              "torch": ("DTensor ColwiseParallel -> RowwiseParallel" if results and results[0].torch is not None
                        else NOT_RUN.format(n=spec.world_size, hidden=spec.w1.shape[0]))}
    return Verdict(checks=checks, exact=exact, params=params, data=full)


PAIRS = ("tensor_parallel splits one pair only: first = nn.Linear split column-wise (by output features), an "
         "elementwise activation, then second = nn.Linear split row-wise (by input features, the same hidden "
         "units), as Megatron-LM splits an MLP; not a convolution, an attention, an embedding or a whole model. "
         "Why the column -> row pairing needs no gather between the two: chapter 04, "
         "notebooks/04_tensor_parallel.ipynb, its opening section ('Megatron-LM's pairing')")


def pair_spec(first: nn.Linear, second: nn.Linear, x: torch.Tensor, *, world_size: int,
              activation: Callable[[torch.Tensor], torch.Tensor], seed: int) -> LinearPairSpec:
    """Check the layers, input and activation; draw dY from `seed`. ValueError/TypeError before any process."""
    for name, layer in (("first", first), ("second", second)):
        if not isinstance(layer, nn.Linear) or layer.weight.dtype != torch.float32:
            got = type(layer).__name__ if not isinstance(layer, nn.Linear) else f"an nn.Linear of {layer.weight.dtype}"
            raise TypeError(f"{name} must be a float32 nn.Linear, got {got}. {PAIRS}")
    n = costs.require_int("world_size", world_size, 1)
    costs.require_int("seed", seed, 0)
    hidden = first.out_features
    if second.in_features != hidden:
        raise ValueError(f"second.in_features ({second.in_features}) must equal first.out_features ({hidden}): "
                         f"second reads the hidden units first writes. {PAIRS}")
    if n > hidden:
        raise ValueError(f"world_size {n} is more than first's {hidden} output features: a rank would hold none")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != first.in_features:
        raise ValueError(f"x must be a float32 tensor of shape (..., {first.in_features}), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not callable(activation):
        raise TypeError(f"activation must be an elementwise callable (torch.relu), got {type(activation).__name__}")
    probe = torch.zeros(2, hidden)
    if not isinstance(out := activation(probe), torch.Tensor) or out.shape != probe.shape:
        raise ValueError("activation must map a tensor to one of the same shape (elementwise)")
    ship_by_value(activation)
    dy = torch.randn(*x.shape[:-1], second.out_features, generator=torch.Generator().manual_seed(seed))

    def bias(layer: nn.Linear) -> torch.Tensor:
        return (layer.bias if layer.bias is not None else torch.zeros(layer.out_features)).detach().clone()
    return LinearPairSpec(world_size=n, w1=first.weight.detach().clone(), b1=bias(first),
                          w2=second.weight.detach().clone(), b2=bias(second), x=x.detach().clone(), dy=dy,
                          activation=activation)


def tensor_parallel(first: nn.Linear, second: nn.Linear, x: torch.Tensor, *, world_size: int = 2,
                    activation: Callable[[torch.Tensor], torch.Tensor] = torch.relu, seed: int = 0) -> Report:
    """Split `first` column-wise and `second` row-wise over `world_size` ranks; forward and backward vs one process."""
    spec = pair_spec(first, second, x, world_size=world_size, activation=activation, seed=seed)
    return Experiment(name="your-model-tensor-parallel", chapter="04", world_sizes=(spec.world_size,),
                      title="Your two Linears: column -> row parallel vs one process",
                      spec=lambda n: spec, ranks=pair_rank, compare=compare_pair).run_spec(spec)
