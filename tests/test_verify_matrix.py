"""Every registered demo at world sizes from 1 to 8: it passes there, or it is refused before
any process starts, with a message naming it. The demos come from `registry()`, so a chapter is
covered the day it registers.

Coverage. The whole matrix (every demo, every accepted size 1..8) passes; it took 620 s on this
shared 2-core machine, too long for every run of the suite, so by default:
- every refused size of every demo is checked (free);
- every demo runs at 1, 2, 3, 4, 5 and 8 ranks (one process, the default sizes, the two
  smallest odd sizes, where divisibility problems show, and the largest). 6 and 7 add no case
  those miss (7, prime, behaves as 5 and 3 do);
- the demos in HEAVY (10 s or more for the sweep: torch's DDP, ZeroRedundancyOptimizer, DCP,
  DTensor and pipelining, or long timelines) run at 1, 3 and 5 ranks only, and those in
  SLEEPING (pipeline timings made of fixed sleeps, whose cost grows with N while what they
  check does not) at 3; their defaults, mostly 2 and 4, run in their chapters' tests.
WMDIST_FULL_MATRIX=1 runs every accepted size of every demo. Sizes run in order, so one warm
pool per size serves all demos.
"""
from __future__ import annotations

import os
import re

import pytest

from wmdist.demos import registry, verify
from wmdist.runtime import Pool

SIZES = range(1, 9)
HEAVY = {"dp-train", "dp-buckets", "zero-1-vs-torch", "checkpoint-resume", "checkpoint-crash", "tp-block",
         "tp-vs-dtensor", "sp-vs-cp", "pp-train", "pp-vs-torch", "pp-rollout",
         "ring-attention", "ring-attention-vs-torch", "ring-attention-balance", "ring-attention-long-context"}
HEAVY_SIZES = (1, 3, 5)
SLEEPING = {"pp-bubble", "pp-imbalance"}
SLEEPING_SIZES = (3,)
DEFAULT_SIZES = (1, 2, 3, 4, 5, 8)
FULL = os.environ.get("WMDIST_FULL_MATRIX") == "1"


def _sizes(name: str) -> tuple[int, ...]:
    """The sizes the default matrix runs `name` at (see the module docstring)."""
    if name in SLEEPING:
        return SLEEPING_SIZES
    return HEAVY_SIZES if name in HEAVY else DEFAULT_SIZES


@pytest.fixture
def pool_uses(monkeypatch):
    """Every Pool start and call, to prove that a refusal came before any process was used."""
    uses: list[str] = []
    start, call = Pool.start, Pool.run
    monkeypatch.setattr(Pool, "start", lambda self, *a, **k: uses.append("start") or start(self, *a, **k))
    monkeypatch.setattr(Pool, "run", lambda self, *a, **k: uses.append("run") or call(self, *a, **k))
    return uses


def test_sizes_a_demo_does_not_accept_are_refused_before_any_process_starts(pool_uses):
    refused = []
    for name, demo in registry().items():
        for n in SIZES:
            if demo.refuses(n):
                with pytest.raises(ValueError, match=re.escape(name)):
                    verify([name], n)
                refused.append((name, n))
    assert pool_uses == [], "a refused size started or used ranks"
    assert ("activation-checkpointing", 2) in refused and ("latent-seeds", 1) in refused
    assert HEAVY | SLEEPING <= set(registry()), "HEAVY or SLEEPING names a demo that is not registered (renamed?)"


@pytest.mark.parametrize("n", SIZES if FULL else DEFAULT_SIZES)
def test_every_demo_passes_at_each_size_it_accepts(n, pool_uses):
    problems = []
    for name, demo in registry().items():
        if demo.refuses(n) or not (FULL or n in _sizes(name)):
            continue
        used = len(pool_uses)
        try:
            report = verify([name], n)[0]
        except ValueError as err:          # the demo's own check of its arguments: fine if nothing ran
            if len(pool_uses) > used:
                problems.append(f"{name} on {n} ranks refused only after its ranks ran: {err}")
            continue
        except Exception as err:
            problems.append(f"{name} on {n} ranks: {type(err).__name__}: {err}")
            continue
        if not report.passed:
            problems.append(f"{name} on {n} ranks FAILED:\n{report}")
    assert not problems, "\n\n".join(problems)
