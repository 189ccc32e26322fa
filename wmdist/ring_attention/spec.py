"""The sizes of a ring-attention run, checked before any process starts, and its seeded inputs.

Every demo of the chapter builds one RingSpec, calls `spec.check(N, layout=...)`
(one ValueError naming what is wrong: S not divisible as the layout needs,
more ranks than tokens, a block size below 1), and only then starts ranks.
Each rank draws the same full-sequence tensors from the seed and keeps its
own rows, so the single-process reference sees exactly the same numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from wmdist.costs.validate import require_choice, require_fields, require_int
from wmdist.ring_attention.layout import Layout, check_layout

DTypeName = Literal["float32", "float64", "bfloat16", "float16"]     # the dtypes a run's inputs may be drawn in
DTYPES: dict[DTypeName, torch.dtype] = {"float32": torch.float32, "float64": torch.float64,
                                       "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class RingSpec:
    """S tokens of `batch` sequences, `heads` heads of width `head_dim`, score tiles of `block_size` rows."""
    seq_len: int
    batch: int = 2
    heads: int = 2
    head_dim: int = 8
    block_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        require_fields(self, ("seq_len", "batch", "heads", "head_dim", "block_size"), 1)
        require_int("seed", self.seed, 0)

    @property
    def kv_width(self) -> int:
        """d_KV: key plus value width per token, 2 * heads * head_dim."""
        return 2 * self.heads * self.head_dim

    def check(self, world_size: int, *, layout: Layout) -> None:
        """Refuse (ValueError) a world size or layout these sizes cannot run on."""
        check_layout(self.seq_len, world_size, layout=layout)

    def tile(self, world_size: int) -> int:
        """The score tile a rank uses: block_size rows, at most its S/N tokens."""
        return min(self.block_size, self.seq_len // world_size)

    def key_blocks(self, world_size: int) -> int:
        """Most merges a query row sees over the whole ring: ceil((S/N) / tile) tiles from each of N blocks."""
        return world_size * math.ceil(self.seq_len // world_size / self.tile(world_size))

    def inputs(self, *, dtype: DTypeName) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v and the output gradient dout, each (B, H, S, D), drawn in float64 and rounded to `dtype`."""
        kind = DTYPES[require_choice("dtype", dtype, DTYPES)]
        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.batch, self.heads, self.seq_len, self.head_dim)
        q, k, v, dout = (torch.randn(shape, generator=gen, dtype=torch.float64).to(kind) for _ in range(4))
        return q, k, v, dout


def default_seq_len(world_size: int, *, tokens_per_chunk: int = 6) -> int:
    """An S that both layouts accept on `world_size` ranks: 2N chunks of `tokens_per_chunk` tokens."""
    return 2 * require_int("world_size", world_size, 1) * require_int("tokens_per_chunk", tokens_per_chunk, 1)
