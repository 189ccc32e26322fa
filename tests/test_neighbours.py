"""Warm pools as one machine's budget (runtime/pool_budget.py, warm.py), through `wmdist.run` in real processes:
a process starting a pool closes its neighbours' idle pools and then their forkserver, never a pool mid-call and
never a pool of another neighbourhood; an idle pool closes by itself; a restarted pool says so, once."""
from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import alive, alive_after
from wmdist.runtime import pool_budget

REPO = Path(__file__).resolve().parents[1]

# One process with warm pools: it evaluates one expression per line of stdin and answers one JSON line.
DRIVER = r'''
import json, os, sys, time
from multiprocessing import forkserver
import wmdist

def work(ctx, marker=None, release=None):
    """A rank: say it is in the call (marker), wait until the test releases it, return its pid."""
    if marker:
        with open(f"{marker}.{ctx.rank}", "w") as f:
            f.write(str(os.getpid()))
    deadline = time.monotonic() + 300
    while release and not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.getpid()

def state():
    from wmdist.runtime import warm_pids
    server = getattr(forkserver, "_forkserver", None)
    return {"pools": {str(n): p for n, p in warm_pids().items()}, "forkserver": getattr(server, "_forkserver_pid", None)}

print(json.dumps({"ok": os.getpid()}), flush=True)
for line in sys.stdin:
    try:
        print(json.dumps({"ok": eval(line)}), flush=True)
    except BaseException as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
'''
RESTART = "wmdist: starting the"
NO_POOLS = {"pools": {}, "forkserver": None}


class Neighbour:
    """A driver process in neighbourhood `hood` (None: in none), its stderr kept in a file."""

    def __init__(self, tmp: Path, label: str, hood: str | None, **env: str):
        self.stderr_path = tmp / f"{label}.stderr"
        environ = {k: v for k, v in os.environ.items()
                   if k not in (pool_budget.NEIGHBOURHOOD_VARIABLE, pool_budget.IDLE_VARIABLE)}
        environ.update({pool_budget.NEIGHBOURHOOD_VARIABLE: hood} if hood else {}, **env)
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=environ, cwd=REPO)
        self._lines: queue.Queue[str] = queue.Queue()
        self.notes: list[str] = []
        threading.Thread(target=lambda: [self._lines.put(line) for line in self.proc.stdout], daemon=True).start()
        self.pid = self.read()

    def send(self, expression: str) -> None:
        self.proc.stdin.write(expression + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 240):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no answer within {timeout} s; stderr:\n{self.stderr()}") from None
            if not line.startswith("{"):
                self.notes.append(line.rstrip("\n"))       # what wmdist printed on stdout between answers
                continue
            answer = json.loads(line)
            break
        assert "ok" in answer, f"{answer['error']}\nstderr:\n{self.stderr()}"
        return answer["ok"]

    def call(self, expression: str):
        self.send(expression)
        return self.read()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def restarts(self) -> list[str]:
        """The restart notes, read from stdout; one on stderr (where JupyterLab shows a red box) fails the test."""
        on_stderr = [line for line in self.stderr().splitlines() if line.startswith(RESTART)]
        assert not on_stderr, f"a restart note went to stderr: {on_stderr}"
        return [line for line in self.notes if line.startswith(RESTART)]

    def processes(self) -> list[int]:
        """This driver's ranks and forkserver, from its own account."""
        state = self.call("state()")
        return [pid for pids in state["pools"].values() for pid in pids] + [state["forkserver"]]

    def close(self) -> None:
        if self.proc.stdin.closed:
            return
        below = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)] if alive([self.proc.pid]) else []
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for pid in alive_after(below, 10):
            os.kill(pid, 9)


@pytest.fixture
def start(tmp_path):
    """start(label, hood, **env) -> a Neighbour; all closed at the end."""
    started: list[Neighbour] = []

    def make(label: str, hood: str | None, **env: str) -> Neighbour:
        started.append(Neighbour(tmp_path, label, hood, **env))
        return started[-1]
    yield make
    for n in started:
        n.close()


@pytest.fixture
def hood():
    """A neighbourhood of this test alone (others running tests at the same time have their own)."""
    return f"test-{uuid.uuid4().hex[:12]}"


def test_a_new_pool_closes_idle_neighbours_but_not_other_neighbourhoods(start, hood):
    a = start("a", hood)
    other, alone = start("other", hood + "-y"), start("alone", None)
    for n in (a, other, alone):
        assert len(n.call("wmdist.run(work, 2)")) == 2
    a_processes = a.processes()
    untouched = {n: n.call("state()") for n in (other, alone)}

    b = start("b", hood)
    assert len(b.call("wmdist.run(work, 2)")) == 2
    assert alive_after(a_processes, 10) == [], "A's idle ranks and forkserver outlived B's pool start"
    assert a.call("state()") == NO_POOLS
    for n, before in untouched.items():                 # another neighbourhood, and none: nobody asked them
        assert n.call("state()") == before
        assert alive(n.processes()) == n.processes()

    again = a.call("wmdist.run(work, 2)")
    assert not set(again) & set(a_processes) and alive(again) == again
    assert a.call("wmdist.run(work, 2)") == again        # warm again: no second restart
    lines = a.restarts()
    assert len(lines) == 1 and "2-rank pool again" in lines[0] and "another notebook" in lines[0], (a.notes, a.stderr())
    assert b.restarts() == [] and other.restarts() == [] and alone.restarts() == []


def test_a_pool_in_the_middle_of_a_call_is_kept_and_its_idle_sibling_closed(start, hood, tmp_path):
    a = start("a", hood)
    one = a.call("wmdist.run(work, 1)")                  # idle while the 2-rank call below runs
    marker, release = tmp_path / "in-call", tmp_path / "release"
    a.send(f"wmdist.run(work, 2, marker={str(marker)!r}, release={str(release)!r}, timeout=600)")
    in_call = [Path(f"{marker}.{r}") for r in (0, 1)]
    for path in in_call:
        assert _appears(path, 240), f"a rank did not reach the call; stderr:\n{a.stderr()}"
    two = [int(p.read_text()) for p in in_call]
    forkserver = psutil.Process(two[0]).parent().pid

    b = start("b", hood)
    assert len(b.call("wmdist.run(work, 2)")) == 2
    assert alive_after(one, 10) == [], "A's idle 1-rank pool outlived B's pool start"
    assert alive(two + [forkserver]) == two + [forkserver], "A's pool mid-call (or its forkserver) was closed"
    release.touch()
    assert a.read() == two                               # the call finished on the ranks it started on
    assert a.call("state()") == {"pools": {"2": two}, "forkserver": forkserver}
    assert a.restarts() == []


def test_an_idle_pool_closes_by_itself_and_says_so_when_it_starts_again(start, hood):
    a = start("a", hood, WMDIST_POOL_IDLE_S="1")
    first = a.call("wmdist.run(work, 2)")
    processes = a.processes()
    own_socket = Path(pool_budget.directory(hood)) / f"{a.pid}.sock"
    assert own_socket.exists()
    assert alive_after(processes, 60) == [], "the pool idle for 1 s (WMDIST_POOL_IDLE_S=1) did not close"
    assert a.call("state()") == NO_POOLS and not own_socket.exists()
    again = a.call("wmdist.run(work, 2)")
    assert not set(again) & set(first)
    lines = a.restarts()
    assert len(lines) == 1 and "2-rank pool again" in lines[0], (a.notes, a.stderr())
    assert "after 1 s idle" in lines[0], lines[0]        # the idle time it was given, not "0 min"


BAD_IDLE = r'''
import json, os, psutil
import wmdist.runtime, wmdist.registry.demos                 # importing must not depend on the variable
out = {}
for raw in ["abc", "0", "-1", "inf", "nan", " "]:
    os.environ["WMDIST_POOL_IDLE_S"] = raw
    try:
        out[raw] = ["ok", wmdist.run(lambda ctx: 1, 1)]
    except ValueError as exc:
        out[raw] = ["ValueError", str(exc)]
out["children"] = len(psutil.Process().children(recursive=True))
os.environ["WMDIST_POOL_IDLE_S"] = "30"
out["fixed"] = wmdist.run(lambda ctx: 1, 1)
print(json.dumps(out))
'''


@pytest.mark.parametrize("hooded", [True, False], ids=["in-a-neighbourhood", "in-none"])
def test_a_bad_idle_time_is_refused_by_name_at_the_first_call(hood, hooded):
    env = {k: v for k, v in os.environ.items() if k != pool_budget.NEIGHBOURHOOD_VARIABLE}
    env.update({pool_budget.IDLE_VARIABLE: "abc", **({pool_budget.NEIGHBOURHOOD_VARIABLE: hood} if hooded else {})})
    done = subprocess.run([sys.executable, "-c", BAD_IDLE], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    for raw in ["abc", "0", "-1", "inf", "nan", " "]:
        kind, message = out[raw]
        assert kind == "ValueError" and "WMDIST_POOL_IDLE_S" in message and repr(raw) in message, (raw, out[raw])
    assert out["children"] == 0, "a process was started for a refused value"
    assert out["fixed"] == [1]


def test_a_dead_neighbours_socket_is_removed_without_asking(start, hood):
    folder = Path(pool_budget.directory(hood))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    assert not alive([dead])
    # A socket named for the dead pid that still accepts connections (this test holds it): a neighbour that
    # asked it would connect and then wait for an answer that never comes.
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.bind(str(folder / f"{dead}.sock"))
    held.listen(8)
    (folder / "not-a-pid.sock").touch()                  # not a neighbour's: left alone
    try:
        b = start("b", hood)
        assert b.call("wmdist.run(work, 1)") and b.restarts() == []
        assert not (folder / f"{dead}.sock").exists()
        held.setblocking(False)
        with pytest.raises(BlockingIOError):
            held.accept()                                # nobody connected to it
        assert (folder / "not-a-pid.sock").exists()
        own = folder / f"{b.pid}.sock"
        assert own.exists()                              # B listens while it has a pool ...
        b.close()
        assert not own.exists()                          # ... and removes its socket when it exits
    finally:
        held.close()


def _appears(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_a_neighbourhood_too_long_to_listen_in_keeps_its_pools_and_says_so():
    """A name whose socket path passes the Unix limit (108 bytes) does not break `wmdist.run`: the process keeps
    its pools as if it had no neighbours, and one line on stderr says why."""
    env = {**os.environ, pool_budget.NEIGHBOURHOOD_VARIABLE: "n" * 120}
    done = subprocess.run([sys.executable, "-c", "import wmdist; print(wmdist.run(lambda ctx: ctx.rank, 2))"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[0, 1]", done.stderr
    assert "not sharing warm ranks with the neighbourhood" in done.stderr and "too long" in done.stderr, done.stderr
