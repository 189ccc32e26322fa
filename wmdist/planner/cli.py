"""`wmdist plan`: the best layouts for a model on a cluster, or one layout judged, from the terminal.

    wmdist plan --model llama3-405b --gpus 16384 --gpu h100 --seq 8192 --batch-tokens 16M
    wmdist plan --model llama3-405b --gpus 16384 --gpu h100 --seq 8192 --batch-tokens 16M \\
        --layout dp=128,tp=8,pp=16,virtual=7,zero=2

The first prints the `--top` fastest layouts that fit, each with its breakdown (compute, elementwise, optimizer,
bubble, each axis's exposed communication); the second says why the layout fits or does not (the tensors
that take the memory) and its predicted step and MFU. Sizes take binary suffixes: 16M tokens is 16 x 2^20.
Every input is checked before any planning (a preset that does not exist, a size that is not positive, a
layout the GPU count or the model cannot divide): one line on stderr names the value and what is allowed,
exit status 2.
"""
from __future__ import annotations

import argparse
import re
from typing import Any

from wmdist.planner.hardware import CLUSTERS, GPUS
from wmdist.planner.layout import check_layout, parse_layout
from wmdist.planner.model import TrainingJob, from_architecture
from wmdist.planner.presets import PRESETS
from wmdist.planner.rank import format_table, judge, rank_layouts
from wmdist.planner.scoring import EFFICIENCY, FLASH_FROM_YEAR, cluster_spec

SUFFIX = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30}
MAX_TOP = 100


def size(text: str) -> int:
    """'16M' -> 16 * 2**20, '8192' -> 8192; an argparse error for anything not a positive whole size."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    value = int(match.group(1)) * SUFFIX[match.group(2).lower()] if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size (an integer, optionally with K, M or G "
                                         f"for 2^10, 2^20, 2^30), got {text!r}")
    return value


def add_parser(subparsers: Any) -> None:
    """Register `plan` on an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="rank the layouts of a model on a cluster, or judge one",
                              description="Predict the step time, MFU and memory of parallel layouts "
                                          "(dp x tp x pp x cp x ep, ZeRO, micro-batch, virtual stages, recompute) "
                                          "and rank those that fit, or judge one with --layout.")
    p.add_argument("--model", required=True, help=f"model preset: {', '.join(PRESETS)}")
    p.add_argument("--gpus", required=True, type=size, help="GPU count")
    p.add_argument("--gpu", required=True, help=f"GPU type: {', '.join(GPUS)}")
    p.add_argument("--cluster", default=None, help=f"a published cluster's network: {', '.join(CLUSTERS)} "
                                                   "(default: the GPU type's typical node and network)")
    p.add_argument("--seq", required=True, type=size, help="sequence length in tokens")
    p.add_argument("--batch-tokens", required=True, type=size, help="tokens per step, e.g. 16M")
    p.add_argument("--layout", default=None, help="judge this layout: dp=..,tp=..,pp=..,cp=..,ep=..,zero=..,"
                                                  "micro_batch=..,virtual=..,recompute=none|selective|full")
    p.add_argument("--top", type=size, default=10, help=f"layouts to list, 1 to {MAX_TOP} (default 10)")
    p.add_argument("--efficiency", type=float, default=None,
                   help="achieved / peak FLOP/s of the matmuls (default: the value fitted for the GPU type)")
    p.add_argument("--no-flash", action="store_true", help="attention without FlashAttention (keeps the scores)")


def build_job(args: argparse.Namespace) -> TrainingJob:
    """The job the arguments describe; a ValueError naming the first bad one."""
    if args.model not in PRESETS:
        raise ValueError(f"--model {args.model!r} is not a preset; allowed: {', '.join(PRESETS)}")
    if args.gpu not in GPUS:
        raise ValueError(f"--gpu {args.gpu!r} is not a GPU type; allowed: {', '.join(GPUS)}")
    if args.cluster is not None and args.cluster not in CLUSTERS:
        raise ValueError(f"--cluster {args.cluster!r} is not a cluster; allowed: {', '.join(CLUSTERS)}")
    if args.cluster is not None and CLUSTERS[args.cluster].gpu != args.gpu:
        raise ValueError(f"--cluster {args.cluster} has {CLUSTERS[args.cluster].gpu} GPUs, not --gpu {args.gpu}")
    if not 1 <= args.top <= MAX_TOP:
        raise ValueError(f"--top must be from 1 to {MAX_TOP}, got {args.top}")
    efficiency = EFFICIENCY[args.gpu] if args.efficiency is None else args.efficiency
    if not 0 < efficiency <= 1:
        raise ValueError(f"--efficiency must be in (0, 1], got {efficiency}")
    if args.batch_tokens % args.seq:
        raise ValueError(f"--batch-tokens {args.batch_tokens} must be a whole number of --seq {args.seq} sequences")
    return TrainingJob(model=from_architecture(PRESETS[args.model]),
                       cluster=cluster_spec(args.gpu, fabric=args.cluster, efficiency=efficiency), gpus=args.gpus,
                       seq_len=args.seq, batch_tokens=args.batch_tokens, flash_attention=not args.no_flash)


def main(args: argparse.Namespace, *, error: Any) -> int:
    """Run `wmdist plan`; `error(message)` reports a usage error (one line, exit 2) before any planning."""
    try:
        job = build_job(args)
        layout = check_layout(job, parse_layout(args.layout)) if args.layout is not None else None
    except ValueError as err:
        error(str(err))
        raise AssertionError("error() returns only by raising SystemExit") from err
    eff = job.cluster.efficiency
    head = (f"{job.model.name} on {job.gpus} x {args.gpu}, seq {job.seq_len}, {job.sequences} sequences "
            f"({job.batch_tokens} tokens) per step; compute at {eff:.0%} of peak"
            f"{' (fitted to the published runs)' if args.efficiency is None else ''}; attention "
            f"{'with' if job.flash_attention else 'without'} FlashAttention (published runs: from {FLASH_FROM_YEAR})")
    print(head)
    if layout is not None:
        print(judge(job, layout))
        return 0
    plans = rank_layouts(job, top=args.top)
    if not plans:
        print("no layout fits: every candidate needs more memory than the GPU has")
        return 1
    print(format_table(plans))
    return 0
