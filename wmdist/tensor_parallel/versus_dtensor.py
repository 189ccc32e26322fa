"""Our column -> row MLP next to PyTorch's own: DTensor's parallelize_module with ColwiseParallel / RowwiseParallel.

Both run on the same gloo ranks, torch's on a CPU DeviceMesh over the whole
group (init_device_mesh("cpu", (N,)) reuses the default gloo group; it opens
no new one). The checks: each rank's local shards are the same slices of
the same weights (bitwise), the outputs and gradients agree, and torch
dispatches the same number of all-reduces as our ledger counts (one in
forward, one in backward).

DTensor rebuilds RowwiseParallel's input with DTensor.from_local, which
assumes every rank's shard has the same size: a hidden width N does not
divide makes the global width wrong (128 over 3 ranks reads as 3 x 43 = 129)
and the matmul fails. So this comparison uses hidden width 840 = lcm(1..8),
which every N from 1 to 8 divides; our own layers take uneven shards
(see block.py).

torch's collectives are counted where torch dispatches them: a small
TorchDispatchMode notes every functional collective op (what torch's
CommDebugMode does too, without the 5 s its import costs every rank).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wmdist.comm import Context, counted
from wmdist.tensor_parallel.layers import tp_group
from wmdist.tensor_parallel.layouts import MLP_NAMES, MLPRun, make_mlp, mlp_inputs, mlp_slice, run_mlp_layout
from wmdist.models.transformer import TransformerConfig

DTENSOR_CONFIG = TransformerConfig(width=210, heads=1)     # MLP hidden width 4 * 210 = 840 = lcm(1, ..., 8)
COLLECTIVE_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


class CollectiveCounter(TorchDispatchMode):
    """Counts the functional collectives torch dispatches inside the block (e.g. "_c10d_functional.all_reduce")."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func.overloadpacket)
        if "c10d" in name and name.rsplit(".", 1)[-1] in COLLECTIVE_OPS:
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@dataclass(kw_only=True, frozen=True)
class DTensorRun:
    """What torch's tensor parallelism held and computed on one rank."""
    local_params: dict[str, torch.Tensor]     # each parameter's local shard (whole for a replicated one)
    output: torch.Tensor                      # (B, T, H)
    input_grad: torch.Tensor
    grads: dict[str, torch.Tensor]            # local shards of the gradients
    comm_counts: dict[str, int]               # collective op name -> calls, as torch dispatched them


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a plain tensor passes through), detached."""
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def dtensor_mlp(ctx: Context, cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> DTensorRun:
    """torch's ColwiseParallel (fc1) and RowwiseParallel (fc2) on this rank: forward and backward once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = parallelize_module(copy.deepcopy(make_mlp(cfg, seed=seed)), mesh,
                               {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x, dy = mlp_inputs(cfg, batch, seq, seed=seed)
    x.requires_grad_()
    calls = 2 if ctx.world_size > 1 else 0
    payload = calls * x.numel() * x.element_size()
    label = "DTensor MLP forward + backward (payload: 2 all-reduces of (B, T, H) float32; calls counted by dispatch)"
    with counted(ctx, label, "dtensor", sent=payload, recv=payload), CollectiveCounter() as mode:
        y = model(x)
        y.backward(dy)
        y = torch.Tensor(y.wait()) if hasattr(y, "wait") else y
    params = dict(zip(MLP_NAMES, model.parameters()))
    return DTensorRun(local_params={n: _local(p) for n, p in params.items()}, output=y.detach().clone(), input_grad=x.grad.clone(),
                      grads={n: _local(p.grad) for n, p in params.items()},
                      comm_counts=dict(mode.calls))


@dataclass(frozen=True)
class OursAndTorch:
    """One rank's column -> row MLP by our layers, the shards we hold, and torch's DTensor run of the same MLP."""
    ours: MLPRun
    shards: dict[str, torch.Tensor]           # our local slices of the weights, by parameter name
    torch: DTensorRun


def ours_and_dtensor(ctx: Context, cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> OursAndTorch:
    """Rank function: our column -> row MLP (with the shards we hold), then torch's."""
    tp = tp_group(ctx)
    ours = run_mlp_layout(ctx, tp, cfg, "column -> row", batch, seq, seed=seed)
    full = dict(zip(MLP_NAMES, (p.detach() for p in make_mlp(cfg, seed=seed).parameters())))
    shards = {n: mlp_slice(n, t, cfg, tp.size, tp.rank, layout="column -> row").clone() for n, t in full.items()}
    return OursAndTorch(ours, shards, dtensor_mlp(ctx, cfg, batch, seq, seed=seed))
