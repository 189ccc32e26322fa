"""Our data-parallel training against one process on the whole batch, and against PyTorch's DDP.

The same model, batches and optimizer run three ways: our ranks (gradients
summed by the counted ring all-reduce, wmdist.data_parallel.training), torch's
DistributedDataParallel (its own buckets and gloo all-reduce, counted through a
comm hook), and one process. Equal to within the rounding of sums taken in
another order, never bitwise: that is the point of chapter 01.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from torch import nn

from wmdist import costs
from wmdist.comm import Context, all_reduce, counted
from wmdist.data_parallel.training import (TrainSpec, dp_train, grad_tolerance, make_optimizer, param_tolerance,
                                           single_process_train, step_batch)
from wmdist.models import WorldModelConfig, flat_params, make_model, shard_batch
from wmdist.report import Demo, Report, close_check, counts_per_rank, exact_check, max_abs_error
from wmdist.runtime import run


def _counted_allreduce_hook(ctx, bucket):   # no annotations: DDP rejects string (postponed) ones
    """DDP comm hook (ctx: Context, bucket: dist.GradBucket): DDP's default average, counted in the ledger."""
    buf = bucket.buffer().div_(ctx.world_size)
    pending = all_reduce(ctx, buf, phase="ddp/grads", async_op=True)
    return pending.future().then(lambda f: f.value()[0])


def ddp_train(ctx: Context, spec: TrainSpec) -> dict:
    """Rank function: the same run with torch's DistributedDataParallel doing the averaging."""
    model = make_model(spec.seed, WorldModelConfig(batchnorm=spec.batchnorm))
    state = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    # DDP broadcasts rank 0's parameters and buffers while it is built; the bytes are the state's size.
    with counted(ctx, "broadcast (inside DDP's constructor; bytes = model state size)", "ddp/init",
                 sent=state, recv=state):
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
        opt.step()
    return {"params": flat_params(model), "payload": ctx.ledger.totals("ddp/grads", kind="collective")}


@dataclass(frozen=True)
class TrainComparison:
    """How far apart the three runs ended (max |difference| of the final parameters)."""
    ours_vs_single: float
    ddp_vs_single: float

    @property
    def bitwise_equal(self) -> bool:
        return self.ours_vs_single == 0.0


def train_demo(world_size: int, spec: TrainSpec | None = None) -> Report:
    """DP with the ring all-reduce vs one process on the whole batch vs DDP, after several steps."""
    spec = spec or TrainSpec()
    if spec.weighting != "mean" or spec.sizes is not None or spec.batchnorm or spec.skew_momentum:
        raise ValueError("train_demo compares against DDP: use equal shards, weighting 'mean', no pitfalls")
    start = time.perf_counter()
    ours = run(dp_train, world_size, spec)
    theirs = run(ddp_train, world_size, spec)
    seconds = time.perf_counter() - start
    ref = single_process_train(spec)
    gtol = grad_tolerance(ref["grad0"])
    ptol = param_tolerance(spec, gtol, ref["params"])
    why_g = "float32 sums in another order: per shard, then across ranks (64 ulps of max|g|)"
    why_p = f"gradient rounding carried through {spec.steps} {spec.optimizer} steps"
    checks = [close_check("step-0 gradient == full-batch gradient", ours[0]["grad0"], ref["grad0"], gtol, why_g),
              close_check("final parameters == single process (rank 0)", ours[0]["params"], ref["params"], ptol, why_p),
              exact_check("every rank holds the same parameters", [o["params"] for o in ours],
                          [ours[0]["params"]] * world_size, "all ranks apply the same all-gathered sum"),
              close_check("final parameters == DDP (rank 0)", ours[0]["params"], theirs[0]["params"], ptol, why_p),
              close_check("DDP final parameters == single process", theirs[0]["params"], ref["params"], ptol, why_p)]
    numel = ref["params"].numel()
    exact = [c for s in range(spec.steps) for c in counts_per_rank(
        "ring bytes sent", [o["bytes_per_step"][s] for o in ours],
        [costs.ring_allreduce_bytes(numel, world_size, r) for r in range(world_size)], step=s)]
    exact += counts_per_rank("DDP bucket payload bytes", [t["payload"]["bytes_sent"] for t in theirs],
                             [spec.steps * numel * 4] * world_size, phase="ddp/grads")
    data = TrainComparison(max_abs_error(ours[0]["params"], ref["params"]),
                           max_abs_error(theirs[0]["params"], ref["params"]))
    return Report("dp-train", world_size, checks, exact, seconds,
                  {"steps": spec.steps, "batch_size": spec.batch_size, "optimizer": spec.optimizer,
                   "numel": numel}, data)


DEMOS = [Demo("dp-train", "Data parallel (ring all-reduce) vs one process vs DDP, 3 SGD steps",
              train_demo, world_sizes=(1, 2, 4), chapter="01")]
