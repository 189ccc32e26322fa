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
The sizes left out are still checked to get past each demo's own checks up to starting ranks (no
process). WMDIST_FULL_MATRIX=1 runs every accepted size of every demo. Sizes run in order, so one warm
pool per size serves all demos.

NaN and inf. At the first size of at least 2 the matrix runs a demo at, what its ranks returned is
recorded; afterwards the demo runs again with those results replayed (no process) and one NaN,
then one inf, in every float of the last rank's results. Every such Report must fail and say why.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from typing import Any

import pytest
import torch

from wmdist.registry.demos import registry, verify
from wmdist.runtime.warm import WarmPools

SIZES = range(1, 9)
HEAVY = {"dp-train", "dp-buckets", "zero-1-vs-torch", "checkpoint-resume", "checkpoint-crash", "tp-block",
         "tp-vs-dtensor", "sp-vs-cp", "pp-train", "pp-vs-torch", "pp-rollout",
         "ring-attention", "ring-attention-vs-torch", "ring-attention-balance", "ring-attention-long-context"}
HEAVY_SIZES = (1, 3, 5)
SLEEPING = {"pp-bubble", "pp-imbalance", "pp-stage-waits", "pp-overlap"}
SLEEPING_SIZES = (3,)
DEFAULT_SIZES = (1, 2, 3, 4, 5, 8)
FULL = os.environ.get("WMDIST_FULL_MATRIX") == "1"


def _sizes(name: str) -> tuple[int, ...]:
    """The sizes the default matrix runs `name` at (see the module docstring)."""
    if name in SLEEPING:
        return SLEEPING_SIZES
    return HEAVY_SIZES if name in HEAVY else DEFAULT_SIZES


def _recorded_size(name: str) -> int:
    """Where the NaN/inf replay records `name`'s rank results: its first matrix size >= 2 (or 1)."""
    demo = registry()[name]
    sizes = [n for n in (SIZES if FULL else _sizes(name)) if not demo.refuses(n)]
    return min([n for n in sizes if n >= 2] or sizes)


@pytest.fixture(scope="session")
def rank_results() -> dict[str, list[tuple[bool, Any]]]:
    """Per demo, what each of its runs returned (ok, results) or raised (False, exception), in call order."""
    return {}


def _recording(monkeypatch, into: list[tuple[bool, Any]]) -> None:
    real = WarmPools.run

    def run(self, world_size, fn, args, kwargs, timeout):
        try:
            out = real(self, world_size, fn, args, kwargs, timeout)
        except Exception as err:
            into.append((False, err))
            raise
        into.append((True, copy.deepcopy(out)))
        return out
    monkeypatch.setattr(WarmPools, "run", run)


def test_sizes_a_demo_does_not_accept_are_refused_before_any_process_starts(no_processes):
    refused = []
    for name, demo in registry().items():
        for n in SIZES:
            if demo.refuses(n):
                with pytest.raises(ValueError, match=re.escape(name)):
                    verify([name], world_size=n)
                refused.append((name, n))
    assert ("activation-checkpointing", 2) in refused and ("latent-seeds", 1) in refused
    assert HEAVY | SLEEPING <= set(registry()), "HEAVY or SLEEPING names a demo that is not registered (renamed?)"


@pytest.mark.parametrize("n", SIZES if FULL else DEFAULT_SIZES)
def test_every_demo_passes_at_each_size_it_accepts(n, monkeypatch, rank_results):
    """A size a demo accepts must give a PASS: a demo that breaks or refuses there (verify makes either a
    failed Report with its `error`) is a bug, whatever the exception."""
    problems = []
    for name, demo in registry().items():
        if demo.refuses(n) or not (FULL or n in _sizes(name)):
            continue
        with monkeypatch.context() as patch:
            if n == _recorded_size(name):
                _recording(patch, rank_results.setdefault(name, []))
            report = verify([name], world_size=n)[0]
        if not report.passed:
            problems.append(f"{name} on {n} ranks FAILED:\n{report}")
    assert not problems, "\n\n".join(problems)


def poisoned(value: Any, bad: float, hits: list[int]) -> Any:
    """A copy of a rank's result with every float (tensor element 0, Python float) set to `bad`; counts in `hits`."""
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() and value.numel()):
            return value
        out = value.detach().clone()
        out.view(-1)[0] = bad
        hits.append(1)
        return out
    if isinstance(value, float):
        hits.append(1)
        return bad
    if isinstance(value, dict):
        return type(value)((k, poisoned(v, bad, hits)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(poisoned(v, bad, hits) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(poisoned(v, bad, hits) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = copy.copy(value)            # set fields directly: a rank returns what it computed, validated or not
        for f in dataclasses.fields(value):
            object.__setattr__(out, f.name, poisoned(getattr(value, f.name), bad, hits))
        return out
    return value


NO_RANK_FLOATS = {"activation-checkpointing", "scan-one-process", "dp-batch-lr",   # one process
                  "ring-attention-long-context"}                    # ranks return byte counts (exact integers)


def test_nan_or_inf_in_any_rank_result_fails_every_demo_and_says_so(monkeypatch, rank_results):
    """Every demo's comparison path, fed one NaN or one inf in each float its last rank returned, FAILS, with a
    check that is "not finite" or an error naming the bad value (a validator's "must be a finite number")."""
    problems, nothing_to_poison = [], set()
    for name in registry():
        n = _recorded_size(name)
        if name not in rank_results:           # this test alone (-k): record them now
            with monkeypatch.context() as patch:
                _recording(patch, rank_results.setdefault(name, []))
                verify([name], world_size=n)
        for bad in (math.nan, math.inf):
            queue, hits = list(rank_results[name]), []

            def replay(self, world_size, fn, args, kwargs, timeout):
                ok, out = queue.pop(0)
                if not ok:
                    raise out
                out = copy.deepcopy(out)           # the demo may change what it is given
                return out[:-1] + [poisoned(out[-1], bad, hits)]
            with monkeypatch.context() as patch:
                patch.setattr(WarmPools, "run", replay)
                report = verify([name], world_size=n)[0]
            if not hits:
                nothing_to_poison.add(name)
                continue
            said = any(not c.finite for c in report.checks) or any(
                w in (report.error or "").lower() for w in ("nan", "inf", "finite"))
            if report.passed or not said:
                problems.append(f"{name} on {n} ranks with {bad} in {len(hits)} values: passed={report.passed}\n"
                                f"{report}")
    assert not problems, "\n\n".join(problems)
    assert nothing_to_poison == NO_RANK_FLOATS, "demos whose ranks return no float changed: update NO_RANK_FLOATS"


class _WouldStart(BaseException):
    """Raised where a demo would start its ranks: it has validated its inputs by then."""


@pytest.mark.skipif(FULL, reason="the full matrix runs every accepted size")
def test_no_demo_refuses_a_size_it_declares_before_starting(monkeypatch):
    """Every accepted size from 1 to 8 that the default matrix leaves out (6 and 7; HEAVY's and SLEEPING's others)
    gets past the demo's own checks to the point of starting ranks, with no process; one-process demos run and pass."""
    def would_start(*args, **kwargs):
        raise _WouldStart
    monkeypatch.setattr(WarmPools, "run", would_start)
    problems = []
    for name, demo in registry().items():
        for n in (s for s in SIZES if not demo.refuses(s) and s not in _sizes(name)):
            try:
                report = demo.run(n)
            except _WouldStart:
                continue
            except Exception as err:
                problems.append(f"{name} on {n}: {type(err).__name__}: {err}")
                continue
            if not report.passed:
                problems.append(f"{name} on {n} ran in one process and FAILED:\n{report}")
    assert not problems, "\n".join(problems)
