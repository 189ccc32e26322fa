"""Gradient compression with torch's own DDP comm hooks, run on our ranks and counted in our ledger.

The hooks are torch's, unchanged: `allreduce_hook` (no compression), `fp16_compress_hook`,
`bf16_compress_hook` and `powerSGD_hook` (rank r, error feedback on or off). They call
`torch.distributed.all_reduce` themselves, some of them from a future's callback on gloo's thread,
which our ledger would not see. So for the length of each backward pass (DDP waits for every
hook's future before backward returns) the hook modules' `dist` is an object whose all_reduce
records the tensor it is handed, under the ledger's all-reduce convention (B bytes sent, B
received), and then calls torch's own: the bytes are observed at the call, not computed. The
modules get torch.distributed back when backward returns, whatever happens.

Each step also computes the exact float32 average of the N local gradients (our counted all-reduce
of [g, |g|, loss], phase "compression/reference", outside the hook's phase), so the error of what
DDP applied is measured against the uncompressed average at the same parameters.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from wmdist.comm import Context, all_reduce, counted
from wmdist.costs.compression import KINDS, Kind
from wmdist.costs.validate import require_bool, require_choice, require_int
from wmdist.data_parallel.training import TrainSpec, make_optimizer, step_batch
from wmdist.models.world import flat_grads, make_model, shard_batch

REFERENCE_PHASE = "compression/reference"


@dataclass(frozen=True, kw_only=True)
class Method:
    """One way to all-reduce DDP's buckets: a torch hook, PowerSGD's rank and error feedback where it applies."""
    kind: Kind
    rank: int = 1                      # PowerSGD's matrix_approximation_rank
    error_feedback: bool = True        # PowerSGD's use_error_feedback

    def __post_init__(self) -> None:
        require_choice("kind", self.kind, KINDS)
        require_int("rank", self.rank, 1)
        require_bool("error_feedback", self.error_feedback)

    @property
    def label(self) -> str:
        if self.kind != "powersgd":
            return self.kind
        return f"powersgd r={self.rank}" + ("" if self.error_feedback else " no-EF")

    @property
    def phase(self) -> str:
        return f"compression/{self.label}"


@dataclass(frozen=True, kw_only=True)
class CompressionSpec:
    """Every method trained from the same init on the same batches, on `world_size` ranks."""
    world_size: int
    train: TrainSpec
    methods: tuple[Method, ...]
    start_iter: int = 2                # PowerSGD's start_powerSGD_iter: plain all-reduce before this step
    min_compression_rate: float = 2.0  # PowerSGD's default


@dataclass(frozen=True, kw_only=True)
class MethodRun:
    """What one rank measured for one method, step by step (T steps, P gradient entries)."""
    label: str
    hook_bytes: tuple[int, ...]        # bytes the hook handed to all_reduce in each step (observed)
    hook_calls: tuple[int, ...]        # all_reduce calls the hook made in each step
    applied: torch.Tensor              # (T, P) the gradient DDP left in .grad (what SGD applied)
    exact: torch.Tensor                # (T, P) float32 average of the N local gradients
    abs_mean: torch.Tensor             # (T, P) sum_i |g_i| / N, what the rounding bounds scale with
    losses: tuple[float, ...]          # T + 1: global-batch loss before each step, then on batch T after the last


@dataclass(frozen=True)
class CompressionRanks:
    """One rank's runs, one per method, in the spec's order."""
    runs: tuple[MethodRun, ...]


class _CountingDist:
    """torch.distributed as torch's hook modules see it, except that all_reduce is recorded in ctx's ledger."""

    def __init__(self, ctx: Context, phase: str, real: Any):
        self._ctx, self._phase, self._real = ctx, phase, real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        size = tensor.numel() * tensor.element_size()
        op = self._real.ReduceOp.SUM if op is None else op
        with counted(self._ctx, f"all_reduce of {tensor.dtype} inside torch's comm hook", self._phase,
                     sent=size, recv=size):
            return self._real.all_reduce(tensor, op=op, group=group, async_op=async_op)


HOOK_MODULES = (default_hooks, powerSGD_hook)


@contextlib.contextmanager
def counting_hook_all_reduce(ctx: Context, phase: str) -> Iterator[None]:
    """While open, every all_reduce that torch's default and PowerSGD hook modules post is recorded in ctx's ledger.

    Only those two modules' name `dist` is swapped (for an object that forwards everything else to
    torch.distributed), so nothing else in the process is touched; it is put back on exit, whatever happens.
    """
    originals = [m.dist for m in HOOK_MODULES]
    for m in HOOK_MODULES:
        m.dist = _CountingDist(ctx, phase, m.dist)
    try:
        yield
    finally:
        for m, original in zip(HOOK_MODULES, originals):
            m.dist = original


def _bf16_on_gloo(state, bucket):   # no annotations: DDP rejects string (postponed) ones
    """torch's bf16_compress_hook, unchanged, under another name.

    DDP refuses a hook *named* bf16_compress_hook unless CUDA and NCCL >= 2.10 are present (NCCL's
    bfloat16 sums); gloo sums bfloat16 tensors on CPU, so the same function is registered by this name.
    """
    return default_hooks.bf16_compress_hook(state, bucket)


def _register(ddp: nn.parallel.DistributedDataParallel, method: Method, spec: CompressionSpec) -> None:
    if method.kind == "none":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif method.kind == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method.kind == "bf16":
        ddp.register_comm_hook(None, _bf16_on_gloo)
    else:
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=method.rank,
                                            start_powerSGD_iter=spec.start_iter,
                                            min_compression_rate=spec.min_compression_rate,
                                            use_error_feedback=method.error_feedback, warm_start=True, random_seed=0)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _loss(model: nn.Module, shard: dict[str, torch.Tensor]) -> torch.Tensor:
    pred_obs, pred_rew = model(shard["obs"], shard["actions"])
    return ((pred_obs - shard["next_obs"]).pow(2).mean(dim=(1, 2))
            + (pred_rew - shard["reward"]).pow(2).mean(dim=1)).mean()


def method_run(ctx: Context, spec: CompressionSpec, method: Method) -> MethodRun:
    """Train `spec.train.steps` SGD steps under `method`'s hook; measure each step against the exact average."""
    n, train = ctx.world_size, spec.train
    model = make_model(seed=train.seed)
    params = list(model.parameters())
    # One bucket for the whole model (2,105 entries): PowerSGD's per-tensor layout does not depend on it.
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64)
    _register(ddp, method, spec)
    opt = make_optimizer(model, train)
    sizes = train.shard_sizes(n)
    hook_bytes, calls, applied, exact, abs_mean, losses = [], [], [], [], [], []
    for step in range(train.steps):
        shard = shard_batch(step_batch(train, step), sizes, ctx.rank)
        plain = _loss(model, shard)                                          # the module itself, not DDP
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(plain, params)])   # (P,) this rank's gradient
        loss_now = plain.detach().reshape(1)
        sums = all_reduce(ctx, torch.cat([g, g.abs(), loss_now]), phase=REFERENCE_PHASE)
        exact.append(sums[:g.numel()] / n)
        abs_mean.append(sums[g.numel():-1] / n)
        losses.append(float(sums[-1]) / n)
        opt.zero_grad()
        before = len(ctx.ledger.select(phase=method.phase, kind="collective"))
        loss = _loss(ddp, shard)
        with counting_hook_all_reduce(ctx, method.phase):
            loss.backward()
        records = ctx.ledger.select(phase=method.phase, kind="collective")[before:]
        hook_bytes.append(sum(r.bytes_sent for r in records))
        calls.append(len(records))
        applied.append(flat_grads(model))
        opt.step()
    after = _loss(model, shard_batch(step_batch(train, train.steps), sizes, ctx.rank)).detach().reshape(1)
    losses.append(float(all_reduce(ctx, after, phase=REFERENCE_PHASE)) / n)     # held out: the next step's batch
    return MethodRun(label=method.label, hook_bytes=tuple(hook_bytes), hook_calls=tuple(calls),
                     applied=torch.stack(applied), exact=torch.stack(exact), abs_mean=torch.stack(abs_mean),
                     losses=tuple(losses))


def compression_runs(ctx: Context, spec: CompressionSpec) -> CompressionRanks:
    """Rank function: every method of `spec`, one after another, from the same init and batches."""
    return CompressionRanks(tuple(method_run(ctx, spec, m) for m in spec.methods))
