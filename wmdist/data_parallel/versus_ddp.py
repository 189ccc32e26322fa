"""Our data-parallel training against one process on the whole batch, and against PyTorch's DDP.

The same model, batches and optimizer run three ways: our ranks (gradients
summed by the counted ring all-reduce, wmdist.data_parallel.training), torch's
DistributedDataParallel (its own buckets and gloo all-reduce, counted through a
comm hook), and one process. Equal to within the rounding of sums taken in
another order, never bitwise: that is the point of chapter 01.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from wmdist import costs
from wmdist.comm import Context, all_reduce, counted
from wmdist.course.compare import bound_ratio
from wmdist.data_parallel.training import (DPRun, TrainSpec, Weighting, dp_train, make_optimizer, param_tolerance,
                                           single_process_train, step_batch)
from wmdist.course.experiment import Experiment, Verdict
from wmdist.models.world import WorldModelConfig, flat_grads, flat_params, make_model, shard_batch
from wmdist.course.report import Check, Report, close_check, counts_per_rank, exact_check, max_abs_error


def _counted_allreduce_hook(ctx, bucket):   # no annotations: DDP rejects string (postponed) ones
    """DDP comm hook (ctx: Context, bucket: dist.GradBucket): DDP's default average, counted in the ledger."""
    buf = bucket.buffer().div_(ctx.world_size)
    pending = all_reduce(ctx, buf, phase="ddp/grads", async_op=True)
    return pending.future().then(lambda f: f.value()[0])


@dataclass(frozen=True)
class DDPRun:
    """What one rank of the DDP run ends with."""
    params: torch.Tensor          # (P,) after the last step
    grad0: torch.Tensor           # (P,) DDP's averaged step-0 gradient
    payload_bytes: int            # bytes its comm hook all-reduced, all steps


def ddp_train(ctx: Context, spec: TrainSpec) -> DDPRun:
    """Rank function: the same run with torch's DistributedDataParallel doing the averaging."""
    model = make_model(seed=spec.seed, cfg=WorldModelConfig(batchnorm=spec.batchnorm))
    state = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    # DDP broadcasts rank 0's parameters and buffers while it is built, inside torch where our ledger
    # cannot see the wire: the record's bytes are computed (the model state's size), not observed.
    with counted(ctx, "DDP constructor broadcast (not observed: bytes computed from the model state size)",
                 "ddp/init", sent=state, recv=state):
        ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(ctx, _counted_allreduce_hook)
    opt = make_optimizer(model, spec)
    sizes = spec.shard_sizes(ctx.world_size)
    for step in range(spec.steps):
        shard = shard_batch(step_batch(spec, step), sizes, ctx.rank)
        opt.zero_grad()
        pred_obs, pred_rew = ddp(shard["obs"], shard["actions"])    # forward through DDP: it arms the hooks
        loss = ((pred_obs - shard["next_obs"]).pow(2).mean(dim=(1, 2))
                + (pred_rew - shard["reward"]).pow(2).mean(dim=1)).mean()
        loss.backward()
        if step == 0:
            grad0 = flat_grads(model)                               # (P,) DDP's averaged gradient
        opt.step()
    return DDPRun(flat_params(model), grad0, ctx.ledger.totals(phase="ddp/grads", kind="collective")["bytes_sent"])


@dataclass(frozen=True, kw_only=True)
class VersusSpec:
    """The comparison's run, decided before any process starts (train_spec_for): `train` on `world_size` ranks."""
    world_size: int
    train: TrainSpec


@dataclass(frozen=True)
class Both:
    """One rank's run with our ring all-reduce, then with DDP."""
    ours: DPRun
    theirs: DDPRun


def ours_and_ddp(ctx: Context, spec: VersusSpec) -> Both:
    """Rank function: the same training run twice, our data parallelism first, then torch's DDP."""
    return Both(dp_train(ctx, spec.train), ddp_train(ctx, spec.train))


@dataclass(frozen=True)
class TrainComparison:
    """How far apart the runs ended (max |difference| of the final parameters), and how the batch was split."""
    ours_vs_single: float
    ddp_vs_single: float
    shard_sizes: tuple[int, ...]
    weighting: Weighting           # what our run used: "mean" for equal shards, "examples" otherwise

    @property
    def bitwise_equal(self) -> bool:
        return self.ours_vs_single == 0.0

    @property
    def even(self) -> bool:
        return len(set(self.shard_sizes)) == 1


def train_spec_for(world_size: int, *, spec: TrainSpec | None = None) -> TrainSpec:
    """The spec our ranks run: the text's plain mean when N divides the batch, weights by examples otherwise.

    An uneven split is what a learner gets from `train_demo(3)` with the
    default batch of 16: 6/5/5 examples. The plain mean 1/N sum_r g_r is then
    the wrong gradient (chapter 01's pitfall), so our run weights each rank by
    its example count, as the chapter teaches; DDP, which always divides by N,
    is shown missing the single process instead. Raises ValueError before any
    process starts for a spec the comparison cannot use.
    """
    spec = spec or TrainSpec()
    n = costs.require_int("world_size", world_size, 1)
    if n > spec.batch_size:
        raise ValueError(f"world_size must be <= batch_size {spec.batch_size} (every rank needs an example), got {n}")
    if spec.weighting not in ("mean", "examples") or spec.sizes is not None or spec.batchnorm or spec.skew_momentum:
        raise ValueError("train_demo compares against DDP: give no sizes, weighting 'mean' or 'examples', no pitfalls")
    even = spec.batch_size % n == 0
    return spec if even or spec.weighting == "examples" else replace(spec, weighting="examples")


def versus_spec(world_size: int, *, spec: TrainSpec | None = None) -> VersusSpec:
    """train_spec_for(world_size, spec=spec) on `world_size` ranks, its shards checked against N."""
    train = train_spec_for(world_size, spec=spec)
    train.shard_sizes(world_size)
    return VersusSpec(world_size=world_size, train=train)


def compare_ddp(versus: VersusSpec, results: list[Both]) -> Verdict:
    """Ours and DDP against one process on the whole batch, and each other; the ring bytes and DDP's payload."""
    spec, world_size = versus.train, versus.world_size
    ours, theirs = [r.ours for r in results], [r.theirs for r in results]
    sizes = tuple(spec.shard_sizes(world_size))
    even = len(set(sizes)) == 1
    ref = single_process_train(spec)
    bound, ptol = ref.grad_bounds[0], param_tolerance(spec, ref)
    why_g = ("float32 sums of the same B*T row terms in another order: per entry at most "
             "reordered_sum_bound(B*T, sum|terms|); shown in units of that bound")
    why_p = (f"measured: the reference moved by at most this when every gradient entry of its {spec.steps} "
             f"{spec.optimizer} steps was perturbed by its full rounding bound")
    checks = [Check(name="step-0 gradient == full-batch gradient (in units of the rounding bound)",
                    error=bound_ratio(ours[0].grad0, ref.grad0, bound), tolerance=1.0, reason=why_g),
              close_check("final parameters == single process (rank 0)", ours[0].params, ref.params, ptol, why_p),
              exact_check("every rank holds the same parameters", [o.params for o in ours],
                          [ours[0].params] * world_size, "all ranks apply the same all-gathered sum")]
    if even:
        checks += [close_check("final parameters == DDP (rank 0)", ours[0].params, theirs[0].params, ptol, why_p),
                   close_check("DDP final parameters == single process", theirs[0].params, ref.params, ptol,
                               why_p)]
    else:
        checks += [Check(name=f"DDP's plain mean on uneven shards {'/'.join(map(str, sizes))} is WRONG: step-0 gradient "
                         "vs full batch (in units of the rounding bound)",
                         error=bound_ratio(theirs[0].grad0, ref.grad0, bound), tolerance=1000.0,
                         reason="DDP divides the sum by N whatever each rank's example count: a different gradient, "
                         "more than 1000x what reordering can explain at some entry", must_differ=True)]
    numel = ref.params.numel()
    exact = [c for s in range(spec.steps) for c in counts_per_rank(
        "ring bytes sent", [o.bytes_per_step[s] for o in ours],
        [costs.ring_allreduce_bytes(numel, world_size, r) for r in range(world_size)], step=s)]
    exact += counts_per_rank("DDP bucket payload bytes", [t.payload_bytes for t in theirs],
                             [spec.steps * numel * 4] * world_size, phase="ddp/grads")
    data = TrainComparison(max_abs_error(ours[0].params, ref.params),
                           max_abs_error(theirs[0].params, ref.params), sizes, spec.weighting)
    params = {"steps": spec.steps, "batch_size": spec.batch_size, "optimizer": spec.optimizer, "numel": numel,
              "weighting": spec.weighting, "shard_sizes": list(sizes)}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


TRAIN_DEMO = Experiment(name="dp-train", chapter="01", world_sizes=(1, 2, 3, 4), spec=versus_spec,
                        title="Data parallel (ring all-reduce) vs one process vs DDP, 3 SGD steps",
                        ranks=ours_and_ddp, compare=compare_ddp)


def train_demo(world_size: int, *, spec: TrainSpec | None = None) -> Report:
    """DP with the ring all-reduce vs one process on the whole batch vs DDP, after several steps."""
    return TRAIN_DEMO.run_spec(versus_spec(world_size, spec=spec))


DEMOS = [TRAIN_DEMO]
