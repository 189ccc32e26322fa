"""What each rank holds: a byte-exact memory model of training, by tensor kind.

Pure Python (no torch), so the calculator panel, the `wmdist memory` CLI and
the ZeRO demo (which measures the bytes each rank really holds) share one
source of truth. Every count is an exact integer for a given rank.

Accounting rules (each one a choice; the docs and the tests follow them):

* Rank layout. world = dp * cp * tp * pp and
  rank = dp_rank + dp * (cp_rank + cp * (tp_rank + tp * pp_rank)),
  so data-parallel replicas are neighbours: dp_rank = rank % dp.
* Model parallelism first. The P parameters, as one flat vector, are split
  over the tp * pp model-parallel ranks with the torch.tensor_split layout
  (`costs.ring_chunk_sizes`: the first P % (tp*pp) pieces hold one element
  more); model-parallel index = pp_rank * tp + tp_rank.
* Then ZeRO over dp. That local piece is split again over dp with the same
  layout. Stage 1 keeps only the rank's shard of optimizer state and master
  weights, stage 2 also of gradients, stage 3 also of parameters.
* Optimizer state. sgd: nothing; momentum: 1 buffer; adam/adamw: 2 moments,
  each of the state dtype: fp32 when master weights are kept, else the
  parameter dtype. Step counters (a few bytes) are not counted.
* Master weights: an fp32 copy of the parameters, when `master_weights`.
  With adam this gives the ZeRO paper's K = 12 bytes/param (4 + 4 + 4).
* Activations. pp splits the layers (tensor_split layout over pp stages), cp
  splits each sequence's tokens (same layout over cp ranks), tp divides the
  per-layer activation bytes (a simplification: it assumes every stored
  activation is sharded over tp, as with sequence parallelism alongside TP).
  Stored bytes = ceil(layers_local * micro_batch * tokens_local * bytes / tp).
  With checkpointing a rank keeps only each local layer's input
  (`input_bytes_per_token`) plus one layer's full activations, recomputed
  during its backward.
* Batch: `batch_bytes` per rank, as given.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable

from wmdist.costs import require_int, ring_chunk_sizes

if TYPE_CHECKING:
    from wmdist.exercises import Verdict

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}   # state tensors per parameter
KINDS = ("parameters", "gradients", "optimizer_state", "master_weights", "activations", "batch")


@dataclass(frozen=True)
class MemoryConfig:
    """One training setup, as the sizes that decide what a rank stores."""
    params: int                     # total parameter count P of the model
    param_dtype: str = "fp32"
    grad_dtype: str | None = None   # None: same as param_dtype
    optimizer: str = "adam"         # "sgd" | "momentum" | "adam" | "adamw"
    master_weights: bool = False    # fp32 master copy (mixed precision); moments then fp32 too
    zero_stage: int = 0             # 0..3, sharding over the data-parallel degree
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    layers: int = 1                 # transformer-like layers (activations)
    act_bytes_per_token_per_layer: float = 0.0
    context: int = 0                # tokens per sequence
    micro_batch: int = 1            # sequences per rank
    checkpointing: bool = False     # keep layer inputs only, recompute one layer at a time
    batch_bytes: int = 0            # input batch bytes per rank
    input_bytes_per_token: float = 0.0   # one layer's input per token: what checkpointing keeps

    def __post_init__(self) -> None:
        require_int("params", self.params, 0)
        for name in ("dp", "tp", "pp", "cp", "micro_batch"):
            require_int(name, getattr(self, name), 1)
        for name in ("layers", "context", "batch_bytes"):
            require_int(name, getattr(self, name), 0)
        for name in ("act_bytes_per_token_per_layer", "input_bytes_per_token"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("param_dtype", "grad_dtype"):
            v = getattr(self, name)
            if not (v is None and name == "grad_dtype") and v not in DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {sorted(DTYPE_BYTES)}, got {v!r}")
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZER_SLOTS)}, got {self.optimizer!r}")
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name in ("master_weights", "checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def world(self) -> int:
        """Ranks in the whole job: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp


def rank_coords(cfg: MemoryConfig, rank: int) -> dict[str, int]:
    """(dp_rank, cp_rank, tp_rank, pp_rank) of `rank`, dp varying fastest."""
    require_int("rank", rank, 0)
    if rank >= cfg.world:
        raise ValueError(f"rank must be < world size {cfg.world} (dp*cp*tp*pp), got {rank}")
    rest, dp_rank = divmod(rank, cfg.dp)
    rest, cp_rank = divmod(rest, cfg.cp)
    pp_rank, tp_rank = divmod(rest, cfg.tp)
    return {"dp": dp_rank, "cp": cp_rank, "tp": tp_rank, "pp": pp_rank}


def local_params(cfg: MemoryConfig, rank: int = 0) -> tuple[int, int]:
    """(model-parallel piece, this rank's ZeRO shard of it), in elements."""
    c = rank_coords(cfg, rank)
    piece = ring_chunk_sizes(cfg.params, cfg.tp * cfg.pp)[c["pp"] * cfg.tp + c["tp"]]
    return piece, ring_chunk_sizes(piece, cfg.dp)[c["dp"]]


def activation_bytes(cfg: MemoryConfig, rank: int = 0) -> int:
    """Stored activation bytes on `rank` under the rules in the module docstring."""
    c = rank_coords(cfg, rank)
    layers = ring_chunk_sizes(cfg.layers, cfg.pp)[c["pp"]]
    tokens = cfg.micro_batch * ring_chunk_sizes(cfg.context, cfg.cp)[c["cp"]]
    full = Fraction(cfg.act_bytes_per_token_per_layer) * tokens / cfg.tp   # one layer, all its activations
    if not cfg.checkpointing or layers == 0:
        return math.ceil(layers * full)
    kept = Fraction(cfg.input_bytes_per_token) * tokens / cfg.tp          # one layer's input
    return math.ceil(layers * kept + full)


def per_rank_bytes(cfg: MemoryConfig, rank: int = 0) -> dict[str, int]:
    """Bytes `rank` holds, by kind (KINDS) plus "total"; exact integers."""
    piece, shard = local_params(cfg, rank)
    pbytes = DTYPE_BYTES[cfg.param_dtype]
    gbytes = DTYPE_BYTES[cfg.grad_dtype or cfg.param_dtype]
    sbytes = 4 if cfg.master_weights else pbytes          # optimizer state dtype
    s = cfg.zero_stage
    out = {
        "parameters": (shard if s >= 3 else piece) * pbytes,
        "gradients": (shard if s >= 2 else piece) * gbytes,
        "optimizer_state": (shard if s >= 1 else piece) * OPTIMIZER_SLOTS[cfg.optimizer] * sbytes,
        "master_weights": (shard if s >= 1 else piece) * 4 if cfg.master_weights else 0,
        "activations": activation_bytes(cfg, rank),
        "batch": cfg.batch_bytes,
    }
    out["total"] = sum(out.values())
    return out


def distinct_breakdowns(cfg: MemoryConfig) -> list[tuple[list[int], dict[str, int]]]:
    """Every different per-rank breakdown with the ranks that share it (rank order)."""
    groups: dict[tuple, tuple[list[int], dict[str, int]]] = {}
    for r in range(cfg.world):
        b = per_rank_bytes(cfg, r)
        groups.setdefault(tuple(b.values()), ([], b))[0].append(r)
    return list(groups.values())


# --- units and remedies -------------------------------------------------------

def format_bytes(n: int | float, binary: bool = False) -> str:
    """'8.00 GB' (powers of 1000) or, with binary, '7.45 GiB' (powers of 1024)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
        raise ValueError(f"n must be a finite number of bytes >= 0, got {n!r}")
    base, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else \
                  (1000, ("B", "kB", "MB", "GB", "TB", "PB"))
    i = 0
    while i < len(units) - 1 and n >= base ** (i + 1):
        i += 1
    return f"{int(n)} B" if i == 0 else f"{n / base ** i:.2f} {units[i]}"


def limiting_kind(breakdown: dict[str, int]) -> str:
    """The kind holding the most bytes (first in KINDS order on ties)."""
    return max(KINDS, key=lambda k: breakdown.get(k, 0))


@dataclass(frozen=True)
class Remedy:
    name: str
    targets: tuple[str, ...]   # kinds whose per-rank bytes it divides
    how: str


REMEDIES = (
    Remedy("ZeRO-1", ("optimizer_state", "master_weights"), "shards optimizer state over the dp ranks"),
    Remedy("ZeRO-2", ("optimizer_state", "master_weights", "gradients"), "also shards gradients"),
    Remedy("ZeRO-3", ("optimizer_state", "master_weights", "gradients", "parameters"),
           "also shards parameters; gathers them layer by layer when needed"),
    Remedy("tensor parallel", ("parameters", "gradients", "optimizer_state", "master_weights", "activations"),
           "splits each layer's computation, and so its weights, across ranks"),
    Remedy("pipeline parallel", ("parameters", "gradients", "optimizer_state", "master_weights", "activations"),
           "gives each rank a contiguous block of layers"),
    Remedy("activation checkpointing", ("activations",),
           "keeps layer inputs only and recomputes the rest in backward: compute for memory"),
    Remedy("context parallel", ("activations",), "splits each sequence's token positions across ranks"),
    Remedy("smaller micro-batch", ("activations", "batch"), "fewer sequences per step (accumulate gradients)"),
    Remedy("more replicated DP workers", (),
           "each replica still holds everything: faster, not smaller per rank"),
)


def remedies_for(kind: str) -> list[Remedy]:
    """Remedies that shrink `kind` on each rank, most specific (fewest targets) first."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return sorted((r for r in REMEDIES if kind in r.targets), key=lambda r: len(r.targets))


# --- exercise: bytes of model state per rank under ZeRO ------------------------------

def zero_state_bytes(params: int, stage: int, dp: int, dp_rank: int) -> int:
    """Reference: model-state bytes (params + grads + optimizer + master) for fp16 mixed-precision Adam."""
    cfg = MemoryConfig(params, "fp16", optimizer="adam", master_weights=True, zero_stage=stage, dp=dp)
    return per_rank_bytes(cfg, dp_rank)["total"]


def check_zero_bytes(fn: Callable[[int, int, int, int], int]) -> Verdict:
    """Verdict on a reader's fn(params, stage, dp, dp_rank) -> bytes, over a grid with uneven shards."""
    from wmdist.exercises import Verdict   # imports torch; keep this module torch-free to import
    if not callable(fn):
        return Verdict(False, f"expected a function fn(params, stage, dp, dp_rank), got {type(fn).__name__}")
    cases = 0
    for params in (0, 1, 12, 1000, 1003, 10**9 + 7):
        for stage in range(4):
            for dp in (1, 2, 3, 4, 8):
                for dp_rank in range(dp):
                    expected = zero_state_bytes(params, stage, dp, dp_rank)
                    try:
                        got = fn(params, stage, dp, dp_rank)
                    except Exception as err:  # the reader's bug, reported as text
                        return Verdict(False, "ZeRO bytes: not yet.",
                                       [f"fn({params}, {stage}, {dp}, {dp_rank}) raised {type(err).__name__}: {err}"])
                    if got != expected:
                        return Verdict(False, "ZeRO bytes: not yet.",
                                       [f"fn(params={params}, stage={stage}, dp={dp}, dp_rank={dp_rank}) "
                                        f"returned {got!r}, expected {expected}"])
                    cases += 1
    return Verdict(True, f"ZeRO bytes: passed all {cases} cases (stages 0-3, uneven shards included).")


# --- CLI: wmdist memory -----------------------------------------------------------

def _whole_number(text: str) -> int:
    """An integer count written plainly or in scientific notation ("1e9"), nothing fractional."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value) if "e" in text.lower() else int(text)


def add_memory_parser(subparsers: Any) -> None:
    """Register `memory` on an argparse subparsers object."""
    p = subparsers.add_parser("memory", help="bytes each rank holds, by tensor kind",
                              description="Per-rank training memory by kind (parameters, gradients, "
                                          "optimizer state, master weights, activations, batch).")
    p.add_argument("--params", type=_whole_number, required=True, help="total parameter count P (e.g. 1000000 or 1e9)")
    p.add_argument("--dtype", default="fp32", help="parameter dtype: " + ", ".join(DTYPE_BYTES))
    p.add_argument("--grad-dtype", default=None, help="gradient dtype (default: --dtype)")
    p.add_argument("--optimizer", default="adam", choices=list(OPTIMIZER_SLOTS))
    p.add_argument("--master-weights", action="store_true", help="keep an fp32 master copy (fp32 moments)")
    p.add_argument("--zero", type=int, default=0, help="ZeRO stage 0..3")
    for axis in ("dp", "tp", "pp", "cp"):
        p.add_argument(f"--{axis}", type=int, default=None if axis == "dp" else 1, help=f"{axis} degree")
    p.add_argument("--world", type=int, default=None, help="total ranks; must equal dp*tp*pp*cp")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--act-bytes", type=float, default=0.0, help="activation bytes per token per layer")
    p.add_argument("--input-bytes", type=float, default=0.0, help="layer-input bytes per token (checkpointing)")
    p.add_argument("--context", type=int, default=0, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank")
    p.add_argument("--batch-bytes", type=int, default=0, help="input batch bytes per rank")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--binary", action="store_true", help="KiB/MiB/GiB instead of kB/MB/GB")
    p.add_argument("--json", action="store_true", help="print {kind: bytes, ..., total: bytes}")
    p.set_defaults(func=memory_main, _memory_parser=p)


def config_from_args(args: argparse.Namespace) -> MemoryConfig:
    """Build the MemoryConfig an args namespace describes (ValueError on bad input)."""
    dp = args.dp
    if args.world is not None:
        require_int("--world", args.world, 1)
        other = args.tp * args.pp * args.cp
        if other < 1 or args.world % other:
            raise ValueError(f"--world {args.world} is not divisible by tp*pp*cp = {other}")
        if dp is None:
            dp = args.world // other
        elif dp * other != args.world:
            raise ValueError(f"--world {args.world} != dp*tp*pp*cp = {dp * other}")
    return MemoryConfig(args.params, args.dtype, args.grad_dtype, args.optimizer, args.master_weights,
                        args.zero, 1 if dp is None else dp, args.tp, args.pp, args.cp, args.layers,
                        args.act_bytes, args.context, args.micro_batch, args.checkpointing,
                        args.batch_bytes, args.input_bytes)


def format_breakdown(b: dict[str, int], binary: bool = False) -> str:
    """Table: kind, bytes (exact), size with unit, share of the total."""
    rows = [(k, str(b[k]), format_bytes(b[k], binary), f"{100 * b[k] / b['total']:.1f}%" if b["total"] else "-")
            for k in (*KINDS, "total")]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0].ljust(w[0])}  {r[1].rjust(w[1])}  {r[2].rjust(w[2])}  {r[3].rjust(w[3])}" for r in rows)


_FLAGS = {"params": "--params", "param_dtype": "--dtype", "grad_dtype": "--grad-dtype", "zero_stage": "--zero",
          "dp": "--dp", "tp": "--tp", "pp": "--pp", "cp": "--cp", "layers": "--layers", "context": "--context",
          "act_bytes_per_token_per_layer": "--act-bytes", "input_bytes_per_token": "--input-bytes",
          "micro_batch": "--micro-batch", "batch_bytes": "--batch-bytes", "rank": "--rank"}


def memory_main(args: argparse.Namespace) -> int:
    """Print rank `args.rank`'s breakdown; bad input -> one-line error, exit status 2."""
    try:
        cfg = config_from_args(args)
        b = per_rank_bytes(cfg, args.rank)
    except (ValueError, TypeError) as err:
        field = str(err).split(" ", 1)[0]
        message = f"{_FLAGS[field]}: {err}" if field in _FLAGS else str(err)
        parser = getattr(args, "_memory_parser", None)
        if parser is not None:
            parser.error(message)     # prints usage + message, raises SystemExit(2)
        print(f"wmdist memory: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(b))
    else:
        print(f"rank {args.rank} of {cfg.world} (dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp}, "
              f"ZeRO-{cfg.zero_stage}); limit: {limiting_kind(b)}")
        print(format_breakdown(b, args.binary))
    return 0
