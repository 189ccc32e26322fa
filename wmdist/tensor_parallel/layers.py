"""Column-parallel and row-parallel linear layers, with their communication written out in forward and backward.

Y = X W^T + b with the weight split over the N ranks of a tensor-parallel group.

* Column-parallel: rank r holds the rows of W (output features) of shard r
  and computes Y_r = X W_r^T + b_r, its slice of the output features. No
  communication in forward unless a full Y is needed (`gather_features`:
  an all-gather). In backward every rank's dX = dY_r W_r is only its
  shard's contribution to X's gradient: they are summed (an all-reduce,
  or a reduce-scatter when X was split along the sequence).
* Row-parallel: rank r holds the columns of W (input features) of shard r,
  reads its slice X_r of the input features and computes a partial
  X_r W_r^T of the *whole* output. The partials are summed: all-reduce, or
  reduce-scatter when the next region keeps only its tokens (sequence
  parallelism). The bias is added once, after the sum.

Every byte goes through wmdist.comm's ring collectives, whose ledger counts
exact wire bytes (2(N-1)/N of the payload for an all-reduce, (N-1)/N for a
reduce-scatter or all-gather): the claim "same bytes with SP" is then a
claim about bytes sent, not about payload sizes. Shards follow
torch.tensor_split's layout, so widths and lengths N does not divide are
handled exactly. Phases are "<site> <forward|backward> <op>", which is what
`costs.tensor_parallel.Collective.phase` predicts.
Shapes: B (batch), T (tokens), T_r (this rank's tokens), F (features), F_r (this rank's features).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from wmdist.comm import Context, Ledger, Mesh, ring_all_gather, ring_all_reduce, ring_reduce_scatter


@dataclass(frozen=True)
class TPGroup:
    """A tensor-parallel group as one rank sees it: its context, the process group, its index and the size."""
    ctx: Context
    group: Any              # torch.distributed.ProcessGroup, cached by ctx
    rank: int
    size: int


def tp_group(ctx: Context) -> TPGroup:
    """Every rank of the run in one tensor-parallel group (Mesh(tp=world_size))."""
    mesh = Mesh(tp=ctx.world_size)
    return TPGroup(ctx, ctx.axis_group(mesh, "tp"), mesh.coords(ctx.rank)["tp"], ctx.world_size)


def offset(sizes: Sequence[int], rank: int) -> int:
    """Where shard `rank` starts."""
    return sum(sizes[:rank])


# --- the collectives, on activations ------------------------------------------------------

def tp_all_reduce(tp: TPGroup, t: torch.Tensor, phase: str) -> torch.Tensor:
    """Sum `t` over the group (ring: reduce-scatter then all-gather); a new tensor of t's shape."""
    return ring_all_reduce(tp.ctx, t, phase=phase, group=tp.group)


def gather_features(tp: TPGroup, t: torch.Tensor, features: tuple[int, ...], phase: str) -> torch.Tensor:
    """(..., F_r) on every rank -> (..., F): concatenate the feature shards (an all-gather)."""
    lead, rows = t.shape[:-1], t[..., 0].numel()
    flat = ring_all_gather(tp.ctx, t.contiguous().reshape(-1), [rows * f for f in features], phase=phase, group=tp.group)
    return torch.cat([p.view(*lead, f) for p, f in zip(torch.split(flat, [rows * f for f in features]), features)],
                     dim=-1)


def gather_sequence(tp: TPGroup, t: torch.Tensor, tokens: tuple[int, ...], phase: str) -> torch.Tensor:
    """(B, T_r, H) on every rank -> (B, T, H): concatenate the token shards (an all-gather)."""
    b, _, h = t.shape
    by_token = t.transpose(0, 1).contiguous().reshape(-1)                         # (T_r * B * H,) token-major
    flat = ring_all_gather(tp.ctx, by_token, [n * b * h for n in tokens], phase=phase, group=tp.group)
    return flat.view(sum(tokens), b, h).transpose(0, 1).contiguous()              # (B, T, H)


def reduce_scatter_sequence(tp: TPGroup, t: torch.Tensor, tokens: tuple[int, ...], phase: str) -> torch.Tensor:
    """(B, T, H) partial sums on every rank -> (B, T_r, H): the sum, only this rank's tokens (a reduce-scatter)."""
    b, _, h = t.shape
    mine = ring_reduce_scatter(tp.ctx, t.transpose(0, 1).contiguous(), phase=phase, group=tp.group,
                               sizes=[n * b * h for n in tokens])
    return mine.view(tokens[tp.rank], b, h).transpose(0, 1).contiguous()          # (B, T_r, H)


# --- the layers ----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ColumnSpec:
    """How a column-parallel layer talks.

    `tokens`: the input arrives split along the sequence (SP): all-gather it
    in forward, reduce-scatter its gradient in backward. `regather`: keep only
    that shard for backward and gather it again there (Megatron-LM's choice:
    less memory, one more all-gather). `gather`: feature shard sizes, to
    all-gather the output (only when a full output is needed).
    """
    site: str
    tokens: tuple[int, ...] | None = None
    regather: bool = False
    gather: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.regather and self.tokens is None:
            raise ValueError("regather needs a sequence-split input (tokens)")
        if self.gather is not None and self.tokens is not None:
            raise ValueError("a sequence-parallel column layer feeds a row layer; it does not gather its output")


@dataclass(frozen=True, kw_only=True)
class RowSpec:
    """How a row-parallel layer talks.

    `split`: the input arrives whole; take this rank's features (free in
    forward; the gradient is all-gathered in backward). `tokens`: sum the
    partial outputs by reduce-scatter along the sequence (SP) instead of an
    all-reduce.
    """
    site: str
    split: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])          # (B*T, F)


class ColumnParallelLinear(torch.autograd.Function):
    """Y_r = X W_r^T + b_r (this rank's output features); dX summed over the group in backward."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tp: TPGroup,
                spec: ColumnSpec) -> torch.Tensor:                     # x (B, T or T_r, H_in) -> (B, T, F_r or F)
        full = x if spec.tokens is None else gather_sequence(tp, x, spec.tokens, f"{spec.site} forward all-gather")
        fctx.save_for_backward(x if spec.regather else full, weight)
        fctx.tp, fctx.spec = tp, spec
        y = F.linear(full, weight, bias)                                   # (B, T, F_r)
        if spec.gather is not None:
            y = gather_features(tp, y, spec.gather, f"{spec.site} forward all-gather")
        return y

    @staticmethod
    def backward(fctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        kept, weight = fctx.saved_tensors
        tp, spec = fctx.tp, fctx.spec
        if spec.gather is not None:                                        # every rank holds the same dY: keep ours
            start = offset(spec.gather, tp.rank)
            dy = dy[..., start:start + spec.gather[tp.rank]]
        full = gather_sequence(tp, kept, spec.tokens, f"{spec.site} backward all-gather") if spec.regather else kept
        d_weight = _rows(dy).t() @ _rows(full)                             # (F_r, H_in)
        d_bias = _rows(dy).sum(0)                                          # (F_r,)
        partial = dy @ weight                                              # (B, T, H_in): this shard's share of dX
        if spec.tokens is not None:
            dx = reduce_scatter_sequence(tp, partial, spec.tokens, f"{spec.site} backward reduce-scatter")
        else:
            dx = tp_all_reduce(tp, partial, f"{spec.site} backward all-reduce")
        return dx, d_weight, d_bias, None, None


class RowParallelLinear(torch.autograd.Function):
    """Y = sum_r X_r W_r^T + b: partial products summed over the group (all-reduce or reduce-scatter)."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tp: TPGroup,
                spec: RowSpec) -> torch.Tensor:                        # x (B, T, F_r or F) -> (B, T or T_r, H)
        local = x
        if spec.split is not None:                                         # whole input: our features, no traffic
            start = offset(spec.split, tp.rank)
            local = x[..., start:start + spec.split[tp.rank]].contiguous()
        fctx.save_for_backward(local, weight)
        fctx.tp, fctx.spec = tp, spec
        partial = F.linear(local, weight)                                  # (B, T, H): a share of every output
        if spec.tokens is not None:
            y = reduce_scatter_sequence(tp, partial, spec.tokens, f"{spec.site} forward reduce-scatter")
        else:
            y = tp_all_reduce(tp, partial, f"{spec.site} forward all-reduce")
        return y + bias                                                    # the bias once, after the sum

    @staticmethod
    def backward(fctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local, weight = fctx.saved_tensors
        tp, spec = fctx.tp, fctx.spec
        d_bias = _rows(dy).sum(0)                                          # with SP: this rank's tokens only
        if spec.tokens is not None:
            dy = gather_sequence(tp, dy, spec.tokens, f"{spec.site} backward all-gather")
        d_weight = _rows(dy).t() @ _rows(local)                            # (H, F_r)
        dx = dy @ weight                                                   # (B, T, F_r)
        if spec.split is not None:
            dx = gather_features(tp, dx, spec.split, f"{spec.site} backward all-gather")
        return dx, d_weight, d_bias, None, None


def column_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tp: TPGroup,
                  spec: ColumnSpec) -> torch.Tensor:
    """Apply ColumnParallelLinear (autograd-aware)."""
    return ColumnParallelLinear.apply(x, weight, bias, tp, spec)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tp: TPGroup, spec: RowSpec) -> torch.Tensor:
    """Apply RowParallelLinear (autograd-aware)."""
    return RowParallelLinear.apply(x, weight, bias, tp, spec)


# --- reading the ledger back as collectives ---------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """One collective as this rank's ledger recorded it: phase, bytes sent, ring rounds."""
    phase: str
    bytes_sent: int
    rounds: int


def measured_collectives(ledger: Ledger) -> list[Measured]:
    """The ledger's rounds grouped into collectives, in the order run.

    A ring all-reduce records its two halves as "<phase>/reduce-scatter" and
    "<phase>/all-gather": both belong to one collective. On one rank a ring
    sends nothing and records nothing.
    """
    out: list[Measured] = []
    for rec in ledger.select(kind="p2p"):
        phase = rec.phase.split("/")[0]
        if out and out[-1].phase == phase:
            last = out.pop()
            out.append(Measured(phase, last.bytes_sent + rec.bytes_sent, last.rounds + 1))
        else:
            out.append(Measured(phase, rec.bytes_sent, 1))
    return out
