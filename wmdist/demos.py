"""The demo registry: every experiment `wmdist verify` knows, by name.

Built explicitly from each technique module's DEMOS list (no import-time
registration side effects): adding a chapter means adding one import here.
"""
from __future__ import annotations

from wmdist.report import Demo


def registry() -> dict[str, Demo]:
    """All demos, in course order."""
    from wmdist import allreduce

    modules = [allreduce]
    demos = [d for m in modules for d in m.DEMOS]
    return {d.name: d for d in sorted(demos, key=lambda d: d.chapter)}
