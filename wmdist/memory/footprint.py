"""What each rank holds: a byte-exact memory model of training, by tensor kind.

Pure Python (no torch), so the calculator panel, the `wmdist memory` CLI and
the ZeRO demo (which measures the bytes each rank really holds) share one
source of truth. Every count is an exact integer for a given rank.

Accounting rules (each one a choice; the docs and the tests follow them):

* Rank layout: `wmdist.comm.Mesh(dp, tp, pp, cp)`, the layout the real
  process groups use too (tensor-parallel partners are neighbouring ranks).
* Model parallelism first. The P parameters, as one flat vector, are split
  over the tp * pp model-parallel ranks with the torch.tensor_split layout
  (`costs.ring_chunk_size`: the first P % (tp*pp) pieces hold one element
  more); model-parallel index = pp_rank * tp + tp_rank. A real layout is
  not an even split (LayerNorms whole on every tp rank, the embedding on the
  first stage): `param_pieces` then gives each piece's exact element count
  (e.g. costs.mesh.rank_params for the transformer world model).
* Then ZeRO over dp. That local piece is split again over dp with the same
  layout. Stage 1 keeps only the rank's shard of optimizer state and master
  weights, stage 2 also of gradients, stage 3 also of parameters. These are
  steady-state bytes: while a stage-2 rank reduces its gradient, and while a
  stage-3 rank gathers parameters for forward and backward, it briefly holds
  the full tensor, so its peak is higher.
* Optimizer state. sgd: nothing; momentum: 1 buffer; adam/adamw: 2 moments,
  each of the state dtype: fp32 when master weights are kept, else the
  parameter dtype. Step counters (a few bytes) are not counted.
* Master weights: an fp32 copy of the parameters, when `master_weights`.
  With adam this gives the ZeRO paper's K = 12 bytes/param (4 + 4 + 4).
* Gradients: `grad_dtype` (default: the parameter dtype), plus, with
  `grad_accum_dtype`, a separate accumulation buffer beside them (fp32 next
  to bf16 gradients: 2 + 2 + 4 + 12 = 20 bytes/param with Adam and master
  weights). Both are counted as gradients and shard from stage 2 on.
* Activations. pp splits the layers (tensor_split layout over pp stages), cp
  splits each sequence's tokens (same layout over cp ranks). Of a layer's
  A = `act_bytes_per_token_per_layer`, tp divides the part its matmuls
  shard (A - R); the part R = `act_replicated_bytes_per_token_per_layer`
  (LayerNorm inputs and outputs, residual stream, dropout masks) stays whole
  on every TP rank, unless `sequence_parallel`, which splits it along the
  sequence, i.e. divides it by tp too (Korthikanti et al. 2022). R = 0 (the
  default) treats every byte as sharded. Per layer and token:
  (A - R) / tp + R (without SP) or A / tp (with SP); even shards assumed,
  and the chapter 04 runs match it exactly when tp divides the heads, the
  hidden width and the sequence. Microbatches in flight in a pipeline are
  counted only when `in_flight` says how many (GPipe keeps M, 1F1B up to P on
  stage 0; the planner passes the schedule's peak).
  Stored bytes = ceil(layers_local * micro_batch * tokens_local * that).
  With checkpointing a rank keeps only each local layer's input
  (`input_bytes_per_token`; the layer input is in the replicated region, so
  divided by tp only with SP) plus one layer's full activations, recomputed
  during its backward.
* Batch: `batch_bytes` per rank, as given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Literal

from wmdist.costs.collectives import ring_chunk_size
from wmdist.costs.layout import Mesh
from wmdist.costs.validate import require_bool, require_choice, require_int, require_real
from wmdist.base.knobs import knob

Dtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
Optimizer = Literal["sgd", "momentum", "adam", "adamw"]
DTYPE_BYTES: dict[Dtype, int] = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
OPTIMIZER_SLOTS: dict[Optimizer, int] = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}   # state tensors per parameter
Kind = Literal["parameters", "gradients", "optimizer_state", "master_weights", "activations", "batch"]
KINDS: tuple[Kind, ...] = ("parameters", "gradients", "optimizer_state", "master_weights", "activations", "batch")
PANEL_DTYPES = ("fp32", "bf16", "fp16", "fp8")
DEGREE = dict(options=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256))   # stops of each parallel degree's slider


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """One training setup, as the sizes that decide what a rank stores. Knobs: the calculator's controls.

    Dtypes and the optimizer are Literal choices (Dtype, Optimizer); a name outside them is refused with a
    ValueError naming the field, since a notebook or the CLI may pass any string.
    """
    params: int = knob(10 ** 9, "parameters P", low=1e3, high=1e12, log=True, step=0.1, fmt=".3s")
    param_dtype: Dtype = knob("fp32", "param dtype", options=PANEL_DTYPES)
    grad_dtype: Dtype | None = knob(None, "grad dtype", options=(("same", None), *((d, d) for d in PANEL_DTYPES)))
    grad_accum_dtype: Dtype | None = knob(None, "grad accum buffer", options=(("none", None), ("fp32", "fp32")))
    optimizer: Optimizer = knob("adam", "optimizer", options=tuple(OPTIMIZER_SLOTS))
    master_weights: bool = knob(False, "fp32 master weights")   # moments then fp32 too
    zero_stage: int = knob(0, "ZeRO stage", low=0, high=3)      # sharding over the data-parallel degree
    dp: int = knob(1, "dp degree", **DEGREE)
    tp: int = knob(1, "tp degree", **DEGREE)
    pp: int = knob(1, "pp degree", **DEGREE)
    cp: int = knob(1, "cp degree", **DEGREE)
    layers: int = knob(1, "layers", low=1, high=128)
    act_bytes_per_token_per_layer: float = knob(0.0, "act. B/token/layer", text=True)
    seq_len: int = knob(0, "sequence length", text=True)                 # tokens per sequence
    micro_batch: int = knob(1, "micro-batch", low=1, high=64)            # sequences per rank
    checkpointing: bool = knob(False, "activation checkpointing")        # keep layer inputs, recompute one layer
    batch_bytes: int = knob(0, "batch bytes per rank", text=True)
    input_bytes_per_token: float = knob(0.0, "layer-input B/token", text=True)   # what checkpointing keeps
    sequence_parallel: bool = knob(False, "sequence parallel (with tp)")   # also split the replicated part
    act_replicated_bytes_per_token_per_layer: float = knob(0.0, "TP-replicated part", text=True)
    param_pieces: tuple[int, ...] | None = None   # exact elements per model-parallel piece; None: even split

    def __post_init__(self) -> None:
        require_int("params", self.params, 0)
        for name in ("dp", "tp", "pp", "cp", "micro_batch"):
            require_int(name, getattr(self, name), 1)
        for name in ("layers", "seq_len", "batch_bytes"):
            require_int(name, getattr(self, name), 0)
        for name in ("act_bytes_per_token_per_layer", "input_bytes_per_token",
                     "act_replicated_bytes_per_token_per_layer"):
            require_real(name, getattr(self, name))
        if self.act_replicated_bytes_per_token_per_layer > self.act_bytes_per_token_per_layer:
            raise ValueError(f"act_replicated_bytes_per_token_per_layer "
                             f"({self.act_replicated_bytes_per_token_per_layer}) must be <= "
                             f"act_bytes_per_token_per_layer ({self.act_bytes_per_token_per_layer})")
        require_choice("param_dtype", self.param_dtype, DTYPE_BYTES)
        if self.grad_dtype is not None:
            require_choice("grad_dtype", self.grad_dtype, DTYPE_BYTES)
        if self.grad_accum_dtype is not None:
            require_choice("grad_accum_dtype", self.grad_accum_dtype, DTYPE_BYTES)
        require_choice("optimizer", self.optimizer, OPTIMIZER_SLOTS)
        require_choice("zero_stage", self.zero_stage, (0, 1, 2, 3))
        require_bool("master_weights", self.master_weights)
        require_bool("checkpointing", self.checkpointing)
        require_bool("sequence_parallel", self.sequence_parallel)
        if self.param_pieces is not None:
            if not isinstance(self.param_pieces, tuple) or len(self.param_pieces) != self.tp * self.pp:
                raise ValueError(f"param_pieces must be a tuple of tp * pp = {self.tp * self.pp} element counts "
                                 f"(index pp_rank * tp + tp_rank), got {self.param_pieces!r}")
            for i, n in enumerate(self.param_pieces):
                require_int(f"param_pieces[{i}]", n, 0)

    @cached_property
    def mesh(self) -> Mesh:
        """The rank layout these degrees describe (made once: the planner asks it thousands of times a search)."""
        return Mesh(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp)

    @property
    def world_size(self) -> int:
        """Ranks in the whole job: dp * cp * tp * pp."""
        return self.mesh.world_size


def rank_coords(cfg: MemoryConfig, rank: int) -> dict[str, int]:
    """{"dp", "cp", "tp", "pp"} coordinates of `rank` in the config's mesh."""
    require_int("rank", rank, 0)
    if rank >= cfg.world_size:
        raise ValueError(f"rank must be < world size {cfg.world_size} (dp*cp*tp*pp), got {rank}")
    return cfg.mesh.coords(rank)


def local_params(cfg: MemoryConfig, *, rank: int = 0) -> tuple[int, int]:
    """(model-parallel piece, this rank's ZeRO shard of it), in elements."""
    c = rank_coords(cfg, rank)
    index = c["pp"] * cfg.tp + c["tp"]              # closed forms: no list of tp*pp or dp chunks is built
    piece = cfg.param_pieces[index] if cfg.param_pieces else ring_chunk_size(cfg.params, cfg.tp * cfg.pp, index)
    return piece, ring_chunk_size(piece, cfg.dp, c["dp"])


def activation_bytes(cfg: MemoryConfig, *, rank: int = 0, in_flight: int | Fraction = 1) -> int:
    """Stored activation bytes on `rank` under the rules in the module docstring.

    in_flight: microbatch activation sets the rank holds at once (a pipeline schedule's peak, e.g.
    costs.pipeline.peak_activations_in_flight; a Fraction for interleaved chunks). Each set is stored
    (with checkpointing: each set's layer inputs), but only one layer is ever being recomputed, so the
    one full layer checkpointing adds is counted once, not per set.
    """
    if not isinstance(in_flight, (int, Fraction)) or isinstance(in_flight, bool) or in_flight < 0:
        raise ValueError(f"in_flight must be an int or Fraction >= 0, got {in_flight!r}")
    c = rank_coords(cfg, rank)
    layers = ring_chunk_size(cfg.layers, cfg.pp, c["pp"])
    tokens = cfg.micro_batch * ring_chunk_size(cfg.seq_len, cfg.cp, c["cp"])
    whole = cfg.tp if cfg.sequence_parallel else 1                        # what the replicated region is split by
    replicated = Fraction(cfg.act_replicated_bytes_per_token_per_layer)
    full = tokens * ((Fraction(cfg.act_bytes_per_token_per_layer) - replicated) / cfg.tp + replicated / whole)
    if not cfg.checkpointing or layers == 0:
        return math.ceil(in_flight * layers * full)
    kept = Fraction(cfg.input_bytes_per_token) * tokens / whole             # one layer's input
    return math.ceil(in_flight * layers * kept + full)


def per_rank_bytes(cfg: MemoryConfig, *, rank: int = 0, in_flight: int | Fraction = 1) -> dict[str, int]:
    """Bytes `rank` holds, by kind (KINDS) plus "total"; exact integers. in_flight: see activation_bytes."""
    piece, shard = local_params(cfg, rank=rank)
    pbytes = DTYPE_BYTES[cfg.param_dtype]
    gbytes = DTYPE_BYTES[cfg.grad_dtype or cfg.param_dtype]
    gbytes += DTYPE_BYTES[cfg.grad_accum_dtype] if cfg.grad_accum_dtype else 0   # a second buffer beside them
    sbytes = 4 if cfg.master_weights else pbytes          # optimizer state dtype
    s = cfg.zero_stage
    out = {
        "parameters": (shard if s >= 3 else piece) * pbytes,
        "gradients": (shard if s >= 2 else piece) * gbytes,
        "optimizer_state": (shard if s >= 1 else piece) * OPTIMIZER_SLOTS[cfg.optimizer] * sbytes,
        "master_weights": (shard if s >= 1 else piece) * 4 if cfg.master_weights else 0,
        "activations": activation_bytes(cfg, rank=rank, in_flight=in_flight),
        "batch": cfg.batch_bytes,
    }
    out["total"] = sum(out.values())
    return out


def distinct_breakdowns(cfg: MemoryConfig) -> list[tuple[list[int], dict[str, int]]]:
    """Every different per-rank breakdown with the ranks that share it (rank order)."""
    groups: dict[tuple, tuple[list[int], dict[str, int]]] = {}
    for r in range(cfg.world_size):
        b = per_rank_bytes(cfg, rank=r)
        groups.setdefault(tuple(b.values()), ([], b))[0].append(r)
    return list(groups.values())


def format_bytes(n: int | float, *, binary: bool = False) -> str:
    """'8.00 GB' (powers of 1000) or, with binary, '7.45 GiB' (powers of 1024)."""
    require_real("n", n)
    base, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else \
                  (1000, ("B", "kB", "MB", "GB", "TB", "PB"))
    i = 0
    while i < len(units) - 1 and n >= base ** (i + 1):
        i += 1
    return f"{int(n)} B" if i == 0 else f"{n / base ** i:.2f} {units[i]}"


def format_breakdown(b: dict[str, int], *, binary: bool = False) -> str:
    """Table: kind, bytes (exact), size with unit, share of the total."""
    rows = [(k, str(b[k]), format_bytes(b[k], binary=binary), f"{100 * b[k] / b['total']:.1f}%" if b["total"] else "-")
            for k in (*KINDS, "total")]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0].ljust(w[0])}  {r[1].rjust(w[1])}  {r[2].rjust(w[2])}  {r[3].rjust(w[3])}" for r in rows)
