"""One MLP, four ways to split it: the collectives follow from the layout, not from "tensor parallelism" as such.

    column -> row                   Megatron: fc1's output shards feed fc2 as they are. 1 all-reduce each way.
    column+gather -> row            the same, but fc1's output is gathered first and fc2 takes its slice back:
                                    the same result for two all-gathers of the wide hidden activation more.
    column+gather -> column+gather  both layers split by output: every input arrives whole, so every input
                                    gradient is a partial sum (all-reduce in backward), outputs are gathered.
    row -> row                      both split by input: every output is a partial sum (all-reduce in
                                    forward), every input gradient a gathered slice.

All four compute the single-device MLP; `costs.tensor_parallel.mlp_schedule`
predicts each one's collectives and exact bytes.
Shapes: x (B, T, H); the hidden activation (B, T, F); F_r / H_r this rank's share.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F

from wmdist.comm import Context
from wmdist.costs.tensor_parallel import MLP_LAYOUTS, MLPLayout, shard_sizes
from wmdist.tensor_parallel.layers import (
    ColumnSpec,
    Measured,
    RowSpec,
    TPGroup,
    column_linear,
    measured_collectives,
    offset,
    row_linear,
    tp_group,
)
from wmdist.models.transformer import MLP, TransformerConfig
from wmdist.models import seeded

MLP_NAMES = ("mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")
R = TypeVar("R")


def mlp_shard_dims(layout: MLPLayout) -> dict[str, tuple[int, str] | None]:
    """For each MLP parameter: (dim, "hidden" or "width") it is split along in `layout`, or None (whole)."""
    if layout in ("column -> row", "column+gather -> row"):
        return {"mlp.fc1.weight": (0, "hidden"), "mlp.fc1.bias": (0, "hidden"), "mlp.fc2.weight": (1, "hidden"),
                "mlp.fc2.bias": None}
    if layout == "column+gather -> column+gather":
        return {"mlp.fc1.weight": (0, "hidden"), "mlp.fc1.bias": (0, "hidden"), "mlp.fc2.weight": (0, "width"),
                "mlp.fc2.bias": (0, "width")}
    if layout == "row -> row":
        return {"mlp.fc1.weight": (1, "width"), "mlp.fc1.bias": None, "mlp.fc2.weight": (1, "hidden"),
                "mlp.fc2.bias": None}
    raise ValueError(f"layout must be one of {MLP_LAYOUTS}, got {layout!r}")


def mlp_slice(name: str, full: torch.Tensor, cfg: TransformerConfig, world_size: int, rank: int, *,
              layout: MLPLayout) -> torch.Tensor:
    """Rank `rank`'s slice, in `layout`, of a tensor shaped like MLP parameter `name` (weight or gradient)."""
    where = mlp_shard_dims(layout)[name]
    if where is None:
        return full
    dim, axis = where
    sizes = tuple(shard_sizes(cfg.hidden if axis == "hidden" else cfg.width, world_size))
    return full.narrow(dim, offset(sizes, rank), sizes[rank])


def mlp_forward(params: dict[str, torch.Tensor], x: torch.Tensor, tp: TPGroup, cfg: TransformerConfig, *,
                layout: MLPLayout) -> torch.Tensor:
    """fc2(gelu(fc1(x))) with this rank's `params` (mlp_slice of each), x (B, T, H) whole on every rank."""
    hidden = tuple(shard_sizes(cfg.hidden, tp.size))
    width = tuple(shard_sizes(cfg.width, tp.size))
    w1, b1, w2, b2 = (params[n] for n in MLP_NAMES)
    if layout == "column -> row":
        h = column_linear(x, w1, b1, tp, ColumnSpec(site="mlp.fc1"))                          # (B, T, F_r)
        return row_linear(F.gelu(h), w2, b2, tp, RowSpec(site="mlp.fc2"))
    if layout == "column+gather -> row":
        h = column_linear(x, w1, b1, tp, ColumnSpec(site="mlp.fc1", gather=hidden))           # (B, T, F) gathered...
        return row_linear(F.gelu(h), w2, b2, tp, RowSpec(site="mlp.fc2", split=hidden))       # ...and sliced again
    if layout == "column+gather -> column+gather":
        h = column_linear(x, w1, b1, tp, ColumnSpec(site="mlp.fc1", gather=hidden))           # (B, T, F)
        return column_linear(F.gelu(h), w2, b2, tp, ColumnSpec(site="mlp.fc2", gather=width))
    if layout == "row -> row":
        h = row_linear(x, w1, b1, tp, RowSpec(site="mlp.fc1", split=width))                   # (B, T, F) summed
        return row_linear(F.gelu(h), w2, b2, tp, RowSpec(site="mlp.fc2", split=hidden))
    raise ValueError(f"layout must be one of {MLP_LAYOUTS}, got {layout!r}")


def make_mlp(cfg: TransformerConfig, *, seed: int = 0) -> MLP:
    """The block's MLP with weights that depend only on `seed`."""
    return seeded(lambda: MLP(cfg), seed)


def mlp_inputs(cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x and the gradient dy flowing into the MLP's output, both (B, T, H)."""
    g = torch.Generator().manual_seed(2000 + seed)
    return torch.randn(batch, seq, cfg.width, generator=g), torch.randn(batch, seq, cfg.width, generator=g)


@dataclass(kw_only=True, frozen=True)
class MLPRun:
    """One rank's (or the single device's) MLP under one layout: output, gradients, collectives."""
    layout: str
    output: torch.Tensor                 # (B, T, H) on every rank
    input_grad: torch.Tensor             # (B, T, H)
    grads: dict[str, torch.Tensor]       # by parameter name; this rank's slice where split
    collectives: list[Measured]


def run_mlp_layout(ctx: Context, tp: TPGroup, cfg: TransformerConfig, layout: MLPLayout, batch: int, seq: int, *,
                   seed: int = 0) -> MLPRun:
    """Forward and backward of the MLP in `layout` on this rank, with this layout's collectives only."""
    ctx.ledger.reset()
    full = dict(zip(MLP_NAMES, (p.detach() for p in make_mlp(cfg, seed=seed).parameters())))
    params = {n: mlp_slice(n, t, cfg, tp.size, tp.rank, layout=layout).clone().requires_grad_()
              for n, t in full.items()}
    x, dy = mlp_inputs(cfg, batch, seq, seed=seed)
    x.requires_grad_()
    y = mlp_forward(params, x, tp, cfg, layout=layout)
    y.backward(dy)
    return MLPRun(layout=layout, output=y.detach(), input_grad=x.grad, grads={n: p.grad for n, p in params.items()},
                  collectives=measured_collectives(ctx.ledger))


@dataclass(frozen=True)
class LayoutRuns(Generic[R]):
    """What one rank produced for each requested layout, in the layouts' order (MLPRun or sequence.BlockRun)."""
    runs: tuple[R, ...]


def each_layout(ctx: Context, run: Callable[..., R], layouts: tuple[str, ...], cfg: TransformerConfig, batch: int,
                seq: int, *, seed: int = 0) -> LayoutRuns[R]:
    """Rank function body: `run(ctx, tp, cfg, layout, batch, seq, seed=...)` for each layout in turn, on this
    rank's TP group; `run` is run_mlp_layout (the MLP) or sequence.run_layout (the block), each counted on a
    fresh ledger."""
    tp = tp_group(ctx)
    return LayoutRuns(tuple(run(ctx, tp, cfg, layout, batch, seq, seed=seed) for layout in layouts))


def mlp_reference(cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> MLPRun:
    """The single-device MLP, for comparison."""
    mlp = make_mlp(cfg, seed=seed)
    x, dy = mlp_inputs(cfg, batch, seq, seed=seed)
    x.requires_grad_()
    y = mlp(x)
    y.backward(dy)
    grads = {n: p.grad for n, p in zip(MLP_NAMES, mlp.parameters())}
    return MLPRun(layout="single", output=y.detach(), input_grad=x.grad, grads=grads, collectives=[])
