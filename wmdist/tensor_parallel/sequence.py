"""Sequence parallelism (Megatron's) and context parallelism, both running, and the bytes each keeps for backward.

Two different things share the word "sequence":

* Megatron's sequence parallelism (SP) lives *inside* tensor parallelism.
  The TP matmuls are unchanged; what changes is the region between them
  (LayerNorm, residual adds, dropout in a real model): instead of every TP
  rank repeating it on all tokens, each rank does it for its own tokens.
  The all-reduce after a row layer becomes a reduce-scatter into that
  region, and the column layer all-gathers on the way out. Attention still
  sees every token, gathered: nothing about causality changes.
* Context parallelism (CP) splits the tokens for the *whole* layer,
  attention included: every rank holds all the weights and its own span of
  positions, and attention needs the other ranks' keys and values. Here the
  simple form: all-gather K and V, mask with GLOBAL positions (token p may
  see keys 0..p wherever they live), reduce-scatter their gradients back.
  Chapter 06 passes K/V around a ring instead. Masking with local positions
  (`causal="local"`) is the pitfall: it lets a token see the future of the
  sequence and hides some of its past, a different model.

Bytes kept for backward are measured with torch.autograd.graph.saved_tensors_hooks,
counted once per storage, parameters left out (as in wmdist.memory.activation_recompute).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F

from wmdist.comm import Context
from wmdist.costs.tensor_parallel import shard_sizes
from wmdist.costs.validate import require_choice
from wmdist.tensor_parallel.block import NAMES, BlockShard, make_block, reduce_sequence_parallel_grads
from wmdist.tensor_parallel.layers import (
    Measured,
    TPGroup,
    tp_all_reduce,
    gather_sequence,
    measured_collectives,
    offset,
    reduce_scatter_sequence,
)
from wmdist.models.transformer import Block, TransformerConfig

Layout = Literal["tp", "sp", "sp-regather", "cp", "cp-local-mask"]     # what run_layout can run
LAYOUTS: tuple[str, ...] = get_args(Layout)
Mask = Literal["global", "local"]     # cp_block's causal mask: global positions (right) or local ones (the pitfall)


def forward_saving(fn: Callable[[], torch.Tensor], skip: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run `fn` and return (its output, bytes autograd saved for backward), one count per storage."""
    skipped = {t.untyped_storage().data_ptr() for t in skip}
    kept: dict[int, torch.Tensor] = {}             # storage address -> a tensor on it (keeps the address in use)

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skipped:
            kept.setdefault(ptr, t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(t.untyped_storage().nbytes() for t in kept.values())


class SequenceGather(torch.autograd.Function):
    """(B, T_r, C) -> (B, T, C) by all-gather; backward reduce-scatters the gradient to each rank's tokens."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, tp: TPGroup, tokens: tuple[int, ...], site: str) -> torch.Tensor:
        fctx.tp, fctx.tokens, fctx.site = tp, tokens, site
        return gather_sequence(tp, x, tokens, f"{site} forward all-gather")

    @staticmethod
    def backward(fctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return reduce_scatter_sequence(fctx.tp, dy, fctx.tokens, f"{fctx.site} backward reduce-scatter"), None, None, None


def cp_block(block: Block, x: torch.Tensor, tp: TPGroup, seq_len: int, *, causal: Mask = "global") -> torch.Tensor:
    """One block on this rank's span of tokens, x (B, T_r, H) -> (B, T_r, H); all weights local."""
    require_choice("causal", causal, get_args(Mask))
    tokens = tuple(shard_sizes(seq_len, tp.size))
    b, t, h = x.shape
    heads, d = block.attn.heads, h // block.attn.heads
    qkv = block.attn.qkv(block.ln1(x))                                             # (B, T_r, 3H)
    kv = SequenceGather.apply(qkv[..., h:], tp, tokens, "attn.kv")                 # (B, T, 2H): every rank's keys
    q = qkv[..., :h].view(b, t, heads, d).transpose(1, 2)                          # (B, N_h, T_r, D)
    k, v = kv.view(b, seq_len, 2, heads, d).permute(2, 0, 3, 1, 4)                 # (B, N_h, T, D)
    if causal == "global":
        start = offset(tokens, tp.rank)
        q_pos, k_pos = torch.arange(start, start + t), torch.arange(seq_len)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=k_pos[None, :] <= q_pos[:, None])
    else:   # the pitfall: positions counted from this rank's first token
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + block.attn.out(y.transpose(1, 2).reshape(b, t, h))
    return x + block.mlp(block.ln2(x))


@dataclass(kw_only=True, frozen=True)
class BlockRun:
    """What one rank (or the single device) produced for one layout: its outputs, gradients, bytes, collectives."""
    layout: str
    output: torch.Tensor                  # (B, T, H), or this rank's tokens (B, T_r, H)
    input_grad: torch.Tensor
    grads: dict[str, torch.Tensor]        # by Block parameter name; this rank's slice where sharded
    saved_bytes: int
    collectives: list[Measured]


def block_inputs(cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's input x and the gradient dy flowing back into its output, both (B, T, H)."""
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(batch, seq, cfg.width, generator=g), torch.randn(batch, seq, cfg.width, generator=g)


def token_slice(seq_len: int, world_size: int, rank: int) -> slice:
    """The span of positions rank `rank` holds when the sequence is split."""
    sizes = tuple(shard_sizes(seq_len, world_size))
    return slice(offset(sizes, rank), offset(sizes, rank) + sizes[rank])


def run_layout(ctx: Context, tp: TPGroup, cfg: TransformerConfig, layout: Layout, batch: int, seq: int, *,
               seed: int = 0) -> BlockRun:
    """Forward and backward of one block in `layout` on this rank, counted: output, gradients, bytes, collectives."""
    require_choice("layout", layout, LAYOUTS)
    ctx.ledger.reset()
    block = make_block(cfg, seed=seed)
    x, dy = block_inputs(cfg, batch, seq, seed=seed)
    if layout != "tp":                                           # SP and CP: this rank's tokens only
        mine = token_slice(seq, tp.size, tp.rank)
        x, dy = x[:, mine].clone(), dy[:, mine].clone()
    x.requires_grad_()
    if layout.startswith("cp"):
        params = list(block.parameters())
        mask = "global" if layout == "cp" else "local"
        y, saved = forward_saving(lambda: cp_block(block, x, tp, seq, causal=mask), params)
        y.backward(dy)
        flat = tp_all_reduce(tp, torch.cat([p.grad.reshape(-1) for p in params]), "weights after backward all-reduce")
        grads = dict(zip(NAMES, (g.view_as(p) for g, p in zip(torch.split(flat, [p.numel() for p in params]),
                                                               params))))
    else:
        shard = BlockShard(block, cfg, tp.size, tp.rank)
        y, saved = forward_saving(lambda: shard(x, tp, layout=layout, seq_len=seq), list(shard.parameters()))
        y.backward(dy)
        if layout != "tp":
            reduce_sequence_parallel_grads(shard, tp)
        grads = shard.grads()
    return BlockRun(layout=layout, output=y.detach(), input_grad=x.grad, grads=grads, saved_bytes=saved, collectives=measured_collectives(ctx.ledger))


def block_reference_run(cfg: TransformerConfig, batch: int, seq: int, *, seed: int = 0) -> BlockRun:
    """The single-device block: output, input gradient, every parameter gradient, bytes kept for backward."""
    block = make_block(cfg, seed=seed)
    x, dy = block_inputs(cfg, batch, seq, seed=seed)
    x.requires_grad_()
    y, saved = forward_saving(lambda: block(x), list(block.parameters()))
    y.backward(dy)
    return BlockRun(layout="single", output=y.detach(), input_grad=x.grad, grads={n: p.grad.clone() for n, p in block.named_parameters()}, saved_bytes=saved, collectives=[])
