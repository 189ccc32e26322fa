"""One rank's share of the transformer world model on a mesh, built from chapters 04-06's pieces.

A rank at (tp rank t, pipeline stage p) holds the blocks of stage p
(pipeline.plan.stage_blocks), each as chapter 04's `BlockShard` for tp rank
t: its heads' QKV rows and output-projection columns, its MLP units, the
LayerNorms and row biases whole. The first stage also holds the embedding
and the positions, the last the final LayerNorm and head, whole on every tp
rank. Attention runs on the rank's heads: over the whole context with
SDPA when cp = 1, or with chapter 06's ring attention over the cp ranks
when each holds a contiguous block of c = T/cp tokens. dp ranks hold the
same share as their dp partners; nothing here depends on the dp axis.
Shapes: b (trajectories in a microbatch), c (tokens on this cp rank), H, O, A.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from wmdist.comm import Context
from wmdist.pipeline.plan import stage_blocks
from wmdist.ring_attention.ring import ring_attention
from wmdist.tensor_parallel.block import BlockShard, shard_of
from wmdist.tensor_parallel.layers import ColumnSpec, RowSpec, TPGroup, column_linear, row_linear
from wmdist.models.transformer import TransformerConfig, TransformerWorldModel, make_transformer

if TYPE_CHECKING:                                    # annotations only: the spec is the harness's record
    from wmdist.mesh.spec import MeshSpec


def model_config(spec: MeshSpec) -> TransformerConfig:
    """The transformer world model the spec describes (positions for exactly its context length)."""
    return TransformerConfig(width=spec.width, heads=spec.heads, mlp_ratio=spec.mlp_ratio, layers=spec.layers,
                             max_len=spec.seq_len)


def full_model(spec: MeshSpec) -> TransformerWorldModel:
    """The whole model every rank (and the single device) starts from: weights depend only on the seed."""
    return make_transformer(seed=spec.seed, cfg=model_config(spec))


def attention(shard: BlockShard, x: torch.Tensor, tp: TPGroup, cp: Context, seq_len: int) -> torch.Tensor:
    """Causal attention over this rank's heads: (b, c, H) -> (b, c, H), the whole context seen through the cp ring."""
    if cp.world_size == 1:
        return shard.attention(x, tp, None, regather=False)
    qkv = column_linear(x, shard.p("attn.qkv.weight"), shard.p("attn.qkv.bias"), tp, ColumnSpec(site="attn.qkv"))
    b, c, _ = qkv.shape
    d = shard.cfg.head_dim
    q, k, v = qkv.view(b, c, 3, shard.heads, d).permute(2, 0, 3, 1, 4)                   # (b, h_r, c, D) each
    y = ring_attention(cp, q, k, v, seq_len=seq_len, layout="contiguous", causal=True, block_size=c)  # (b, h_r, c, D)
    return row_linear(y.transpose(1, 2).reshape(b, c, shard.heads * d), shard.p("attn.out.weight"),
                      shard.p("attn.out.bias"), tp, RowSpec(site="attn.out"))


def block_forward(shard: BlockShard, x: torch.Tensor, tp: TPGroup, cp: Context, seq_len: int) -> torch.Tensor:
    """x + attn(LN(x)), then + mlp(LN(.)), on this rank's heads, units and tokens: (b, c, H) -> (b, c, H)."""
    x = x + attention(shard, shard.ln1(x), tp, cp, seq_len)
    return x + shard.mlp(shard.ln2(x), tp, None, regather=False)


class MeshStage(nn.Module):
    """The parameters one rank holds, and its forward for one microbatch (see the module docstring)."""

    def __init__(self, model: TransformerWorldModel, spec: MeshSpec, tp_rank: int, pp_rank: int):
        super().__init__()
        self.cfg, self.spec, self.tp_rank = model.cfg, spec, tp_rank
        self.first, self.last = pp_rank == 0, pp_rank == spec.pp - 1
        self.block_ids = list(stage_blocks(spec.layers, spec.pp)[pp_rank])
        self.blocks = nn.ModuleList(BlockShard(model.blocks[i], model.cfg, spec.tp, tp_rank) for i in self.block_ids)
        self.embed = model.embed if self.first else None
        self.pos = model.pos if self.first else None
        self.ln_f = model.ln_f if self.last else None
        self.head = model.head if self.last else None

    def forward(self, inputs: tuple[torch.Tensor, ...], tp: TPGroup, cp: Context) -> torch.Tensor:
        """First stage: (obs (b, c, O), actions (b, c, A)); others: (x (b, c, H),). Last stage returns (b, c, O)."""
        if self.first:
            obs, actions = inputs
            c = obs.shape[1]
            x = self.embed(torch.cat([obs, actions], dim=-1)) + self.pos[cp.rank * c:(cp.rank + 1) * c]   # (b, c, H)
        else:
            (x,) = inputs
        for shard in self.blocks:
            x = block_forward(shard, x, tp, cp, self.spec.seq_len)
        return self.head(self.ln_f(x)) if self.last else x

    def full_names(self) -> list[str]:
        """The whole model's name of each of this stage's parameters, in self.parameters() order."""
        out = []
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                _, j, rest = name.split(".", 2)
                rest = rest[len("shards."):].replace("_", ".") if rest.startswith("shards.") else rest
                out.append(f"blocks.{self.block_ids[int(j)]}.{rest}")
            else:
                out.append(name)
        return out

    def shard(self, full_name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a whole-model tensor shaped like parameter `full_name` (a weight or its gradient)."""
        if not full_name.startswith("blocks."):
            return full
        return shard_of(full_name.split(".", 2)[2], full, self.cfg, self.spec.tp, self.tp_rank)
