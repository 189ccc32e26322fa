"""The sizes of a ring-attention run, checked before any process starts, its seeded inputs, and the shared case.

Every demo of the chapter builds one RingSpec, calls `spec.check(N, layout=...)`
(one ValueError naming what is wrong: S not divisible as the layout needs,
more ranks than tokens, a block size below 1), and only then starts ranks.
Each rank draws the same full-sequence tensors from the seed and keeps its
own rows, so the single-process reference sees exactly the same numbers.

The chapter's demos share the rest: `RingRun` (a RingSpec on N ranks, checked
on every layout), `Cases` (one rank's result per named case), and
`run_case`, one rank's run of one case with any ring (ring.py's or the pruned
one), which returns a `RankCase`; `assemble_sequence` puts the ranks' rows back into
the whole sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Generic, Literal, TypeVar

import torch

from wmdist.comm import Context
from wmdist.costs.validate import require_choice, require_fields, require_int
from wmdist.ring_attention.layout import LAYOUTS, Layout, check_layout
from wmdist.ring_attention.ring import RingTrace, positions, ring_backward, ring_forward

T = TypeVar("T")

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


@dataclass(frozen=True, kw_only=True)
class RingRun:
    """A ring-attention run: its sizes (RingSpec) on N ranks, refused unless every layout in `layouts` accepts
    them (one ValueError, before any process starts)."""
    world_size: int
    ring: RingSpec
    layouts: tuple[Layout, ...] = field(default=LAYOUTS)

    def __post_init__(self) -> None:
        for layout in self.layouts:
            self.ring.check(self.world_size, layout=layout)


def ring_run(world_size: int, *, seq_len: int | None = None, block_size: int = 4, seed: int = 0) -> RingRun:
    """The chapter's usual run: S = default_seq_len(N) unless given, checked on both layouts."""
    ring = RingSpec(seq_len=default_seq_len(world_size) if seq_len is None else seq_len, block_size=block_size,
                    seed=seed)
    return RingRun(world_size=world_size, ring=ring)


@dataclass(frozen=True)
class Cases(Generic[T]):
    """One rank's result per named case, in run order; `cases[name]` is the one named `name`."""
    names: tuple[str, ...]
    results: tuple[T, ...]

    def __getitem__(self, name: str) -> T:
        return self.results[self.names.index(name)]

    def __contains__(self, name: object) -> bool:
        return name in self.names


@dataclass(kw_only=True, frozen=True)
class RankCase:
    """What one rank returns for one case: its rows of the results, its ledger by phase, its traces."""
    rows: list[int]
    out: torch.Tensor                                        # (B, H, c, D)
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # dq, dk, dv of this rank's rows (None: forward only)
    sent: dict[str, int]                                     # bytes sent by ledger phase
    forward: RingTrace
    backward: RingTrace | None
    sends: dict[str, int] = field(default_factory=dict)      # messages sent by ledger phase


def run_case(ctx: Context, spec: RingSpec, *, dtype: DTypeName, causal: bool, layout: Layout,
             forward: Callable[..., tuple] = ring_forward, backward: Callable[..., tuple] | None = ring_backward,
             final_exchange: bool = False) -> RankCase:
    """One rank's run of one case on a fresh ledger: its rows of the seeded inputs through `forward` (ring.py's
    ring_forward, or pruned.py's), then `backward` unless None; `final_exchange` asks for the paper's N sends."""
    q, k, v, dout = spec.inputs(dtype=dtype)
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout=layout)
    q, k, v, dout = (x[:, :, rows].contiguous() for x in (q, k, v, dout))
    sizes = {"seq_len": spec.seq_len, "layout": layout, "causal": causal, "block_size": spec.block_size}
    ctx.ledger.reset()
    out, lse, fwd = forward(ctx, q, k, v, **sizes, **({"final_exchange": True} if final_exchange else {}))
    grads, bwd = (None, None, None), None
    if backward is not None:
        *grads, bwd = backward(ctx, q, k, v, out, lse, dout, **sizes)
    phases = ctx.ledger.by_phase()
    return RankCase(rows=rows.tolist(), out=out, grads=tuple(grads), forward=fwd, backward=bwd,
                    sent={p: t["bytes_sent"] for p, t in phases.items()},
                    sends={p: t["messages"] for p, t in phases.items()})


def assemble_sequence(spec: RingSpec, parts: list[torch.Tensor], rows: list[list[int]]) -> torch.Tensor:
    """The whole sequence (B, H, S, .) from each rank's part (B, H, c, .) and the positions it holds."""
    full = parts[0].new_empty(parts[0].shape[:2] + (spec.seq_len,) + parts[0].shape[3:])
    for part, r in zip(parts, rows):
        full[:, :, r] = part
    return full
