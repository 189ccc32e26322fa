"""The demo registry: every experiment `wmdist verify` knows, by name.

Built explicitly from each technique module's DEMOS list (no import-time
registration side effects): adding a chapter means adding one import here.
"""
from __future__ import annotations

from typing import Callable

from wmdist.report import Demo, Report


def registry() -> dict[str, Demo]:
    """All demos, in course order."""
    from wmdist import allreduce, latents, buckets, data_parallel, dp_pitfalls
    from wmdist import checkpoint, checkpointing, zero

    modules = [allreduce, latents, data_parallel, dp_pitfalls, buckets, zero, checkpointing, checkpoint]
    demos = [d for m in modules for d in m.DEMOS]
    return {d.name: d for d in sorted(demos, key=lambda d: d.chapter)}


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
