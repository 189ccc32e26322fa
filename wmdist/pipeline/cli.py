"""`wmdist schedule`: a pipeline schedule from the terminal, as each rank's list of actions.

    wmdist schedule 1f1b -P 4 -M 8              rank 0: F0 F1 F2 F3 B0 F4 B1 ...
    wmdist schedule interleaved -P 2 -M 4 -v 2  tokens carry the virtual stage: s2F0
    wmdist schedule gpipe -P 4 -M 8 --gantt     adds the ideal slot diagram as text
    wmdist schedule gpipe -P 2 -M 3 --json      {"schedule": "gpipe", ..., "ranks": [["F0", ...], ...]}

Bad input exits with status 2 and one line naming the flag.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from wmdist.pipeline.schedules import Schedule, make_schedule, to_json
from wmdist.pipeline.simulate import gantt_text, simulate

FLAGS = {"stages": "-P", "microbatches": "-M", "chunks": "-v", "max_cells": "--gantt"}


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_parser(subparsers: Any) -> None:
    """Register `schedule` on an argparse subparsers object."""
    p = subparsers.add_parser("schedule", help="print a pipeline schedule: each rank's forwards and backwards",
                              description="Each rank's ordered actions under a pipeline schedule: F3 / B3 are "
                                          "the forward / backward of microbatch 3; with v > 1, s2F3 is that of "
                                          "virtual stage 2 (which lives on rank 2 %% P).")
    p.add_argument("name", choices=["gpipe", "1f1b", "interleaved"], help="the schedule")
    p.add_argument("-P", "--stages", type=_int, default=4, help="pipeline stages, one per rank (default 4)")
    p.add_argument("-M", "--microbatches", type=_int, default=8, help="microbatches per step (default 8)")
    p.add_argument("-v", "--chunks", type=_int, default=None,
                   help="virtual stages per rank, interleaved only (default 2 there, else 1)")
    p.add_argument("--json", action="store_true", help='print {"schedule": ..., "ranks": [[tokens], ...]}')
    p.add_argument("--gantt", action="store_true", help="also draw the ideal slot diagram (forward 1 slot, "
                                                        "backward 2) and its idle fraction")

    def one_line_error(message: str) -> NoReturn:       # argparse's own errors, as one line too
        print(f"wmdist schedule: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    p.error = one_line_error            # type: ignore[method-assign]


def build(args: argparse.Namespace) -> Schedule:
    """The Schedule the arguments describe (ValueError naming the flag on bad input)."""
    chunks = args.chunks if args.chunks is not None else (2 if args.name == "interleaved" else 1)
    try:
        return make_schedule(args.name, args.stages, args.microbatches, chunks)
    except ValueError as err:
        field = str(err).split(" ", 1)[0]
        raise ValueError(f"{FLAGS[field]}: {err}" if field in FLAGS else str(err)) from None


def main(args: argparse.Namespace) -> int:
    """Print the schedule (text or JSON, optionally with the slot diagram); usage errors exit with status 2."""
    try:
        schedule = build(args)
        diagram = None
        if args.gantt:
            result = simulate(schedule)
            diagram = (gantt_text(schedule, result), result.idle_fraction)
    except ValueError as err:
        print(f"wmdist schedule: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        data = to_json(schedule)
        if diagram is not None:
            data["gantt"] = diagram[0].splitlines()
            data["idle_fraction"] = float(diagram[1])
        print(json.dumps(data))
        return 0
    width = len(str(schedule.stages - 1))
    for rank, tokens in enumerate(schedule.tokens()):
        print(f"rank {rank:>{width}}: {' '.join(tokens)}")
    if diagram is not None:
        text, idle = diagram
        print(f"\nideal slots (forward 1, backward 2; '.' idle):\n{text}")
        print(f"idle fraction of the schedule: {idle} = {float(idle):.3f}")
    return 0
