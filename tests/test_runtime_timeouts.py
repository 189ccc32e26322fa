"""A call's timeout= bounds the whole call: the wait for transfers nobody waited for, and under torchrun
(issue 19, Medium 4). The bounds asserted are the timeout plus a margin far below the old behaviour
(33 s and 45 s), not a speed."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from conftest import torchrun_env
from wmdist.runtime import RankFailure, run


def tags_disagree(ctx):
    """Counts match (one send, one receive), but the tags differ, so the transfer never completes."""
    if ctx.rank == 0:
        dist.isend(torch.ones(2), 1, tag=1)
    else:
        dist.irecv(torch.empty(2), 0, tag=2)
    return ctx.rank


def test_the_wait_for_unwaited_transfers_ends_within_the_calls_timeout():
    run(lambda ctx: ctx.rank, 2)               # a warm pool: the timeout is the call's, not the start's
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run(tags_disagree, 2, timeout=3)
    assert time.monotonic() - start < 15, "bounded by timeout=3 (was a fixed 30 s drain)"
    assert info.value.reason in ("unmatched", "timeout")
    assert "do the tags of the send and the receive agree?" in str(info.value) or info.value.reason == "timeout"
    assert run(lambda ctx: ctx.rank, 2, timeout=30) == [0, 1]


SCRIPT = """\
import os, time, wmdist

def f(ctx):
    if ctx.rank == 1:
        time.sleep(45)
    return ctx.rank

start = time.monotonic()
try:
    wmdist.run(f, 2, timeout=5)
except BaseException as err:
    print(f"rank {os.environ['RANK']} FAILED after {time.monotonic() - start:.1f} s: {type(err).__name__}: {err}",
          flush=True)
    raise
print("RETURNED", flush=True)
"""


def test_under_torchrun_the_timeout_bounds_a_call_with_a_sleeping_rank(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=240, env=torchrun_env())
    failed = [line for line in done.stdout.splitlines() if " FAILED after " in line]
    assert done.returncode != 0 and "RETURNED" not in done.stdout and failed, done.stdout + done.stderr[-3000:]
    for line in failed:       # the waiting rank's all_gather times out; the sleeping one is interrupted
        assert float(line.split(" FAILED after ")[1].split(" s")[0]) < 25, line      # timeout=5, not the 45 s sleep
    assert any("within the call's timeout of 5 s" in line or "Timed out" in line for line in failed), failed
