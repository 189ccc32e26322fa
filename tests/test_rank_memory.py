"""A warm rank gives back the heap its last call used (runtime/rank.py trims glibc's heap after each call).

A kept pool idles between a notebook's calls, and twelve chapters' kept kernels with their pools share
Binder's 2 GiB (tests/test_binder_session.py). Without the trim, a call that used 100 MB of malloc heap
left it all resident in every rank (measured: 10 -> 111 MiB USS per rank), since glibc returns freed
memory below a live allocation only when asked.
"""
from __future__ import annotations

import sys
import time

import psutil
import pytest

import wmdist
from conftest import patience
from wmdist import runtime

JUNK = 100_000                 # 1,000-byte objects: 100 MB, each over pymalloc's 512 bytes, so on malloc's heap


def _grow(ctx) -> int:
    import builtins
    junk = [bytes(1000) for _ in range(JUNK)]
    builtins._wmdist_kept_above = [bytes(1000) for _ in range(64)]   # outlives the call, above the junk
    del junk
    return ctx.rank


def _forget(ctx) -> int:
    import builtins
    builtins.__dict__.pop("_wmdist_kept_above", None)
    return ctx.rank


def _uss_mib(world_size: int) -> list[float]:
    return [psutil.Process(p).memory_full_info().uss / 2**20 for p in runtime.warm_pids()[world_size]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and USS are Linux's")
def test_a_call_that_used_100_mb_of_heap_leaves_the_rank_as_it_found_it():
    wmdist.run(lambda ctx: ctx.rank, 2)
    before = _uss_mib(2)
    try:
        wmdist.run(_grow, 2)
        # A rank trims after sending its reply (the call's latency stays its own), so the parent may look first:
        # wait for it, as long as a loaded machine needs (measured quiet: given back before the parent looks).
        deadline = time.monotonic() + patience(10)
        while True:
            grown = [a - b for a, b in zip(_uss_mib(2), before)]
            # Half the junk: what the trim leaves is a few pages of the heap's bookkeeping; without it, all 100 MB.
            if all(g < 50 for g in grown) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        wmdist.run(_forget, 2)
    assert all(g < 50 for g in grown), f"USS grew by {grown} MiB per rank after a call that freed 100 MB"
