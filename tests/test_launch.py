"""The launcher: results in rank order, warm reuse, every failure mode named, nothing left behind."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch

from conftest import alive, alive_after, descendants
from wmdist import runtime as launch
from wmdist.comm import all_reduce, exchange, ring_all_reduce
from wmdist.runtime import Pool, RankFailure, run


def rank_and_size(ctx):
    return ctx.rank, ctx.world_size


def test_results_in_rank_order_for_every_size():
    for n in (1, 2, 3, 4):
        assert run(rank_and_size, n) == [(r, n) for r in range(n)]


def test_function_defined_in_test_body_runs_on_four_ranks():
    offset = 100   # captured from the enclosing scope: must travel by value

    def local(ctx, scale, *, shift=0):
        x = torch.tensor([float(ctx.rank)])
        all_reduce(ctx, x)
        return float(x) * scale + offset + shift

    assert run(local, 4, 2.0, shift=1) == [(0 + 1 + 2 + 3) * 2.0 + 100 + 1] * 4
    assert run(lambda ctx: ctx.rank ** 2, 4) == [0, 1, 4, 9]


def test_pool_is_reused_between_calls():
    run(rank_and_size, 3)
    pids = launch.warm_pids()[3]
    run(rank_and_size, 3)
    assert launch.warm_pids()[3] == pids
    assert len(alive(pids)) == 3


def test_each_call_gets_a_fresh_ledger():
    def count(ctx):
        ring_all_reduce(ctx, torch.ones(10))
        return ctx.ledger.totals()["rounds"]

    assert run(count, 2) == [2, 2]
    assert run(count, 2) == [2, 2]


# --- failures -------------------------------------------------------------------------

def raise_on_rank(ctx, bad):
    x = torch.ones(8)
    ring_all_reduce(ctx, x, phase="warmup")
    if ctx.rank == bad:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    all_reduce(ctx, x, phase="after")
    return 0


def exit_on_rank(ctx, bad, code):
    if ctx.rank == bad:
        os._exit(code)
    all_reduce(ctx, torch.ones(1), phase="waiting for the dead")


def signal_on_rank(ctx, bad, sig):
    if ctx.rank == bad:
        os.kill(os.getpid(), sig)
        time.sleep(5)
    all_reduce(ctx, torch.ones(1), phase="waiting for the dead")


def die_after_the_peer_reports(ctx):
    """Rank 1 reports a lost peer at once (gloo's words); rank 0 is killed 0.2 s later: the order CI once saw."""
    if ctx.rank == 0:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)
    raise RuntimeError("[gloo/transport/tcp/pair.cc] Read error: Connection reset by peer")


def hang_on_rank(ctx, bad):
    exchange(ctx, torch.ones(2), (ctx.rank + 1) % ctx.world_size, torch.empty(2),
             (ctx.rank - 1) % ctx.world_size, phase="first ring step")
    if ctx.rank == bad:
        time.sleep(600)
    all_reduce(ctx, torch.ones(1), phase="final sum")


def _fails(fn, n, *args, timeout=60.0):
    run(rank_and_size, n)
    pids = launch.warm_pids()[n]
    with pytest.raises(RankFailure) as info:
        run(fn, n, *args, timeout=timeout)
    assert alive_after(pids) == [], "a rank of the failed pool survived"
    assert n not in launch.warm_pids()
    assert run(rank_and_size, n) == [(r, n) for r in range(n)], "the next call must work"
    return info.value


def test_rank_that_raises_is_named_with_traceback_and_last_comm():
    err = _fails(raise_on_rank, 4, 2)
    assert err.rank == 2 and err.reason == "raised"
    assert "ValueError: deliberate failure on rank 2" in str(err)
    assert "raise_on_rank" in str(err)                       # the traceback names the function
    assert "warmup/all-gather" in err.last_comm              # last op it entered before raising
    assert "(completed)" in err.last_comm


def test_rank_that_exits_is_named_with_its_code():
    err = _fails(exit_on_rank, 3, 1, 7)
    assert err.rank == 1 and err.reason == "exited"
    assert "exited with code 7" in str(err)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_rank_killed_by_signal_is_named_with_the_signal(sig):
    err = _fails(signal_on_rank, 2, 0, sig)
    assert err.rank == 0 and err.reason == "signal"
    assert signal.Signals(sig).name in str(err)


def test_a_rank_killed_after_its_peer_reported_the_loss_is_named():
    """Three times: the pipe of the killed rank closes a moment before its status arrives, and code that took
    the readable pipe for a reply named rank 1 in 2 runs of 3."""
    for _ in range(3):
        err = _fails(die_after_the_peer_reports, 2)
        assert err.rank == 0 and err.reason == "signal" and "SIGKILL" in str(err)


def test_hung_rank_is_named_with_the_communication_others_wait_in():
    start = time.monotonic()
    err = _fails(hang_on_rank, 3, 1, timeout=3)
    assert time.monotonic() - start < 3 + 15              # timeout plus cleanup and a restart
    assert err.reason == "timeout" and err.rank == 1       # the one not waiting in a collective
    assert set(err.ranks) == {0, 1, 2}
    assert "first ring step" in err.last_comm and "(completed)" in err.last_comm
    assert "rank 0: waiting in all_reduce" in str(err) and "final sum" in str(err)


def test_unpicklable_result_is_reported_not_hung():
    err = _fails(lambda ctx: threading.Lock(), 2)
    assert err.reason == "raised" and "lock" in str(err).lower()


def test_twenty_fault_cycles_leave_no_process_port_or_thread(no_leftover_ranks):
    run(rank_and_size, 2)
    launch.shutdown()
    me = psutil.Process()
    threads, conns = me.num_threads(), len(me.net_connections(kind="inet"))
    before = descendants()
    for i in range(20):
        bad = i % 2
        with pytest.raises(RankFailure) as info:
            run(raise_on_rank, 2, bad, timeout=30)
        assert info.value.rank == bad
    launch.shutdown()
    time.sleep(0.2)
    assert descendants() - before == set()
    assert me.num_threads() == threads
    assert len(me.net_connections(kind="inet")) == conns


def test_clean_shutdown_is_never_a_failure():
    # Start, use and close pools repeatedly: every rank must exit with status 0.
    for _ in range(10):
        pool = Pool(3).start()
        assert pool.run(rank_and_size) == [(r, 3) for r in range(3)]
        assert pool.close() == [0, 0, 0]


# --- validation before any process starts ------------------------------------------------

@pytest.mark.parametrize("world_size, message", [
    (0, "world_size must be a positive integer"), (-2, "world_size must be a positive integer"),
    (1.5, "world_size must be a positive integer"), (True, "world_size must be a positive integer"),
    ("4", "world_size must be a positive integer"), (1000, "at most 32"),
])
def test_bad_world_size_rejected_before_start(world_size, message):
    launch.shutdown()
    before = descendants()
    with pytest.raises(ValueError, match=message):
        run(rank_and_size, world_size)
    assert descendants() - before == set() and launch.warm_pids() == {}


def test_bad_fn_and_arguments_rejected_before_start():
    launch.shutdown()
    with pytest.raises(TypeError, match="fn must be a callable"):
        run("not a function", 2)
    with pytest.raises(TypeError, match="cannot be called as fn"):
        run(rank_and_size, 2, "unexpected extra argument")
    with pytest.raises(TypeError, match="cannot be sent to the ranks"):
        run(lambda ctx, lock: 0, 2, threading.Lock())
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run(rank_and_size, 2, timeout=0)
    assert launch.warm_pids() == {}


def test_unguarded_script_and_stdin_programs_work(tmp_path):
    # Ranks must not re-run the parent's main program: a script without an
    # `if __name__ == "__main__"` guard, or a program read from stdin, would break.
    import subprocess
    import sys
    program = ("import wmdist, torch\n"
               "from wmdist.comm import all_reduce\n"
               "def f(ctx):\n"
               "    x = torch.ones(1) * ctx.rank\n"
               "    all_reduce(ctx, x)\n"
               "    return float(x)\n"
               "print('RESULT', wmdist.run(f, 3))\n")
    script = tmp_path / "unguarded.py"
    script.write_text(program)
    # Both programs at once: each is mostly a fresh interpreter importing torch, one core each.
    procs = [(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True), stdin)
             for cmd, stdin in (([sys.executable, str(script)], ""), ([sys.executable, "-"], program))]
    try:
        for proc, stdin in procs:
            out, err = proc.communicate(input=stdin, timeout=120)
            assert proc.returncode == 0, err
            assert out.count("RESULT") == 1 and "RESULT [3.0, 3.0, 3.0]" in out
    finally:
        for proc, _ in procs:
            proc.kill()
