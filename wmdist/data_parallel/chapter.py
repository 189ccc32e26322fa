"""Chapter 01 (and chapter 00's ring-pass exercise): its registered demos and exercises, gathered from the modules that define them, in course order.

`wmdist.registry.demos.registry()` reads one such file per chapter; a new demo is added here and in its own module.
"""
from __future__ import annotations

from wmdist.data_parallel import algorithms_demo, buckets, compression_demo, drift_demo, pitfalls, ring, versus_ddp

DEMOS = (ring.DEMOS + algorithms_demo.DEMOS + versus_ddp.DEMOS + pitfalls.DEMOS + buckets.DEMOS
         + drift_demo.DEMOS + compression_demo.DEMOS)
EXERCISES = ring.EXERCISES + pitfalls.EXERCISES
