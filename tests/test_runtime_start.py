"""Starting pools: from several threads at once, ranks never re-run the user's main program
(issue 19, Medium 3); Ctrl-C and the call's timeout end a slow first start, and a call that kills the
forkserver is told so and the next call recovers (issue 24, section 5)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import patience

RUNS = 20 if os.environ.get("WMDIST_STRESS") == "1" else 1      # the 20 in a row: WMDIST_STRESS=1

# Three threads make their first run at N = 1, 2, 3 at once. Every time the top of the program runs it
# appends a line to a file: the parent's run is the only one allowed.
PROGRAM = """\
import os, sys, threading
with open(sys.argv[1], "a") as f:
    f.write(f"{{__name__}} {{os.getpid()}}\\n")
import wmdist

def call(n, out):
    out[n] = wmdist.run(lambda ctx: ctx.rank, n, timeout=120)

def main():
    out = {{}}
    threads = [threading.Thread(target=call, args=(n, out)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT", sorted(out.items()))

{entry}
"""


@pytest.mark.parametrize("entry", ["main()", "if __name__ == '__main__':\n    main()"], ids=["unguarded", "guarded"])
def test_three_threads_starting_pools_at_once_never_rerun_main(tmp_path, entry):
    script = tmp_path / "threads.py"
    script.write_text(PROGRAM.format(entry=entry))
    for attempt in range(RUNS):
        log = tmp_path / f"top-{attempt}.log"
        proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "RESULT [(1, [0]), (2, [0, 1]), (3, [0, 1, 2])]" in proc.stdout, proc.stdout + proc.stderr[-3000:]
        tops = log.read_text().splitlines()
        assert len(tops) == 1 and tops[0].startswith("__main__ "), f"run {attempt}: main ran again: {tops}"


# A first pool start made slow on purpose: the forkserver's preload sleeps 30 s before torch's ranks can start.
# {prelude} runs before wmdist is imported (a test may slow the forkserver's fork down there).
SLOW_START = """\
import time
{prelude}
import wmdist.runtime.start as start
start._PRELOAD.append("slow_preload")
import wmdist
from wmdist.runtime import RankFailure
print("go", flush=True)
began = time.monotonic()
try:
    wmdist.run(lambda ctx: ctx.rank, 2{timeout})
    print("RETURNED", time.monotonic() - began, flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", time.time(), flush=True)
except RankFailure as err:
    print("FAILED", time.monotonic() - began, err.reason, str(err).replace(chr(10), " "), flush=True)
"""
PRELOAD_SLEEPS_S = 30
# The preload says where it is: its pid (the forkserver's) once it has begun, "done" once its sleep is over.
SLOW_PRELOAD = f"""\
import os, pathlib, time
here = pathlib.Path(__file__).parent
(here / "preload.tmp").write_text(str(os.getpid()))
(here / "preload.tmp").rename(here / "preload.pid")
time.sleep({PRELOAD_SLEEPS_S})
(here / "preload.done").write_text("")
"""
# The fork and exec of the forkserver made 3 s long, as a loaded machine can make it (multiprocessing's own
# spawn, wrapped before wmdist wraps it in turn); the parent says when it is inside.
SLOW_FORK = """\
import multiprocessing.util as util
_spawn = util.spawnv_passfds
def slow_spawn(path, args, passfds):
    if "forkserver" in args[-1]:
        print("FORKING", flush=True)
        time.sleep(3)
    return _spawn(path, args, passfds)
util.spawnv_passfds = slow_spawn
"""


def slow_first_start(tmp_path, timeout: str, prelude: str = "") -> subprocess.Popen:
    (tmp_path / "slow_preload.py").write_text(SLOW_PRELOAD)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))   # the forkserver's too
    proc = subprocess.Popen([sys.executable, "-c", SLOW_START.format(timeout=timeout, prelude=prelude)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path})
    assert proc.stdout.readline() == "go\n", proc.communicate()[1][-3000:]
    return proc


def in_preload(tmp_path, proc: subprocess.Popen, within: float = 120) -> int:
    """The forkserver's pid, once it is inside its (slow) preload: a state waited for, not a guessed delay.
    The bound is generous and only ends a broken start's wait."""
    deadline = time.monotonic() + within
    while not (tmp_path / "preload.pid").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the forkserver never reached its preload"
        time.sleep(0.05)
    return int((tmp_path / "preload.pid").read_text())


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    """Its output, once it has exited and its whole session is killed (the forkserver still sleeping in its
    preload holds the output pipes open)."""
    try:
        proc.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate(timeout=30)


def interrupted(tmp_path, out: str, err: str) -> None:
    """The call raised KeyboardInterrupt while the forkserver was still in its preload.

    A causal bound, not a wall time: had Ctrl-C waited for the forkserver's imports, or been lost (the call
    then returns once they end), the preload would have finished its 30 s first and written "done"."""
    assert any(line.startswith("INTERRUPTED") for line in out.splitlines()), out + err[-3000:]
    assert not (tmp_path / "preload.done").exists(), "Ctrl-C waited for the forkserver's imports"


def test_ctrl_c_during_the_first_pool_start_acts_at_once(tmp_path):
    # Jupyter's Stop and a terminal's Ctrl-C: SIGINT to the whole process group, forkserver included.
    proc = slow_first_start(tmp_path, "")
    server = in_preload(tmp_path, proc)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=120)
        survived = psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE
    finally:
        out, err = finish(proc)
    interrupted(tmp_path, out, err)
    assert survived, "the forkserver died of the Ctrl-C in the middle of its imports"
    assert "Traceback" not in err, err[-3000:]


def test_a_ctrl_c_while_the_forkserver_is_forked_is_not_lost(tmp_path):
    # The forkserver starts deaf to Ctrl-C; the parent used to ignore SIGINT for that fork, and so lost a Ctrl-C
    # arriving then (at load 10-23 a Ctrl-C a second into the call was lost and it returned 53 s later).
    proc = slow_first_start(tmp_path, "", prelude=SLOW_FORK)
    try:
        assert proc.stdout.readline() == "FORKING\n"
        proc.send_signal(signal.SIGINT)
    finally:
        out, err = finish(proc)
    interrupted(tmp_path, out, err)


def test_a_first_call_whose_pool_start_outlasts_its_timeout_fails_saying_so(tmp_path):
    out, err = finish(slow_first_start(tmp_path, ", timeout=2"))
    assert "RETURNED" not in out, f"the start ignored the call's timeout: {out}"
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed, out + err[-3000:]
    _, seconds, reason, message = failed[0].split(" ", 3)
    assert reason == "start" and "the pool start took longer than the call's timeout of 2 s" in message
    assert "give the first call a larger timeout" in message
    assert float(seconds) < 15, "bounded by timeout=2, far below the 30 s start"


def kills_its_forkserver(ctx):
    if ctx.rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)          # a rank's parent is the forkserver
    time.sleep(5)                                     # the ranks die with it before they reply
    return ctx.rank


def test_a_call_that_kills_the_forkserver_is_told_so_and_later_calls_work():
    import wmdist
    from wmdist.runtime import RankFailure
    assert wmdist.run(lambda ctx: ctx.rank, 2) == [0, 1]
    with pytest.raises(RankFailure) as info:
        wmdist.run(kills_its_forkserver, 2, timeout=60)
    message = str(info.value)
    assert "exited with code 255" not in message, message       # what multiprocessing reports without it
    assert "with the forkserver that started the ranks" in message and "which has ended" in message
    for _ in range(2):                                          # a new forkserver, a new pool
        assert wmdist.run(lambda ctx: ctx.rank, 2, timeout=120) == [0, 1]


# A forkserver killed from outside (the OOM killer, a learner's `kill`), then the very next calls: one on the warm
# pool (whose ranks die with the forkserver a moment later) and one starting a pool of a new size.
KILLED_FORKSERVER = """\
import json, os, signal, sys, time
import wmdist
from multiprocessing import forkserver

def parent(ctx):
    time.sleep(1.0)                 # long enough for ranks doomed with their forkserver to die mid-call
    return os.getppid()

def kill_forkserver():
    pid = forkserver._forkserver._forkserver_pid
    os.kill(pid, signal.SIGKILL)
    return pid

out = []
for size in (3, 4):
    wmdist.run(parent, 2)                                   # a warm pool, and a live forkserver
    out.append(["warm", kill_forkserver(), wmdist.run(parent, 2, timeout=120)])
    out.append(["new", kill_forkserver(), wmdist.run(parent, size, timeout=120)])
print("RESULT", json.dumps(out))
"""


def test_the_call_right_after_the_forkserver_is_killed_runs_on_a_new_one():
    proc = subprocess.Popen([sys.executable, "-c", KILLED_FORKSERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)                 # whatever it left (nothing, when it passes)
        proc.communicate()
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, err[-3000:]
    rounds = json.loads(results[0].split(" ", 1)[1])
    assert [r[0] for r in rounds] == ["warm", "new"] * 2
    for what, killed, parents in rounds:
        assert len(set(parents)) == 1 and parents[0] != killed, f"{what}: ranks of the killed forkserver {killed}"


def test_a_temp_dir_too_deep_for_the_forkserver_socket_is_refused_before_any_process_starts(tmp_path):
    deep = tmp_path / ("d" * 40) / ("e" * 40)       # > 75 bytes: TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX > 107
    deep.mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", "import wmdist; wmdist.run(lambda ctx: ctx.rank, 2)"],
                         env={**os.environ, "TMPDIR": str(deep)}, capture_output=True, text=True,
                         timeout=patience(120))
    assert out.returncode == 1 and "ValueError" in out.stderr and "set TMPDIR to a shorter directory" in out.stderr, \
        out.stderr[-2000:]
    assert str(deep) in out.stderr and list(deep.iterdir()) == []     # named, and nothing was started under it
