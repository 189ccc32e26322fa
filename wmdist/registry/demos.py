"""The registries: every experiment `wmdist verify` knows, and every exercise, by name.

Built explicitly from each chapter's `chapter.py`, which lists its DEMOS and
EXERCISES (no import-time registration side effects): adding a chapter means
adding its `chapter.py` here. Every demo is an `experiment.Experiment`: it answers `refuses(n)`
without starting a process and `run(n)` with a Report under its own name and
size (the runner makes the Report, so it cannot name another demo or size).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from wmdist import runtime
from wmdist.course.exercises import Exercise
from wmdist.course.experiment import Experiment
from wmdist.base.on_progress import OnProgress
from wmdist.course.report import Report


def _chapter_modules() -> list[ModuleType]:
    """Each chapter's `chapter.py` (its DEMOS and EXERCISES), in course order."""
    from wmdist.data_parallel import chapter as ch01
    from wmdist.diffusion import chapter as ch08
    from wmdist.experts import chapter as ch10
    from wmdist.latents import chapter as ch02
    from wmdist.memory import chapter as ch03
    from wmdist.mesh import chapter as ch09
    from wmdist.pipeline import chapter as ch05
    from wmdist.ring_attention import chapter as ch06
    from wmdist.scan import chapter as ch07
    from wmdist.tensor_parallel import chapter as ch04

    return [ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10]


def registry() -> dict[str, Experiment]:
    """All demos, in course order."""
    demos = [d for m in _chapter_modules() for d in getattr(m, "DEMOS", [])]
    return {d.name: d for d in sorted(demos, key=lambda d: d.chapter)}


def exercises() -> dict[str, Exercise]:
    """All exercises by name, in course order."""
    return {e.name: e for m in _chapter_modules() for e in getattr(m, "EXERCISES", [])}


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What `verify` will run, built once: each demo with its spec for the size, and those left out with why."""

    runs: tuple[tuple[Experiment, Any], ...]     # (demo, spec(n)), in course order
    left_out: dict[str, str]                     # demo name -> why it cannot run at the size asked


def prepare(names: list[str] | None = None, *, world_size: int | None = None) -> Prepared:
    """Check everything before anything runs, and build each run's spec once.

    An unknown name, a world size that is not a positive integer or is more
    local ranks than wmdist starts, or a named demo that cannot run at
    `world_size` raise ValueError. Unnamed demos that cannot run at
    `world_size` are left out. Without `world_size`, each demo runs at its own sizes.
    """
    demos = registry()
    unknown = [n for n in names or [] if n not in demos]
    if unknown:
        raise ValueError(f"unknown demo(s) {', '.join(unknown)}; known: {', '.join(demos)}")
    if world_size is not None:
        try:
            world_size = runtime.as_world_size(world_size)
        except ValueError:
            raise ValueError(f"world size must be a positive integer, got {world_size!r}") from None
        if world_size > runtime.MAX_LOCAL_WORLD and not runtime.under_torchrun():
            raise ValueError(f"world size {world_size} is more local ranks than wmdist starts "
                             f"(at most {runtime.MAX_LOCAL_WORLD}); use torchrun for larger jobs")
    runs, refused = [], {}
    for name in names or demos:
        demo = demos[name]
        for n in demo.world_sizes if world_size is None else (world_size,):
            try:
                runs.append((demo, demo.spec(n)))
            except ValueError as err:
                refused[name] = f"{name}: {err}"
    if names and refused:
        raise ValueError("; ".join(refused.values()))
    return Prepared(runs=tuple(runs), left_out=refused)


def plan(names: list[str] | None = None, *, world_size: int | None = None) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """The (demo name, world size) runs `verify` makes, and the demos it leaves out with the reason (see `prepare`)."""
    prepared = prepare(names, world_size=world_size)
    return [(demo.name, spec.world_size) for demo, spec in prepared.runs], prepared.left_out


def _run_one(demo: Experiment, spec: Any) -> Report:
    """`demo.run_spec(spec)`, or a failed Report saying why it broke."""
    start = time.perf_counter()
    try:
        return demo.run_spec(spec)
    except Exception as err:     # a demo's failure is a row of the table, not the end of verify
        return Report(name=demo.name, world_size=spec.world_size, seconds=time.perf_counter() - start,
                      error=f"{type(err).__name__}: {err}")


def verify(names: list[str] | None = None, *, world_size: int | None = None,
           progress: OnProgress | None = None, prepared: Prepared | None = None) -> list[Report]:
    """Run demos (all, or those named) at their world sizes (or only at `world_size`).

    `progress(done, total, text)` is called before each run and once at the end.
    Checks come first (see `prepare`; pass its result as `prepared` to check
    and build once, as the CLI does): with `world_size` and no names, demos that
    cannot run at that size are left out; a named one raises ValueError before
    anything runs. Those are the only errors raised: once the runs begin, a
    demo that breaks (any exception, a ValueError included, since the size was
    accepted) is a failed Report whose `error` says why, and the next demo
    runs.
    """
    if prepared is None:
        prepared = prepare(names, world_size=world_size)
    elif names is not None or world_size is not None:
        raise ValueError("give names and world_size to prepare(), or a prepared plan to verify(), not both")
    reports = []
    for done, (demo, spec) in enumerate(prepared.runs):
        if progress is not None:
            progress(done, len(prepared.runs), f"{demo.name} on {spec.world_size} rank(s)")
        reports.append(_run_one(demo, spec))
    if progress is not None:
        progress(len(prepared.runs), len(prepared.runs), "done")
    return reports
