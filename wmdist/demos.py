"""The registries: every experiment `wmdist verify` knows, and every exercise, by name.

Built explicitly from each chapter module's DEMOS and EXERCISES lists (no
import-time registration side effects): adding a chapter means adding its
modules here.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

from wmdist.exercises import Exercise
from wmdist.report import Demo, Report


def _chapter_modules() -> list[ModuleType]:
    from wmdist.data_parallel import buckets, pitfalls, ring, versus_ddp
    from wmdist.latents import demos as latent_demos, training as latent_training
    from wmdist.memory import activation_recompute, exercises as memory_exercises, sharded_checkpoint, zero_demos

    return [ring, versus_ddp, pitfalls, buckets, latent_training, latent_demos, zero_demos, activation_recompute,
            sharded_checkpoint, memory_exercises]


def registry() -> dict[str, Demo]:
    """All demos, in course order."""
    demos = [d for m in _chapter_modules() for d in getattr(m, "DEMOS", [])]
    return {d.name: d for d in sorted(demos, key=lambda d: d.chapter)}


def exercises() -> dict[str, Exercise]:
    """All exercises by name, in course order."""
    return {e.name: e for m in _chapter_modules() for e in getattr(m, "EXERCISES", [])}


def verify(names: list[str] | None = None, world_size: int | None = None,
           progress: Callable[[int, int, str], None] | None = None) -> list[Report]:
    """Run demos (all, or those named) at their world sizes (or only at `world_size`).

    `progress(done, total, text)` is called before each run and once at the end.

    With `world_size` and no names, demos that need more ranks are left out; a
    named demo that needs more ranks, or an unknown name, raises ValueError
    before anything runs.
    """
    demos = registry()
    unknown = [n for n in names or [] if n not in demos]
    if unknown:
        raise ValueError(f"unknown demo(s) {', '.join(unknown)}; known: {', '.join(demos)}")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world size must be a positive integer, got {world_size!r}")
    if world_size is not None:
        small = [n for n in names or [] if demos[n].min_world_size > world_size]
        if small:
            raise ValueError(f"demo(s) {', '.join(small)} need more than {world_size} rank(s)")
    chosen = names or [n for n, d in demos.items() if world_size is None or d.min_world_size <= world_size]
    plan = [(name, n) for name in chosen for n in ((world_size,) if world_size is not None else demos[name].world_sizes)]
    reports = []
    for done, (name, n) in enumerate(plan):
        if progress is not None:
            progress(done, len(plan), f"{name} on {n} rank(s)")
        reports.append(demos[name].run(n))
    if progress is not None:
        progress(len(plan), len(plan), "done")
    return reports
