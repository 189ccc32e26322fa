"""Your two Linears under torch's own tensor parallelism: DTensor's ColwiseParallel then RowwiseParallel.

The same pair, weights, input and upstream gradient as our column -> row run, on the same gloo ranks
(a CPU DeviceMesh over the whole group). DTensor's RowwiseParallel rebuilds its input with
DTensor.from_local, which takes every rank's shard to be the same size, so torch runs only where
world_size divides the hidden width; elsewhere the Report says it was not run and why (our layers
take uneven shards). Each rank returns what it holds as plain tensors: the whole output and input
gradient, its shard of first's weight and bias and of second's weight, and second's bias gradient.
"""
from __future__ import annotations

import torch
from torch import nn

from wmdist.comm import Context

NOT_RUN = ("DTensor not run: world_size {n} does not divide the hidden width {hidden} (RowwiseParallel's "
           "DTensor.from_local assumes equal shards)")


class _Pair(nn.Module):
    """first -> activation -> second, as one module DTensor can parallelize by submodule name."""

    def __init__(self, first: nn.Linear, second: nn.Linear, activation) -> None:
        super().__init__()
        self.first, self.second, self.activation = first, second, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # (..., in) -> (..., out)
        return self.second(self.activation(self.first(x)))


def torch_runs(world_size: int, hidden: int) -> bool:
    """Whether DTensor can run the pair: equal hidden shards on every rank."""
    return hidden % world_size == 0


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or an async collective's result, as a detached plain tensor."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    if hasattr(t, "wait"):
        t = t.wait()
    return torch.Tensor(t).detach().clone() if type(t) is not torch.Tensor else t.detach().clone()


def dtensor_pair(ctx: Context, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                 x: torch.Tensor, dy: torch.Tensor, activation) -> dict[str, torch.Tensor]:
    """Rank function part: the pair by parallelize_module, forward and backward with dY; what this rank holds.

    Keys follow tp_check.NAMES. torch's collectives go through the functional collectives the runtime
    counts and matches like every other call.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    first, second = nn.Linear(w1.shape[1], w1.shape[0]), nn.Linear(w2.shape[1], w2.shape[0])
    with torch.no_grad():
        for layer, w, b in ((first, w1, b1), (second, w2, b2)):
            layer.weight.copy_(w)
            layer.bias.copy_(b)
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = parallelize_module(_Pair(first, second, activation), mesh,
                               {"first": ColwiseParallel(), "second": RowwiseParallel()})
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(dy)
    return {"output": _plain(y), "input grad": _plain(x.grad), "first.weight grad": _plain(model.first.weight.grad),
            "first.bias grad": _plain(model.first.bias.grad), "second.weight grad": _plain(model.second.weight.grad),
            "second.bias grad": _plain(model.second.bias.grad)}
