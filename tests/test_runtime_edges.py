"""The launcher's edges: timeouts, world sizes learners compute, nested calls, results the parent
cannot read, rank output, threads, the warm-rank budget and temporary directories."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import torch

from conftest import alive, descendants
from wmdist import runtime as launch
from wmdist.runtime import MAX_TIMEOUT_S, RankFailure, run
from wmdist.runtime.cleanup import OWNER_FILE


@pytest.fixture
def tmp_path(short_tmp):
    """This module's tests make tmp_path a process's TMPDIR: a short one (conftest.short_tmp says why)."""
    return short_tmp


def rank_and_size(ctx):
    return ctx.rank, ctx.world_size


def python(program: str, tmpdir: str) -> subprocess.CompletedProcess:
    """Run a program in a fresh interpreter whose temporary directory is `tmpdir`."""
    env = {**os.environ, "TMPDIR": tmpdir}
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("timeout", [float("inf"), 1e308, 3e6, MAX_TIMEOUT_S + 1, float("nan"), -1.0])
def test_timeouts_beyond_the_limit_are_refused_before_anything_starts(timeout):
    launch.shutdown()
    before = descendants()
    with pytest.raises(ValueError, match=f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f}"):
        run(rank_and_size, 2, timeout=timeout)
    assert descendants() - before == set() and launch.warm_pids() == {}


def test_the_longest_allowed_timeout_works():
    assert run(rank_and_size, 2, timeout=MAX_TIMEOUT_S) == [(0, 2), (1, 2)]
    assert run(rank_and_size, 2, timeout=np.float32(30.0)) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("size", [np.int64(2), np.int32(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)])
def test_world_sizes_computed_with_numpy_or_torch_are_accepted(size):
    assert run(rank_and_size, size) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("size", [np.bool_(True), torch.tensor(2.0), torch.tensor([2]), torch.tensor(True)])
def test_world_sizes_that_are_not_integers_are_refused(size):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        run(rank_and_size, size)


def test_a_nested_run_inside_a_rank_says_what_to_do_instead():
    import wmdist

    with pytest.raises(RankFailure) as info:
        run(lambda ctx: wmdist.run(rank_and_size, 2), 2)
    assert "ranks cannot start ranks" in str(info.value) and "ctx.group_of" in str(info.value)
    assert "daemonic" not in str(info.value)


def _refuse_to_load():
    raise RuntimeError("this object can only be loaded inside a rank")


class LoadsOnlyInRanks:
    def __reduce__(self):
        return _refuse_to_load, ()


def test_a_result_the_parent_cannot_unpickle_names_the_rank():
    with pytest.raises(RankFailure) as info:
        run(lambda ctx: LoadsOnlyInRanks() if ctx.rank == 1 else 0, 2)
    assert info.value.rank == 1 and info.value.reason == "unpickle"
    assert "cannot be unpickled" in str(info.value) and "only be loaded inside a rank" in str(info.value)
    assert run(rank_and_size, 2) == [(0, 2), (1, 2)]


PRINTING = """
import sys, time, wmdist
def dots(ctx):
    for _ in range(40):
        print(ctx.rank, end="", flush=True)              # a progress line, written a piece at a time
        time.sleep(0.002)
    print()
    print("to stderr from", ctx.rank, file=sys.stderr)
    print("unfinished line", end="")                     # written out at the end of the call
wmdist.run(dots, 3)
"""


def test_rank_output_arrives_in_whole_lines_prefixed_with_the_rank(tmp_path):
    done = python(PRINTING, str(tmp_path))
    assert done.returncode == 0, done.stderr
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    for r in range(3):
        assert f"[rank {r}] " + str(r) * 40 in out
        assert f"[rank {r}] unfinished line" in out
        assert f"[rank {r}] to stderr from {r}" in err


def test_four_threads_calling_at_once_share_one_pool(monkeypatch, tmp_path):
    launch.shutdown()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))    # this process's temporary directories go here
    before = descendants()
    results: list = [None] * 4

    def call(i: int) -> None:
        results[i] = run(rank_and_size, 3)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == [[(0, 3), (1, 3), (2, 3)]] * 4
    ranks = set(launch.warm_pids()[3])
    assert len(ranks) == 3 and {p for p in descendants() - before if p not in ranks} <= helpers(before)
    launch.shutdown()
    assert alive(list(ranks)) == [] and glob.glob(str(tmp_path / "wmdist-*")) == []


def helpers(before: set[int]) -> set[int]:
    """The forkserver and resource tracker (started once per interpreter), if this call started them."""
    import psutil

    return {p for p in descendants() - before
            if any(k in " ".join(psutil.Process(p).cmdline()) for k in ("forkserver", "resource_tracker"))}


def test_a_pool_larger_than_the_warm_budget_is_not_kept_warm():
    n = launch.MAX_WARM_RANKS + 1
    assert run(lambda ctx: ctx.rank, n) == list(range(n))
    assert n not in launch.warm_pids()


STALE = """
import wmdist
print(wmdist.run(lambda ctx: ctx.rank, 1))
"""


def test_directories_left_by_a_dead_owner_are_removed_at_pool_start(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = {}
    for name in ("wmdist-dead", "pymp-dead", "wmdist-live", "wmdist-unmarked"):
        left[name] = tmp_path / name
        left[name].mkdir()
    for name in ("wmdist-dead", "pymp-dead"):
        (left[name] / OWNER_FILE).write_text(f"{dead.stdout.strip()} 12345.0")
    from wmdist.runtime.cleanup import mark
    mark(str(left["wmdist-live"]))                          # this test process: alive
    done = python(STALE, str(tmp_path))
    assert done.returncode == 0 and "[0]" in done.stdout, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wmdist-live", "wmdist-unmarked"]


def test_a_run_whose_parent_builds_an_optimizer_leaves_no_inductor_directory(tmp_path):
    # A demo's single-device reference builds an optimizer in the parent: torch.optim imports torch._dynamo,
    # which makes an empty torchinductor_<user> in $TMPDIR (issue 19: left by `wmdist verify dp-train -n 2`).
    done = python("import torch, wmdist\n"
                  "print(wmdist.run(lambda ctx: ctx.rank, 2))\n"
                  "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n", str(tmp_path))
    assert done.returncode == 0 and "[0, 1]" in done.stdout, done.stderr
    assert os.listdir(tmp_path) == []


def test_a_live_owner_is_not_taken_for_gone_when_the_wall_clock_moves(tmp_path, monkeypatch):
    # Linux recomputes the boot time on every read of /proc/stat; under NTP two processes' psutil
    # create_time() of one process differ by a second, and CI lost its forkserver's socket that way.
    import psutil
    from wmdist.runtime.cleanup import mark, remove_stale
    live = tmp_path / "pymp-live"
    live.mkdir()
    mark(str(live))
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 1.0)
    assert remove_stale(tmp=str(tmp_path)) == []
    assert live.is_dir()


REMOVED = """
import multiprocessing.util, shutil, wmdist
print(wmdist.run(lambda ctx: ctx.rank, 1))
shutil.rmtree(multiprocessing.util.get_temp_dir())      # the forkserver's socket goes with it
print(wmdist.run(lambda ctx: ctx.rank, 2))
"""


def test_a_removed_multiprocessing_directory_does_not_break_the_next_pool(tmp_path):
    done = python(REMOVED, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[0]", "[0, 1]"], done.stdout
