"""The `wmdist` command: list, verify, bench, memory.

Usage errors exit with status 2 and a one-line message; `verify` exits 1 if
any check fails. Under torchrun, `verify` runs in every launched process and
rank 0 prints.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from wmdist import runtime
from wmdist.costs import require_int
from wmdist.demos import registry, verify
from wmdist.memory.footprint import DTYPE_BYTES, OPTIMIZER_SLOTS, MemoryConfig, format_breakdown, per_rank_bytes
from wmdist.memory.remedies import limiting_kind
from wmdist.report import format_table, to_json


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wmdist", description="Distributed training of world models, run for real.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name the registered demos")
    v = sub.add_parser("verify", help="run demos and check them against single-device references")
    v.add_argument("names", nargs="*", help="demo names (default: all)")
    v.add_argument("-n", "--world-size", type=_positive_int, help="run only at this world size")
    v.add_argument("--json", action="store_true", help="print a JSON list of Report dicts")
    b = sub.add_parser("bench", help="measure speed and memory ratios in one run")
    b.add_argument("names", nargs="*", help="benchmark names (default: all)")
    b.add_argument("--json", action="store_true", help="print JSON")
    _add_memory_parser(sub)
    return parser


def _cmd_list() -> int:
    for demo in registry().values():
        sizes = ",".join(map(str, demo.world_sizes))
        print(f"{demo.name:28s} ch{demo.chapter}  N={sizes:16s} {demo.title}")
    return 0


def _cmd_verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    known = registry()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown demo(s): {', '.join(unknown)} (see `wmdist list`)")
    world = args.world_size
    if runtime.under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if world not in (None, env_world):
            parser.error(f"-n {world} disagrees with torchrun's WORLD_SIZE={env_world}")
        world = env_world
    quiet = runtime.under_torchrun() or not sys.stderr.isatty()
    reports = verify(args.names or None, world, progress=None if quiet else _progress_line)
    failed = any(not r.passed for r in reports)
    if not runtime.under_torchrun() or int(os.environ["RANK"]) == 0:
        print(to_json(reports) if args.json else format_table(reports))
        for r in reports:
            if not r.passed and not args.json:
                print(f"\n{r}")
    return 1 if failed else 0


def _progress_line(done: int, total: int, text: str) -> None:
    """One overwritten status line on the terminal while demos run."""
    end = "\n" if done == total else ""
    print(f"\r\033[K[{done}/{total}] {text}", end=end, file=sys.stderr, flush=True)


def _cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from wmdist.bench import benchmarks

    table = benchmarks()
    unknown = [n for n in args.names if n not in table]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(table)}")
    results = []
    for name in args.names or list(table):
        result = table[name]()
        results.append(result)
        if not args.json:
            print(result, flush=True)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    return 0


# --- wmdist memory ---------------------------------------------------------------

def _whole_number(text: str) -> int:
    """An integer count written plainly or in scientific notation ("1e9"), nothing fractional."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value) if "e" in text.lower() else int(text)


def _add_memory_parser(subparsers: Any) -> None:
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
    p.add_argument("--world-size", "--world", dest="world", type=int, default=None,
                   help="total ranks; must equal dp*tp*pp*cp")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--act-bytes", type=float, default=0.0, help="activation bytes per token per layer")
    p.add_argument("--input-bytes", type=float, default=0.0, help="layer-input bytes per token (checkpointing)")
    p.add_argument("--seq-len", "--context", dest="seq_len", type=int, default=0, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank")
    p.add_argument("--batch-bytes", type=int, default=0, help="input batch bytes per rank")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--binary", action="store_true", help="KiB/MiB/GiB instead of kB/MB/GB")
    p.add_argument("--json", action="store_true", help="print {kind: bytes, ..., total: bytes}")
    p.set_defaults(_memory_parser=p)


def config_from_args(args: argparse.Namespace) -> MemoryConfig:
    """Build the MemoryConfig an args namespace describes (ValueError on bad input)."""
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
    return MemoryConfig(args.params, args.dtype, args.grad_dtype, args.optimizer, args.master_weights,
                        args.zero, 1 if dp is None else dp, args.tp, args.pp, args.cp, args.layers,
                        args.act_bytes, args.seq_len, args.micro_batch, args.checkpointing,
                        args.batch_bytes, args.input_bytes)


_FLAGS = {"params": "--params", "param_dtype": "--dtype", "grad_dtype": "--grad-dtype", "zero_stage": "--zero",
          "dp": "--dp", "tp": "--tp", "pp": "--pp", "cp": "--cp", "layers": "--layers", "seq_len": "--seq-len",
          "act_bytes_per_token_per_layer": "--act-bytes", "input_bytes_per_token": "--input-bytes",
          "micro_batch": "--micro-batch", "batch_bytes": "--batch-bytes", "rank": "--rank"}


def _cmd_memory(args: argparse.Namespace) -> int:
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
        print(f"rank {args.rank} of {cfg.world_size} (dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp}, "
              f"ZeRO-{cfg.zero_stage}); limit: {limiting_kind(b)}")
        print(format_breakdown(b, args.binary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        return _cmd_list()
    if args.command == "memory":
        return _cmd_memory(args)
    if args.command == "verify":
        code = _cmd_verify(args, parser)
    else:
        code = _cmd_bench(args, parser)
    if runtime.under_torchrun():
        _leave_torchrun(code)
    return code


def _leave_torchrun(code: int) -> None:
    """Exit a torchrun worker without gloo's teardown abort (see pool._worker_main)."""
    import torch.distributed as dist

    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.barrier()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
