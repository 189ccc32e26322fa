"""Data-parallel pitfalls, each shown failing the way the text says, next to the fix.

- Unequal shards: the plain mean of per-rank mean gradients is not the
  full-batch gradient; weighting each rank by its example count is.
- Unequal valid-token counts: per-rank per-token means, averaged, are wrong;
  normalizing by the global valid-token count is right.
- Local BatchNorm normalizes each shard by its own statistics: the data-parallel
  gradient is the gradient of a different function.
- Gradient all-reduce leaves buffers alone: BatchNorm running statistics drift
  apart across ranks although the parameters stay identical.
- Ranks that start from different optimizer state diverge although every
  gradient they apply is synchronized.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from wmdist import costs
from wmdist.comm import Context, all_reduce, ring_all_reduce
from wmdist.course.compare import bound_ratio, worst
from wmdist.data_parallel.training import (DPRuns, DPSpecs, TrainSpec, by_run, descending_sizes, dp_runs,
                                           single_process_train, valid_lengths)
from wmdist.course.exercises import Exercise
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, differ_check, exact_check


WRONG_BY = 1000.0   # a pitfall's gradient must miss by this many rounding bounds at some entry


def _pitfall_world(world_size: int) -> int:
    n = costs.require_int("world_size", world_size, 1)
    if n < 2:
        raise ValueError(f"world_size must be >= 2 for a pitfall to show (one rank has no one to disagree with), "
                         f"got {n}")
    return n


@dataclass(frozen=True)
class UnequalShards:
    """How unequal the demo's shards were: examples per rank, valid time steps per rank."""
    shard_sizes: list[int]
    valid_tokens_per_rank: list[int]


UNEQUAL = ("mean", "examples", "tokens-local", "tokens")          # the order of unequal_spec's runs


def unequal_spec(world_size: int, *, seed: int = 0) -> DPSpecs:
    """Unequal shards (2N-1, ..., 3, 1) under both example weightings, then unequal valid-token counts under both."""
    n = _pitfall_world(world_size)
    by_examples = TrainSpec(steps=1, batch_size=n * n, sizes=descending_sizes(n), seed=seed)
    by_tokens = TrainSpec(steps=1, batch_size=4 * n, seq_len=6, weighting="tokens", seed=seed)
    return DPSpecs(world_size=n, runs=(by_examples, replace(by_examples, weighting="examples"),
                                       replace(by_tokens, weighting="tokens-local"), by_tokens))


def compare_unequal(specs: DPSpecs, results: list[DPRuns]) -> Verdict:
    """Each weighting's step-0 gradient on every rank against the full batch's, in units of the rounding bound."""
    n, outs = specs.world_size, dict(zip(UNEQUAL, by_run(results), strict=True))
    by_examples, by_tokens = specs.runs[0], specs.runs[3]
    ref_ex, ref_tok = single_process_train(by_examples), single_process_train(by_tokens)
    ratio = {}
    for w in UNEQUAL:                # every rank's gradient, the worst shown (a NaN on any rank fails)
        ref = ref_tok if w.startswith("tokens") else ref_ex
        per_rank = [bound_ratio(o.grad0, ref.grad0, ref.grad_bounds[0]) for o in outs[w]]
        ratio[w] = per_rank[worst(per_rank)]
    why = "float32 sums of the same row terms in another order: within reordered_sum_bound at every entry"
    wrong = f"more than {WRONG_BY:g}x what reordering can explain at some entry: a different gradient, not rounding"
    checks = [Check(name="weighted by examples (n_r / n) == full-batch gradient (in units of the rounding bound)",
                    error=ratio["examples"], tolerance=1.0, reason=why),
              Check(name="plain mean of per-rank mean gradients is WRONG for unequal shards (in units of the bound)",
                    error=ratio["mean"], tolerance=WRONG_BY, reason=wrong, must_differ=True),
              Check(name="weighted by global valid-token count == full-batch per-token gradient (in units of the bound)",
                    error=ratio["tokens"], tolerance=1.0, reason=why),
              Check(name="plain mean of per-rank per-token means is WRONG for unequal token counts (in units of the bound)",
                    error=ratio["tokens-local"], tolerance=WRONG_BY, reason=wrong, must_differ=True)]
    numel = ref_ex.grad0.numel()
    exact = counts_per_rank("ring bytes sent", [o.bytes_per_step[0] for o in outs["examples"]],
                            [costs.ring_allreduce_bytes(numel, n, r) for r in range(n)], case="examples-weighted")
    lengths = valid_lengths(by_tokens.batch_size, 6)
    data = UnequalShards(list(by_examples.shard_sizes(n)),
                         [int(lengths[s].sum()) for s in _slices(by_tokens.shard_sizes(n))])
    return Verdict(checks=checks, exact=exact, params={"sizes": data.shard_sizes}, data=data)


UNEQUAL_DEMO = Experiment(name="dp-unequal", chapter="01", world_sizes=(2, 4), spec=unequal_spec,
                          title="Unequal shards and token counts: plain mean (wrong) vs weighted (right)",
                          ranks=dp_runs, compare=compare_unequal)


def unequal_demo(world_size: int, *, seed: int = 0) -> Report:
    """Unequal shards (2N-1, ..., 3, 1) and unequal valid-token counts: naive means vs proper weights."""
    return UNEQUAL_DEMO.run_spec(unequal_spec(world_size, seed=seed))


def _slices(sizes: list[int]) -> list[slice]:
    ends = torch.tensor(sizes).cumsum(0).tolist()
    return [slice(e - s, e) for s, e in zip(sizes, ends)]


def pitfalls_spec(world_size: int, *, seed: int = 0) -> DPSpecs:
    """Three steps with local BatchNorm, then three with ranks > 0 starting from skewed momentum."""
    n = _pitfall_world(world_size)
    return DPSpecs(world_size=n, runs=(TrainSpec(steps=3, batchnorm=True, seed=seed),
                                       TrainSpec(steps=3, skew_momentum=True, seed=seed)))


def compare_pitfalls(specs: DPSpecs, results: list[DPRuns]) -> Verdict:
    """Each pitfall shown failing: BatchNorm's gradient and running statistics, skewed momentum's parameters."""
    n = specs.world_size
    bn_out, skew_out = by_run(results)
    ref = single_process_train(specs.runs[0])
    stats = [o.running_mean for o in bn_out]
    params = [o.params for o in skew_out]
    checks = [Check(name="local BatchNorm: DP gradient differs from the full-batch gradient (in units of the rounding "
                    "bound, nn.Linear entries)", error=bound_ratio(bn_out[0].grad0, ref.grad0, ref.grad_bounds[0],
                                                             covered_only=True), tolerance=WRONG_BY,
                    reason=f"more than {WRONG_BY:g}x what reordering can explain: each rank normalizes with its own "
                    "shard's mean and variance, so DP computes another function", must_differ=True),
              exact_check("BatchNorm run: parameters still identical on every rank", [o.params for o in bn_out],
                          [bn_out[0].params] * n, "every rank applied the same all-reduced gradient"),
              differ_check("BatchNorm running_mean differs between ranks after 3 steps", stats[1:], stats[:1] * (n - 1),
                           1e-3, "buffers are not gradients: the all-reduce never touches them (1e-3 >> rounding)"),
              exact_check("skewed momentum: step-0 gradients identical on every rank",
                          [o.grad0 for o in skew_out], [skew_out[0].grad0] * n,
                          "the all-gather hands every rank the same sum"),
              differ_check("skewed momentum: parameters differ between ranks after 3 steps", params[1:],
                           params[:1] * (n - 1), 1e-4, "momentum 0.01*randn moves params by lr*0.01-ish per step "
                           "(1e-4 >> rounding); gradient sync cannot repair state it never sees")]
    return Verdict(checks=checks, params={"steps": 3})


PITFALLS_DEMO = Experiment(name="dp-pitfalls", chapter="01", world_sizes=(2, 4), spec=pitfalls_spec,
                           title="Local BatchNorm, unsynchronized buffers, skewed optimizer state",
                           ranks=dp_runs, compare=compare_pitfalls)


def pitfalls_demo(world_size: int, *, seed: int = 0) -> Report:
    """Local BatchNorm, unsynchronized running statistics and skewed optimizer state, each failing."""
    return PITFALLS_DEMO.run_spec(pitfalls_spec(world_size, seed=seed))


DEMOS = [UNEQUAL_DEMO, PITFALLS_DEMO]


# --- exercise: the example-weighted mean --------------------------------------------

def weighted_mean_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r: a local mean gradient (10,) and its example count (1,), counts 2N-1, ..., 1."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(10, generator=g), torch.tensor([float(descending_sizes(world_size)[rank])])


def weighted_mean_solution(ctx: Context, grad: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """sum_r n_r g_r / sum_r n_r, the full-batch mean gradient, on every rank."""
    total = all_reduce(ctx, count.clone(), phase="count")
    return ring_all_reduce(ctx, grad * count, phase="weighted grads") / total


WEIGHTED_MEAN = Exercise(
    name="weighted mean of unequal shards",
    task="Each rank holds the mean gradient `grad` of its own shard and the shard's example count `count`. "
         "Return the gradient of the whole batch's mean loss, the same on every rank.",
    reference=weighted_mean_solution,
    make_inputs=weighted_mean_inputs,
    world_sizes=(2, 4),
    tolerance=1e-5,
    reason="scaling before or after the sum rounds differently: a few float32 ulps of values below 10",
    hint="ranks must agree on the total count before dividing: all-reduce the counts too.",
)
EXERCISES = [WEIGHTED_MEAN]
