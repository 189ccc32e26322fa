"""`wmdist memory`: the memory model from a terminal, with the counts and shapes people actually type.

    wmdist memory --params 7B --dtype bf16 --master-weights --grad-accum-dtype fp32
    wmdist memory --model gpt3-6.7b --dtype bf16 --master-weights --zero 2 --dp 8 --seq-len 4096 --checkpointing

Bad input exits with status 2 and one line naming the flag and the range it must lie in.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from decimal import Decimal, InvalidOperation
from typing import Any

from wmdist.costs.validate import require_int
from wmdist.memory.footprint import (DTYPE_BYTES, OPTIMIZER_SLOTS, MemoryConfig, format_breakdown, format_bytes,
                                    local_params, per_rank_bytes)
from wmdist.memory.presets import PRESETS, preset_fields
from wmdist.memory.remedies import limiting_kind
from wmdist.memory.transient import transient_peak

MAX_PARAMS = 10 ** 18   # --params' stated range: ~6 million GPT-3s; far below where a byte count overflows a float
SUFFIXES = {"k": 10 ** 3, "m": 10 ** 6, "b": 10 ** 9, "g": 10 ** 9, "t": 10 ** 12}
PRESET_HELP = ("a public model shape: " + ", ".join(f"{n} ({m.source})" for n, m in PRESETS.items())
               + ". Sets --params (from the shape), --layers, and the activation bytes of Korthikanti et al. 2022, "
                 "'Reducing Activation Recomputation in Large Transformer Models': s*b*h*(34 + 5*a*s/h) bytes per "
                 "layer (16-bit activations, 1-byte dropout masks, softmax kept, no flash attention, no TP/SP, no "
                 "recomputation; embedding and logits not counted). With --tp, 10*s*b*h of it stays whole on every "
                 "tp rank unless --sequence-parallel. --checkpointing keeps each layer's 16-bit input, 2h bytes per "
                 "token. --seq-len defaults to the model's context. Explicit flags override.")


def parse_count(text: str) -> int:
    """'7B', '1.5B', '70M', '7.5e9', '7500000000.0', '1_000' -> an integer count; ArgumentTypeError otherwise."""
    clean = text.strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(clean[-1:].lower(), 1) if clean and clean[-1:].isalpha() else 1
    try:
        value = Decimal(clean[:-1] if scale != 1 else clean) * scale
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite() or value != value.to_integral_value() or not 0 <= value <= MAX_PARAMS:
        raise argparse.ArgumentTypeError(f"expected a whole parameter count from 0 to 1e18, such as 7B, 1.5B, 70M, "
                                         f"7.5e9 or 7500000000, got {text!r}")
    return int(value)


VALUE_FLAGS = ("--model", "--params", "--dtype", "--grad-dtype", "--grad-accum-dtype", "--optimizer", "--zero", "--dp",
               "--tp", "--pp", "--cp", "--world-size", "--world", "--layers", "--act-bytes", "--act-replicated-bytes",
               "--input-bytes", "--seq-len", "--context", "--micro-batch", "--batch-bytes", "--rank")
_SIGNED = re.compile(r"-[\d.]")


def join_signed_values(argv: list[str]) -> list[str]:
    """Write `--params -7B` as `--params=-7B`, so argparse reads a negative value as the flag's value.

    argparse takes "-7B" for an unknown option ("expected one argument");
    joined, the flag's own check refuses it and says what it expects.
    """
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_FLAGS and i + 1 < len(argv) and _SIGNED.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def add_memory_parser(subparsers: Any) -> None:
    """Register `memory` on an argparse subparsers object."""
    p = subparsers.add_parser("memory", help="bytes each rank holds, by tensor kind",
                              description="Per-rank training memory by kind (parameters, gradients, "
                                          "optimizer state, master weights, activations, batch).")
    p.add_argument("--model", choices=list(PRESETS), help=PRESET_HELP)
    p.add_argument("--params", type=parse_count,
                   help="total parameter count P, 0 to 1e18: 7B, 1.5B, 70M, 7.5e9 or 7500000000")
    p.add_argument("--dtype", default="fp32", help="parameter dtype: " + ", ".join(DTYPE_BYTES))
    p.add_argument("--grad-dtype", default=None, help="gradient dtype (default: --dtype)")
    p.add_argument("--grad-accum-dtype", default=None,
                   help="a separate gradient-accumulation buffer beside the gradients, e.g. fp32 next to bf16 "
                        "gradients (bf16 + fp32 buffer + fp32 master + Adam: 20 bytes/param)")
    p.add_argument("--optimizer", default="adam", choices=list(OPTIMIZER_SLOTS))
    p.add_argument("--master-weights", action="store_true", help="keep an fp32 master copy (fp32 moments)")
    p.add_argument("--zero", type=int, default=0, help="ZeRO stage 0..3")
    for axis in ("dp", "tp", "pp", "cp"):
        p.add_argument(f"--{axis}", type=int, default=None if axis == "dp" else 1, help=f"{axis} degree")
    p.add_argument("--world-size", "--world", dest="world", type=int, default=None,
                   help="total ranks; must equal dp*tp*pp*cp")
    p.add_argument("--layers", type=int, default=None,
                   help="transformer layers, >= 1 (default 1, or the model's); --pp at most this")
    p.add_argument("--act-bytes", type=float, default=None, help="activation bytes per token per layer")
    p.add_argument("--act-replicated-bytes", type=float, default=None,
                   help="of --act-bytes, the part tensor parallelism leaves whole on every tp rank (default 0: all "
                        "sharded, which overstates the saving without sequence parallelism)")
    p.add_argument("--sequence-parallel", action="store_true", help="split the tp-replicated part over tp too")
    p.add_argument("--input-bytes", type=float, default=None, help="layer-input bytes per token (checkpointing)")
    p.add_argument("--seq-len", "--context", dest="seq_len", type=int, default=None, help="tokens per sequence, >= 1")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank")
    p.add_argument("--batch-bytes", type=int, default=0, help="input batch bytes per rank")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--binary", action="store_true", help="KiB/MiB/GiB instead of kB/MB/GB")
    p.add_argument("--json", action="store_true", help="print {kind: bytes, ..., total: bytes}")
    p.set_defaults(_memory_parser=p)


def config_from_args(args: argparse.Namespace) -> MemoryConfig:
    """Build the MemoryConfig an args namespace describes (ValueError on bad input)."""
    for flag, value in (("--layers", args.layers), ("--seq-len", args.seq_len)):
        if value is not None:                 # given explicitly: a model has at least one layer and one token
            require_int(f"{flag}: {flag.lstrip('-').replace('-', '_')}", value, 1)
    fields: dict[str, Any] = preset_fields(args.model, seq_len=args.seq_len) if args.model else {}
    for field, value in (("params", args.params), ("layers", args.layers), ("seq_len", args.seq_len),
                         ("act_bytes_per_token_per_layer", args.act_bytes), ("input_bytes_per_token", args.input_bytes),
                         ("act_replicated_bytes_per_token_per_layer", args.act_replicated_bytes)):
        if value is not None:
            fields[field] = value
    if "params" not in fields:
        raise ValueError(f"--params: give a parameter count (e.g. --params 7B) or --model "
                         f"(one of {', '.join(PRESETS)})")
    if (args.model or args.layers is not None) and args.pp > fields["layers"]:
        of = f"{args.model} has" if args.layers is None else "--layers gives"
        raise ValueError(f"--pp: pp must be an integer from 1 to {fields['layers']} ({of} {fields['layers']} layers "
                         f"and every pipeline stage needs at least one), got {args.pp}")
    dp = args.dp
    if args.world is not None:
        require_int("--world-size", args.world, 1)
        other = args.tp * args.pp * args.cp
        if other < 1 or args.world % other:
            raise ValueError(f"--world-size {args.world} is not divisible by tp*pp*cp = {other}")
        if dp is None:
            dp = args.world // other
        elif dp * other != args.world:
            raise ValueError(f"--world-size {args.world} != dp*tp*pp*cp = {dp * other}")
    return MemoryConfig(param_dtype=args.dtype, grad_dtype=args.grad_dtype, grad_accum_dtype=args.grad_accum_dtype,
                        optimizer=args.optimizer, master_weights=args.master_weights, zero_stage=args.zero,
                        dp=1 if dp is None else dp, tp=args.tp, pp=args.pp, cp=args.cp, micro_batch=args.micro_batch,
                        checkpointing=args.checkpointing, batch_bytes=args.batch_bytes,
                        sequence_parallel=args.sequence_parallel, **fields)


FLAGS = {"params": "--params", "param_dtype": "--dtype", "grad_dtype": "--grad-dtype",
         "grad_accum_dtype": "--grad-accum-dtype", "zero_stage": "--zero", "dp": "--dp", "tp": "--tp", "pp": "--pp",
         "cp": "--cp", "layers": "--layers", "seq_len": "--seq-len", "act_bytes_per_token_per_layer": "--act-bytes",
         "input_bytes_per_token": "--input-bytes", "micro_batch": "--micro-batch", "batch_bytes": "--batch-bytes",
         "act_replicated_bytes_per_token_per_layer": "--act-replicated-bytes", "rank": "--rank"}


def memory_main(args: argparse.Namespace) -> int:
    """Print rank `args.rank`'s breakdown; bad input -> one-line error, exit status 2."""
    try:
        cfg = config_from_args(args)
        b = per_rank_bytes(cfg, rank=args.rank)
        peak = transient_peak(cfg, rank=args.rank)
    except (ValueError, TypeError) as err:
        field = str(err).split(" ", 1)[0].rstrip(":")
        message = f"{FLAGS[field]}: {err}" if field in FLAGS else str(err)
        parser = getattr(args, "_memory_parser", None)
        if parser is not None:
            parser.error(message)     # wmdist.app.cli's parsers print one line (rank 0 only under torchrun), exit 2
        print(f"wmdist memory: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(b))
        return 0
    model = f"{args.model}, " if args.model else ""
    print(f"{model}rank {args.rank} of {cfg.world_size} (dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp}, "
          f"ZeRO-{cfg.zero_stage}); limit: {limiting_kind(b)}")
    print(format_breakdown(b, binary=args.binary))
    if peak.extra:
        unit = max(1, local_params(cfg, rank=args.rank)[0] // max(cfg.layers, 1))
        layer = transient_peak(cfg, rank=args.rank, unit=unit)
        print(f"within a step the peak is higher: {format_bytes(peak.peak, binary=args.binary)} with the whole model "
              f"gathered at once, {format_bytes(layer.peak, binary=args.binary)} one layer at a time ({peak.what})")
    return 0

