"""`wmdist schedule`: a pipeline schedule from the terminal, as each rank's list of actions, with its bubble.

    wmdist schedule 1f1b -P 4 -M 8              rank 0: F0 F1 F2 F3 B0 F4 B1 ...  then the bubble, both ways
    wmdist schedule interleaved -P 2 -M 4 -v 2  tokens carry the virtual stage: s2F0
    wmdist schedule gpipe -P 4 -M 8 --gantt     adds the ideal slot diagram as text
    wmdist schedule gpipe -P 2 -M 3 --json      {"schedule": "gpipe", ..., "ranks": [["F0", ...], ...]}

The bubble is measured by the ideal-time simulation (forward 1 slot, backward
2, equal stages, free sends) and printed in both conventions: the idle share
of the whole schedule, f = (P-1)/(M+P-1), and the bubble over the ideal time,
r = (P-1)/M (with v chunks, vM in place of M). Sizes are bounded up front
(schedules.check_size: -P up to 256, -M up to 1024, -v up to 16, P*M*v up to
16384). Bad input exits with status 2 and one line naming the flag.
"""
from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any, NoReturn

from wmdist.pipeline.schedules import (MAX_CHUNKS, MAX_MICROBATCHES, MAX_SLOTS, MAX_STAGES, Schedule,
                                       make_schedule, schedule_to_json)
from wmdist.pipeline.simulate import gantt_text, simulate

FLAGS = {"stages": "-P", "microbatches": "-M", "chunks": "-v", "stages*microbatches*chunks": "-P*-M*-v"}
GANTT_CELLS = 240      # widest slot diagram --gantt draws (one cell per slot: 3(M+P-1) for gpipe and 1f1b)


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
                                          "virtual stage 2 (which lives on rank 2 % P). Then the bubble in both "
                                          "conventions: idle share of the schedule (P-1)/(M+P-1), and bubble "
                                          "over ideal time (P-1)/M.")
    p.add_argument("name", choices=["gpipe", "1f1b", "interleaved"], help="the schedule")
    p.add_argument("-P", "--stages", type=_int, default=4,
                   help=f"pipeline stages, one per rank: 1 to {MAX_STAGES} (default 4)")
    p.add_argument("-M", "--microbatches", type=_int, default=8,
                   help=f"microbatches per step: 1 to {MAX_MICROBATCHES} (default 8)")
    p.add_argument("-v", "--chunks", type=_int, default=None,
                   help=f"virtual stages per rank, interleaved only: 1 to {MAX_CHUNKS} (default 2 there, else 1); "
                        f"P*M*v at most {MAX_SLOTS}")
    p.add_argument("--json", action="store_true", help='print {"schedule": ..., "ranks": [[tokens], ...]}')
    p.add_argument("--gantt", action="store_true", help=f"also draw the ideal slot diagram (forward 1 slot, "
                                                        f"backward 2), up to {GANTT_CELLS} slots wide")

    def one_line_error(message: str) -> NoReturn:       # argparse's own errors, as one line too
        print(f"wmdist schedule: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    p.error = one_line_error            # type: ignore[method-assign]
    p.set_defaults(_schedule_parser=p)


def build(args: argparse.Namespace) -> Schedule:
    """The Schedule the arguments describe (ValueError naming the flag on bad input)."""
    chunks = args.chunks if args.chunks is not None else (2 if args.name == "interleaved" else 1)
    try:
        return make_schedule(args.name, args.stages, args.microbatches, chunks=chunks)
    except ValueError as err:
        field = str(err).split(" ", 1)[0]
        raise ValueError(f"{FLAGS[field]}: {err}" if field in FLAGS else str(err)) from None


def _bubble_lines(schedule: Schedule, idle: Fraction, over_ideal: Fraction) -> list[str]:
    """The measured bubble in both conventions, each beside its closed form."""
    vm = "M" if schedule.chunks == 1 else "vM"
    return [f"idle fraction of the schedule: {idle} = {float(idle):.3f}   f = (P-1)/({vm}+P-1), idle over the "
            f"whole schedule",
            f"bubble over ideal time:        {over_ideal} = {float(over_ideal):.3f}   r = (P-1)/{vm}, idle over "
            f"the time with no bubble (Megatron-LM)",
            "(ideal slots: forward 1, backward 2, equal stages, free sends; f = r/(1+r))"]


def main(args: argparse.Namespace) -> int:
    """Print the schedule and its bubble (text or JSON, optionally with the slot diagram); bad input: status 2."""
    try:
        schedule = build(args)
        result = simulate(schedule)
        if args.gantt and result.makespan > GANTT_CELLS:
            raise ValueError(f"--gantt: the diagram would be {result.makespan} slots wide, more than the "
                             f"{GANTT_CELLS} it draws; drop --gantt or use fewer stages or microbatches")
        diagram = gantt_text(schedule, result, max_cells=GANTT_CELLS) if args.gantt else None
    except ValueError as err:
        parser = getattr(args, "_schedule_parser", None)
        if parser is not None:
            parser.error(str(err))          # one line; under wmdist.app.cli, on rank 0 only under torchrun
        print(f"wmdist schedule: error: {err}", file=sys.stderr)
        return 2
    idle, over_ideal = result.idle_fraction, result.bubble_over_ideal
    if args.json:
        data = schedule_to_json(schedule)
        data["idle_fraction"], data["bubble_over_ideal"] = float(idle), float(over_ideal)
        if diagram is not None:
            data["gantt"] = diagram.splitlines()
        print(json.dumps(data))
        return 0
    width = len(str(schedule.stages - 1))
    for rank, tokens in enumerate(schedule.tokens()):
        print(f"rank {rank:>{width}}: {' '.join(tokens)}")
    if diagram is not None:
        print(f"\nideal slots (forward 1, backward 2; '.' idle):\n{diagram}")
    print("\n" + "\n".join(_bubble_lines(schedule, idle, over_ideal)))
    return 0
