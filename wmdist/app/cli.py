"""The `wmdist` command: list, verify, bench, memory, schedule, plan, lab.

Usage errors exit with status 2 and a one-line message (every subcommand's
parser, and the checks each command makes before it runs); under torchrun
every process exits so and rank 0 alone prints it. `verify` exits 1 if any
check fails. Under torchrun, `verify` runs in every launched process and
rank 0 prints.

Parsing, help, usage errors, `list`, `memory`, `schedule`, `plan` and `lab` import no torch (seconds on a
busy machine, before even `--help` could answer): what needs it (`verify`, `bench`, torchrun's
teardown) imports it inside the command that runs.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from typing import NoReturn

from wmdist.app import lab
from wmdist.bench import catalog as bench_catalog
from wmdist.registry import catalog
from wmdist.memory.command import add_memory_parser, join_signed_values, memory_main
from wmdist.pipeline import cli as schedule_cli
from wmdist.planner import cli as plan_cli

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")     # as wmdist.runtime.under_torchrun reads them
ECHO_LIMIT = 200         # longest word of an argument an error message repeats in full


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def under_torchrun() -> bool:
    """wmdist.runtime.under_torchrun without importing torch: inside a process that torchrun launched."""
    return all(k in os.environ for k in TORCHRUN_VARS)


def shorten(message: str, *, limit: int = ECHO_LIMIT) -> str:
    """`message` with every word (a run without spaces, quotes, commas or semicolons) longer than `limit` characters cut
    to its first half, marked with its length: an argument pasted by mistake is named, not printed back whole."""
    return re.sub(rf"[^\s,;'\"]{{{limit + 1},}}", lambda m: f"{m[0][:limit // 2]}… ({len(m[0]):,} characters)", message)


def usage_error(prog: str, message: str) -> NoReturn:
    """Print `prog: error: message` as one line (under torchrun on rank 0 only) and exit with status 2."""
    if not under_torchrun() or os.environ.get("RANK") == "0":
        print(f"{prog}: error: {shorten(message)}", file=sys.stderr)
    raise SystemExit(2)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are usage_error's one line, not usage text and a line (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="wmdist", description="Distributed training of world models, run for real.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name the registered demos")
    v = sub.add_parser("verify", help="run demos and check them against single-device references")
    v.add_argument("names", nargs="*", help="demo names (default: all)")
    v.add_argument("-n", "--world-size", type=_positive_int, help="run only at this world size")
    v.add_argument("--json", action="store_true", help="print a JSON list of Report dicts")
    b = sub.add_parser("bench", help="measure speed and memory ratios in one run", epilog=bench_catalog.help_text(),
                       description="Measure speed and memory ratios in one run, each printed with its inputs,\n"
                       "target and the load average around it.", formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("names", nargs="*", help="benchmark names, listed below (default: all)")
    b.add_argument("--json", action="store_true", help="print JSON")
    add_memory_parser(sub)
    schedule_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    lab.add_parser(sub)
    for command in sub.choices.values():      # schedule sets its own one-line error: make it torchrun-aware too
        command.error = functools.partial(usage_error, command.prog)     # type: ignore[method-assign]
    return parser


def _cmd_list() -> int:
    for demo in catalog.DEMOS:         # the registry's names and titles, without importing the chapters
        sizes = ",".join(map(str, demo.world_sizes))
        print(f"{demo.name:28s} ch{demo.chapter}  N={sizes:16s} {demo.title}")
    return 0


INTERRUPTED = 130        # a shell's status for a command stopped by Ctrl-C (128 + SIGINT)


def _cmd_verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`wmdist verify`; Ctrl-C (SIGINT) ends it with one line on stderr and status 130, not a traceback.

    Nothing is left to say more: the call that was running has killed its ranks by then, and the
    other warm pools and the forkserver go as the process exits (tests/test_cli_signals.py).
    """
    runs = [0, 0, False]      # runs begun, of how many, and whether a progress line is open on the terminal
    try:
        return _verify(args, parser, runs)
    except KeyboardInterrupt:
        if not under_torchrun() or os.environ.get("RANK") == "0":
            where = f"in run {runs[0] + 1} of {runs[1]}" if runs[1] else "before any demo ran"
            print(f"{chr(10) if runs[2] else ''}wmdist verify: interrupted {where}; nothing is reported",
                  file=sys.stderr, flush=True)
        return INTERRUPTED


def _verify(args: argparse.Namespace, parser: argparse.ArgumentParser, runs: list) -> int:
    unknown = [n for n in args.names if n not in {d.name for d in catalog.DEMOS}]
    if unknown:                        # answered before torch is imported
        parser.error(f"unknown demo(s): {', '.join(unknown)} (see `wmdist list`)")
    from wmdist.registry.demos import prepare, verify
    from wmdist.course.report import format_table, to_json

    world = args.world_size
    if under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if world not in (None, env_world):
            parser.error(f"-n {world} disagrees with torchrun's WORLD_SIZE={env_world}")
        world = env_world
    try:
        prepared = prepare(args.names or None, world_size=world)    # every size checked, each spec built, once
    except ValueError as err:
        parser.error(f"-n {world}: {err}")
    printing = not under_torchrun() or int(os.environ["RANK"]) == 0
    for why in prepared.left_out.values() if printing else ():
        print(f"left out: {why}", file=sys.stderr)
    quiet = under_torchrun() or not sys.stderr.isatty()

    def progress(done: int, total: int, text: str) -> None:
        runs[:] = [done, total, not quiet and done < total]
        if not quiet:
            _progress_line(done, total, text)
    # Every usage error was raised above, before any process started; from here a demo that
    # breaks is a FAIL row with its reason, and the other demos still run.
    reports = verify(prepared=prepared, progress=progress)
    failed = any(not r.passed for r in reports)
    if printing:
        try:
            print(to_json(reports) if args.json else format_table(reports))
            for r in reports:
                if not r.passed and not args.json:
                    print(f"\n{r}")
            sys.stdout.flush()
        except BrokenPipeError:      # `wmdist verify | head`: the reader has what it wanted
            _discard_stdout()
    return 1 if failed else 0


def _discard_stdout() -> None:
    """Send the rest of stdout to /dev/null once its reader has gone, so the exit is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _progress_line(done: int, total: int, text: str) -> None:
    """One overwritten status line on the terminal while demos run."""
    end = "\n" if done == total else ""
    print(f"\r\033[K[{done}/{total}] {text}", end=end, file=sys.stderr, flush=True)


def _bench_progress(done: int, total: int, text: str) -> None:
    """One stderr line per step of a long benchmark (session-memory's chapters), kept, so a log shows them too."""
    print(f"  [{done}/{total}] {text}", file=sys.stderr, flush=True)


def _cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from wmdist.bench.suite import benchmarks

    table = benchmarks(progress=_bench_progress)
    unknown = [n for n in args.names if n not in table]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(table)}")
    results = []
    names = args.names or list(table)
    for k, name in enumerate(names):
        print(f"bench [{k + 1}/{len(names)}] {name}: running", file=sys.stderr, flush=True)
        result = table[name]()
        results.append(result)
        if not args.json:
            print(result, flush=True)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    return 0


# --- wmdist memory: wmdist/memory/command.py -------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["memory"]:
        argv = join_signed_values(argv)       # `--params -7B`: the flag's own check answers it
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _cmd_list()
        if args.command == "memory":
            return memory_main(args)
        if args.command == "schedule":
            return schedule_cli.main(args)
        if args.command == "plan":
            return plan_cli.main(args, error=functools.partial(usage_error, "wmdist plan"))
        if args.command == "lab":
            try:
                return lab.main(args)
            except lab.LabError as err:          # found before JupyterLab starts: a usage error like any other
                usage_error("wmdist lab", str(err))
        if args.command == "verify":
            code = _cmd_verify(args, parser)
        else:
            code = _cmd_bench(args, parser)
    except BrokenPipeError:          # e.g. `wmdist list | head`
        _discard_stdout()
        return 0
    if under_torchrun() and code != INTERRUPTED:       # interrupted, its peers may be gone: no barrier
        _leave_torchrun(code)
    return code


def _leave_torchrun(code: int) -> None:
    """Exit a torchrun worker without gloo's teardown abort (see runtime.rank.worker_main)."""
    import torch.distributed as dist

    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.barrier()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
