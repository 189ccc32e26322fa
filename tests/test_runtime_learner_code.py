"""The learner's own code inside wmdist.run (issue 24, section 2): functional collectives (what DTensor uses)
are counted like the others, forms of one collective that pair on gloo are not called unmatched, a process a
rank forks never answers for it, and a rank may start child processes, which end with the call."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils.data import DataLoader

from conftest import alive, alive_after
from wmdist import runtime
from wmdist.runtime import RankFailure, run


def correct_sum(ctx):
    x = torch.tensor([float(ctx.rank)])
    dist.all_reduce(x)
    return float(x)


# --- functional collectives -------------------------------------------------------------------

def functional_all_reduce_on_rank_0(ctx):
    if ctx.rank == 0:
        funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)        # never waited: returns at once
    return "ok"


def functional_reduce_scatter_on_rank_2(ctx):
    group = ctx.group_of([1, 2]) if ctx.rank else None
    if ctx.rank == 2:
        funcol.reduce_scatter_tensor(torch.ones(4), "sum", 0, group)
    return "ok"


# Found at the end of the call, or as it happens once rank 1 has finished (runtime/stuck.py): which comes
# first depends on timing; both name the same rank, group and rank behind.
@pytest.mark.parametrize("fn, n, culprit, ranks, says", [
    (functional_all_reduce_on_rank_0, 2, 0, (0, 1),
     r"posted all_reduce \(functional\) on group \[0, 1\] \(its collective #1 there\) that rank\(s\) 1 never posted|"
     r"posted its collective #1 on group \[0, 1\], which rank 1 can no longer match"),
    (functional_reduce_scatter_on_rank_2, 3, 2, (1, 2),
     r"posted reduce_scatter_tensor \(functional\) on group \[1, 2\] \(its collective #1 there\) that rank\(s\) 1|"
     r"posted its collective #1 on group \[1, 2\], which rank 1 can no longer match"),
])
def test_a_functional_collective_on_only_some_ranks_fails_its_own_call(fn, n, culprit, ranks, says):
    run(lambda ctx: ctx.rank, n)
    pids = runtime.warm_pids()[n]
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run(fn, n, timeout=60)
    assert time.monotonic() - start < 30, "found by counting at the end of the call, not by a timeout"
    assert (info.value.reason, info.value.rank, info.value.ranks) == ("unmatched", culprit, ranks)
    assert re.search(says, str(info.value)), str(info.value)
    assert alive_after(pids) == [], "the pool that holds the stray collective must be gone"
    assert run(correct_sum, n, timeout=60) == [float(sum(range(n)))] * n     # was: hung, blaming this call


def functional_never_waited(ctx):
    funcol.all_reduce(torch.full((2,), float(ctx.rank + 1)), "sum", dist.group.WORLD)
    return ctx.rank


def unwaited_left_then_sum(ctx):
    left = torch._C._distributed_c10d._get_work_registry_size()     # works a previous call never waited for
    return left, correct_sum(ctx)


def test_matched_functional_collectives_never_waited_are_finished_before_the_next_call():
    assert run(functional_never_waited, 2, timeout=60) == [0, 1]
    assert run(unwaited_left_then_sum, 2, timeout=60) == [(0, 1.0), (0, 1.0)]


def dtensor_matmul(ctx, a, b):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    rows = distribute_tensor(a, mesh, [Shard(0)])          # each rank holds a block of rows
    return (rows @ distribute_tensor(b, mesh, [Replicate()])).redistribute(mesh, [Replicate()]).to_local()


def test_dtensor_in_a_rank_matches_one_device():
    a, b = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), torch.randn(3, 2)
    for out in run(dtensor_matmul, 2, a, b, timeout=120):
        torch.testing.assert_close(out, a @ b, rtol=0, atol=0)     # each row is one rank's own matmul: exact


# --- forms of one collective that gloo pairs ------------------------------------------------------

def gathered(ctx, forms):
    x = torch.tensor([10.0 * ctx.rank + 1, 10.0 * ctx.rank + 2])
    form = forms[ctx.rank]
    if form == "all_gather":
        parts = [torch.empty(2) for _ in range(2)]
        dist.all_gather(parts, x)
        return torch.cat(parts)
    if form == "all_gather_into_tensor":
        out = torch.empty(4)
        dist.all_gather_into_tensor(out, x)
        return out
    if form == "funcol.all_gather_tensor":
        return funcol.all_gather_tensor(x, 0, dist.group.WORLD).wait()
    if form == "all_to_all":
        parts = [torch.empty(1) for _ in range(2)]
        dist.all_to_all(parts, list(x.chunk(2)))
        return torch.cat(parts)
    if form == "all_to_all_single":
        out = torch.empty(2)
        dist.all_to_all_single(out, x)
        return out
    if form == "all_reduce":
        dist.all_reduce(x)
        return x
    if form == "funcol.all_reduce":
        return funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
    raise ValueError(form)


INPUTS = [torch.tensor([1.0, 2.0]), torch.tensor([11.0, 12.0])]       # what gathered() gives ranks 0 and 1
GATHER = [torch.cat(INPUTS)] * 2
SWAP = [torch.tensor([1.0, 11.0]), torch.tensor([2.0, 12.0])]        # rank j gets element j of every rank
SUM = [INPUTS[0] + INPUTS[1]] * 2


@pytest.mark.parametrize("forms, expected", [
    (("all_gather", "all_gather_into_tensor"), GATHER),
    (("all_gather_into_tensor", "funcol.all_gather_tensor"), GATHER),
    (("all_to_all", "all_to_all_single"), SWAP),
    (("all_reduce", "funcol.all_reduce"), SUM),
])
def test_two_forms_of_one_collective_that_gloo_pairs_are_matched(forms, expected):
    for out, want in zip(run(gathered, 2, forms, timeout=60), expected):
        torch.testing.assert_close(out, want, rtol=0, atol=0)        # small integers: exact in any order


def reduce_scatter_two_ways(ctx):
    x, out = torch.ones(2), torch.empty(1)
    if ctx.rank == 0:
        dist.reduce_scatter(out, list(x.chunk(2)), async_op=True)     # async: the call ends, and is checked
    else:
        dist.reduce_scatter_tensor(out, x, async_op=True)
    return ctx.rank


def test_collectives_gloo_does_not_pair_stay_unmatched():
    # measured: rank 0's reduce_scatter (a list) with rank 1's reduce_scatter_tensor times out on gloo
    with pytest.raises(RankFailure) as info:
        run(reduce_scatter_two_ways, 2, timeout=60)
    assert info.value.reason == "unmatched" and "posted different collectives" in str(info.value)
    assert run(correct_sum, 2, timeout=60) == [1.0, 1.0]


# --- a rank that forks ---------------------------------------------------------------------------

def forks_on_rank_0(ctx, i, child_sleeps):
    if ctx.rank == 0 and i == 0:
        child = os.fork()
        if child == 0:                       # the child returns from the rank function too
            time.sleep(child_sleeps)
            return ("child", i)
        return ("forked", child)
    return ("rank", i)


@pytest.mark.parametrize("child_sleeps", [0.0, 30.0], ids=["child-returns-at-once", "child-still-running"])
def test_a_process_a_rank_forks_never_answers_for_it_nor_outlives_the_call(child_sleeps):
    first = run(forks_on_rank_0, 2, 0, child_sleeps, timeout=60)
    assert first[0][0] == "forked" and first[1] == ("rank", 0)
    assert alive_after([first[0][1]]) == [], "the forked child must not outlive the call"
    for i in (1, 2, 3):                      # was: each call got the previous call's results, reported ok
        assert run(forks_on_rank_0, 2, i, child_sleeps, timeout=60) == [("rank", i)] * 2


# --- child processes in a rank ---------------------------------------------------------------------

class WhoLoads(torch.utils.data.Dataset):
    """Item i is (i, i*i, pid of the process that loaded it)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i, i * i, os.getpid()])


def workers_in_a_rank(ctx):
    batches = [b for b in DataLoader(WhoLoads(), batch_size=2, num_workers=2)]
    with mp.Pool(2) as pool:
        squares = pool.map(math.factorial, range(4 + ctx.rank))
    return [b[:, :2] for b in batches], sorted({int(b[0, 2]) for b in batches}), squares


def test_a_dataloader_with_workers_and_a_multiprocessing_pool_work_in_a_rank(no_leftover_ranks):
    reference = [b[:, :2] for b in DataLoader(WhoLoads(), batch_size=2, num_workers=0)]   # one process
    results = run(workers_in_a_rank, 2, timeout=120)
    for rank, (batches, loaders, squares) in enumerate(results):
        assert len(batches) == len(reference) and all(torch.equal(b, r) for b, r in zip(batches, reference))
        assert len(loaders) == 2, "two worker processes loaded the batches"
        assert squares == [math.factorial(x) for x in range(4 + rank)]
        assert alive_after(loaders) == [], "the DataLoader's workers end with the call"


# A notebook's functions live in __main__: multiprocessing pickles them by name, so a Pool in a rank must find them.
SCRIPT = """\
import multiprocessing as mp
import wmdist

def square(x):
    return x * x

def pool_of_squares(ctx):
    with mp.Pool(2) as pool:
        return pool.map(square, range(3 + ctx.rank))

print("RESULT", wmdist.run(pool_of_squares, 2, timeout=120))
"""


def test_a_pool_in_a_rank_runs_a_function_of_the_main_program(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "RESULT [[0, 1, 4], [0, 1, 4, 9]]" in done.stdout, done.stdout + done.stderr[-3000:]


def leaves_children_running(ctx):
    child = mp.Process(target=time.sleep, args=(60,))
    child.start()
    process = subprocess.Popen(["sleep", "60"])
    return [child.pid, process.pid]


def test_processes_a_call_leaves_running_end_with_it(no_leftover_ranks):
    pids = [pid for pair in run(leaves_children_running, 2, timeout=60) for pid in pair]
    assert alive(pids) == [], "ended before the call returned"
    assert run(correct_sum, 2, timeout=60) == [1.0, 1.0]


def starts_children_then_hangs(ctx, path):
    if ctx.rank == 1:
        child = mp.Process(target=time.sleep, args=(60,))
        child.start()
        process = subprocess.Popen(["sleep", "60"])
        with open(path, "w") as f:
            f.write(f"{child.pid} {process.pid}")
        time.sleep(60)
    return ctx.rank


def test_a_rank_that_is_killed_takes_its_children_with_it(tmp_path, no_leftover_ranks):
    path = tmp_path / "children"
    with pytest.raises(RankFailure) as info:
        run(starts_children_then_hangs, 2, str(path), timeout=5)
    assert info.value.reason == "timeout"
    pids = [int(p) for p in path.read_text().split()]
    assert len(pids) == 2 and alive_after(pids) == [], [psutil.Process(p).cmdline() for p in alive(pids)]


def _weakly_held_results(ctx):
    import gc
    import weakref

    refs = []
    for step in range(GATHERS):                           # a training loop's gathers, each waited for
        gathered = funcol.all_gather_tensor(torch.full((1000,), float(step)), 0, dist.group.WORLD)
        refs.append(weakref.ref(funcol.wait_tensor(gathered)))
        del gathered
    funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait()   # the next post prunes what was kept
    gc.collect()
    return sum(ref() is not None for ref in refs)


GATHERS = 6


def test_waited_functional_results_are_not_kept_alive_for_the_rest_of_the_call():
    """Counting a functional collective keeps its result only while it may be unwaited: a loop of gathers
    inside one call does not hold every gathered tensor until the call ends (counting them all kept all 6).

    Held are at most one: kept results are let go at the next post once torch's process-wide registry of
    unwaited collectives is empty, and in the two-worker suite rank 0 sometimes still held the last
    waited gather at that post (seen twice as [1, 0], never reproduced alone); what matters is that the
    number held does not grow with the loop."""
    held = run(_weakly_held_results, 2)
    assert all(h <= 1 for h in held), held
