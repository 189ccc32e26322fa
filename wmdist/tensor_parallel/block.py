"""The Megatron pairing on the world model's transformer block: which rank holds what, and the forward.

Attention: the fused QKV projection is split column-wise *by head* (rank r
keeps the q, k and v rows of its heads, so its heads' attention needs
nothing from other ranks), the output projection row-wise over the same
head dimensions. MLP: fc1 column-wise over hidden units, fc2 row-wise over
the same units. Between the two halves of each pair nothing is gathered:
the row layer reads the column layer's shard as it is. Each pair therefore
needs one sum in forward (after the row layer) and one in backward (into
the column layer's input): 4 all-reduces per block per step.

With sequence parallelism ("sp", "sp-regather") the LayerNorms and residual
adds run on this rank's tokens only: the column layer all-gathers its input
along the sequence, the row layer reduce-scatters its output back to tokens.
Heads and hidden units split with torch.tensor_split's layout, so a width N
does not divide is handled exactly (8 heads over 3 ranks: 3, 3, 2).
Shapes: B, T, H as in wmdist.models.transformer; h_r heads and F_r hidden units on this rank.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wmdist.costs.tensor_parallel import BLOCK_LAYOUTS, BlockLayout, BlockShape, shard_sizes
from wmdist.costs.validate import require_choice
from wmdist.tensor_parallel.layers import ColumnSpec, RowSpec, TPGroup, tp_all_reduce, column_linear, offset, row_linear
from wmdist.models.transformer import Block, TransformerConfig
from wmdist.models import seeded

# The Block's parameters, in its own order.
NAMES = ("ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.out.weight", "attn.out.bias",
         "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")
# Parameters whose gradient a sequence-parallel rank computes from its own tokens only (summed after backward).
SEQUENCE_PARALLEL_PARAMS = ("ln1.weight", "ln1.bias", "attn.out.bias", "ln2.weight", "ln2.bias", "mlp.fc2.bias")


def block_shape(cfg: TransformerConfig, batch: int, seq: int) -> BlockShape:
    """The sizes of one block's activations for a batch of `batch` sequences of `seq` tokens."""
    return BlockShape(batch=batch, seq=seq, width=cfg.width, heads=cfg.heads, hidden=cfg.hidden)


def shard_index(name: str, cfg: TransformerConfig, world_size: int, rank: int) -> tuple[int, torch.Tensor] | None:
    """(dim, indices) of the slice of parameter `name` that rank holds; None if every rank holds all of it."""
    h, d = cfg.width, cfg.head_dim
    heads = shard_sizes(cfg.heads, world_size)
    h0, hr = offset(heads, rank), heads[rank]
    cols = torch.arange(h0 * d, (h0 + hr) * d)                       # this rank's heads' dimensions
    hidden = shard_sizes(cfg.hidden, world_size)
    units = torch.arange(offset(hidden, rank), offset(hidden, rank) + hidden[rank])
    if name in ("attn.qkv.weight", "attn.qkv.bias"):
        return 0, torch.cat([part * h + cols for part in range(3)])    # q rows, k rows, v rows of our heads
    if name == "attn.out.weight":
        return 1, cols
    if name in ("mlp.fc1.weight", "mlp.fc1.bias"):
        return 0, units
    if name == "mlp.fc2.weight":
        return 1, units
    return None


def shard_of(name: str, full: torch.Tensor, cfg: TransformerConfig, world_size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s slice of a full-size tensor shaped like parameter `name` (a weight or its gradient)."""
    where = shard_index(name, cfg, world_size, rank)
    return full if where is None else full.index_select(where[0], where[1])


class BlockShard(nn.Module):
    """One rank's share of a Block: LayerNorms and row biases whole, QKV/fc1 rows and out/fc2 columns sharded."""

    def __init__(self, block: Block, cfg: TransformerConfig, world_size: int, rank: int):
        super().__init__()
        self.cfg, self.world_size, self.rank = cfg, world_size, rank
        self.heads = shard_sizes(cfg.heads, world_size)[rank]
        self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
        self.shards = nn.ParameterDict()
        for name, p in block.named_parameters():
            value = shard_of(name, p.detach(), cfg, world_size, rank).clone()
            if name.startswith(("ln1.", "ln2.")):
                getattr(self, name[:3]).get_parameter(name[4:]).data.copy_(value)
            else:
                self.shards[name.replace(".", "_")] = nn.Parameter(value)

    def p(self, name: str) -> torch.Tensor:
        """A parameter by its Block name ("mlp.fc1.weight")."""
        return self.get_parameter(name) if name.startswith(("ln1.", "ln2.")) else self.shards[name.replace(".", "_")]

    def grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient, by Block name (this rank's slice for sharded ones)."""
        return {name: self.p(name).grad.clone() for name in NAMES}

    def attention(self, x: torch.Tensor, tp: TPGroup, tokens: tuple[int, ...] | None, *,
                  regather: bool) -> torch.Tensor:             # (B, T or T_r, H) -> (B, T or T_r, H)
        """Attention over this rank's heads: QKV column-parallel by head, output projection row-parallel."""
        qkv = column_linear(x, self.p("attn.qkv.weight"), self.p("attn.qkv.bias"), tp,
                            # (B, T, 3 h_r D): nothing gathered
                            ColumnSpec(site="attn.qkv", tokens=tokens, regather=regather))
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)   # (B, h_r, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)                         # (B, h_r, T, D)
        return row_linear(y.transpose(1, 2).reshape(b, t, self.heads * self.cfg.head_dim),
                          self.p("attn.out.weight"), self.p("attn.out.bias"), tp, RowSpec(site="attn.out", tokens=tokens))

    def mlp(self, x: torch.Tensor, tp: TPGroup, tokens: tuple[int, ...] | None, *, regather: bool) -> torch.Tensor:
        """fc2(gelu(fc1(x))) over this rank's hidden units: column then row, nothing gathered in between."""
        h = column_linear(x, self.p("mlp.fc1.weight"), self.p("mlp.fc1.bias"), tp,
                          ColumnSpec(site="mlp.fc1", tokens=tokens, regather=regather))   # (B, T, F_r): no gather
        return row_linear(F.gelu(h), self.p("mlp.fc2.weight"), self.p("mlp.fc2.bias"), tp,
                          RowSpec(site="mlp.fc2", tokens=tokens))

    def forward(self, x: torch.Tensor, tp: TPGroup, *, layout: BlockLayout = "tp",
                seq_len: int | None = None) -> torch.Tensor:
        """x + attn(LN(x)), then + mlp(LN(.)).

        "tp": x (B, T, H), the same on every rank. "sp" / "sp-regather": x (B, T_r, H),
        this rank's tokens of a sequence of `seq_len`; the output is split the same way.
        """
        require_choice("layout", layout, BLOCK_LAYOUTS)
        tokens = None
        if layout != "tp":
            tokens = tuple(shard_sizes(seq_len, tp.size)) if seq_len else ()
            if not tokens or tokens[tp.rank] != x.shape[1]:
                raise ValueError(f"rank {tp.rank}: layout {layout!r} needs seq_len, and x must hold this rank's "
                                 f"share of it; got seq_len {seq_len} and {x.shape[1]} tokens")
        regather = layout == "sp-regather"
        x = x + self.attention(self.ln1(x), tp, tokens, regather=regather)
        return x + self.mlp(self.ln2(x), tp, tokens, regather=regather)


def reduce_sequence_parallel_grads(shard: BlockShard, tp: TPGroup) -> None:
    """Sum the LayerNorm and row-bias gradients over the group: with SP each rank saw only its tokens.

    One all-reduce of 6H elements per block per step (Megatron-LM does the same
    for its "sequence-parallel" parameters before the optimizer step).
    """
    params = [shard.p(name) for name in SEQUENCE_PARALLEL_PARAMS]
    total = tp_all_reduce(tp, torch.cat([p.grad.reshape(-1) for p in params]),
                       "sequence-parallel params after backward all-reduce")
    for p, g in zip(params, torch.split(total, [p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def make_block(cfg: TransformerConfig, *, seed: int = 0) -> Block:
    """A Block whose weights depend only on `seed` (the same on every rank and in the reference)."""
    def build() -> Block:
        block = Block(cfg)
        with torch.no_grad():       # LayerNorms start at 1 and 0: move them, so their gradients are not special
            for ln in (block.ln1, block.ln2):
                ln.weight.add_(0.1 * torch.randn(cfg.width))
                ln.bias.add_(0.1 * torch.randn(cfg.width))
        return block
    return seeded(build, seed)
