"""Shared test helpers: which processes are alive (none left behind, none started), one thread, torchrun,
patience for servers on a busy machine, and the session-end check that nothing the suite started still runs."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pids: list[int]) -> list[int]:
    """The pids among `pids` that still exist and are not zombies."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def alive_after(pids: list[int], seconds: float = 5.0) -> list[int]:
    """The pids among `pids` still alive after waiting up to `seconds` for them to end (a pool being replaced)."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def patience(seconds: float) -> float:
    """How long to wait for a server or kernel that takes `seconds` to answer on an idle machine: stretched by
    the load per core (one-minute load average / cores, counted from 1x at an idle machine up to 8x), because at
    load 10 to 23 on 2 cores a kernel took past 180 s to answer. A wait, never a judgement of speed."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return seconds * min(8.0, max(1.0, 1.0 + load / (os.cpu_count() or 1) - 0.5))


def descendants() -> set[int]:
    """Every live process below this one (forkserver, resource tracker and ranks)."""
    return set(alive([p.pid for p in psutil.Process().children(recursive=True)]))


@pytest.fixture
def short_tmp():
    """A fresh directory with a short path (under /tmp), removed afterwards: for a test that makes it a
    process's TMPDIR. The ranks' forkserver listens on a Unix socket at TMPDIR/pymp-X/listener-X, at most
    107 bytes, which pytest's tmp_path (its run counter, the xdist worker, the test's name) can outgrow."""
    path = tempfile.mkdtemp(prefix="wmt-", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def no_leftover_ranks():
    """Fail the test if it leaves a process behind once all pools are shut down."""
    from wmdist import runtime as launch

    launch.shutdown()
    before = descendants()
    yield
    launch.shutdown()
    extra = descendants() - before
    # The forkserver and resource tracker start once per interpreter and stay; they are not ranks.
    extra = {p for p in extra if "forkserver" not in " ".join(psutil.Process(p).cmdline())
             and "resource_tracker" not in " ".join(psutil.Process(p).cmdline())}
    assert not extra, f"processes left behind: {extra}"


@pytest.fixture
def no_processes(monkeypatch):
    """Fail the test the moment anything would start a rank or use a warm pool: for inputs that must be
    refused before any process starts (the one guard; patched on the classes, so it holds however a
    module imported `run`)."""
    from wmdist.runtime import Pool
    from wmdist.runtime.warm import WarmPools

    def started(*args, **kwargs):
        pytest.fail("a process was started (or a warm pool used) for an input that should have been refused first")
    monkeypatch.setattr(WarmPools, "run", started)
    monkeypatch.setattr(Pool, "start", started)


@pytest.fixture
def one_thread():
    """One intra-op thread in the test process, as in every rank: tiny matrices gain nothing from a
    second thread, and on a shared 2-core machine it only contends with the ranks."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torchrun_env() -> dict[str, str]:
    """This environment for a fresh torchrun job: gloo forced, one thread, the parent's torchrun variables dropped."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "WMDIST_BACKEND": "gloo"}


def torchrun_two_nodes(procs_per_node: int, argv: list[str], timeout: float = 300) -> list[tuple[int, str, str]]:
    """Run `torchrun ... argv` as two "nodes" on 127.0.0.1, both at once; (returncode, stdout, stderr) per node.

    The environment is torchrun_env()."""
    import subprocess
    import sys
    env = torchrun_env()
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                               "--nproc-per-node", str(procs_per_node), "--master-addr", "127.0.0.1",
                               "--master-port", str(port), *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for node in (0, 1)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def pytest_configure(config: pytest.Config) -> None:
    """Register tools/nbval_drift.py: under nbval, a stored picture the code no longer draws fails its cell.
    Mark this session's processes (SESSION_VARIABLE, inherited by xdist's workers and what they start)."""
    if not hasattr(config, "workerinput"):
        os.environ[SESSION_VARIABLE] = f"{os.getpid()}-{uuid.uuid4().hex}"    # a new mark, even inside a session
    import sys
    from pathlib import Path
    tools = str(Path(__file__).resolve().parents[1] / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import nbval_drift
    # what chapter 01 measures for chapter 09 (wmdist/base/measured.py) goes to this run's own file, not the home
    # folder of whoever runs the suite; the notebooks' kernels inherit it
    import tempfile
    os.environ.setdefault("WMDIST_MEASURED", os.path.join(tempfile.mkdtemp(prefix="wmdist-measured-"), "m.json"))
    if not config.pluginmanager.is_registered(nbval_drift):
        config.pluginmanager.register(nbval_drift, "wmdist-nbval-drift")
    # the notebooks' kernels wake late from every sleep: timing in a checked output fails
    import nbval_load
    if not config.pluginmanager.is_registered(nbval_load):
        config.pluginmanager.register(nbval_load, "wmdist-nbval-load")


SESSION_START = time.time()
LATENCY_TABLE = "build/browser/latency.txt"     # written by tests/test_browser.py::test_latency_table


def _latency_table(terminalreporter, config: pytest.Config) -> None:
    """Under xdist a worker's printout is not shown: the controller prints the panel latency table it wrote."""
    from pathlib import Path
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return                                       # a worker, or one process (the test printed it itself)
    path = Path(config.rootpath) / LATENCY_TABLE
    if path.exists() and path.stat().st_mtime >= SESSION_START:
        terminalreporter.write_sep("-", "panel latency, key press -> new picture (tests/test_browser.py)")
        terminalreporter.write_line(path.read_text().rstrip())


# -- the session-end check: nothing the suite started outlives it ------------------------------------------------
SESSION_VARIABLE = "WMDIST_TEST_SESSION"       # set by the controller (or the only process) for all it starts
LEFT_RUNNING = "wmdist_left_running"           # a worker's findings, sent to the controller in its workeroutput
# What is ending anyway (a kernel told to stop) gets this long, on idle. tests/test_procs_session_end.py runs
# pytest on tests that leak a sleeper (which never ends) and sets a short grace for those inner runs only.
END_GRACE_S = float(os.environ.get("WMDIST_TEST_END_GRACE_S", "15"))


def _described(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"pid {pid}: {' '.join(p.cmdline())[:200] or p.name()}"
    except psutil.Error:
        return f"pid {pid} (ended while being named)"


def _ends_with_this_process(pid: int) -> bool:
    """multiprocessing's forkserver and resource tracker of this interpreter: they end when it ends."""
    try:
        p = psutil.Process(pid)
        return p.ppid() == os.getpid() and any(w in " ".join(p.cmdline()) for w in ("forkserver", "resource_tracker"))
    except psutil.Error:
        return False


def _marked(mark: str) -> set[int]:
    """This user's processes whose environment carries this session's mark (found however they were
    re-parented: a zygote, a daemon), except this process and its ancestors."""
    needle = f"{SESSION_VARIABLE}={mark}".encode()
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = set()
    for p in psutil.process_iter():
        if p.pid in mine:
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(p.pid)
        except OSError:
            continue
    return found


def left_running() -> list[str]:
    """What this process started (its descendants; in the controller also every process carrying the session's
    mark) that is still alive after END_GRACE_S (stretched by the load), each named; those are then killed."""
    if "wmdist.runtime" in sys.modules:
        sys.modules["wmdist.runtime"].shutdown()          # warm pools close here, as they do at exit
    candidates = descendants()
    mark = os.environ.get(SESSION_VARIABLE)
    if mark and not os.environ.get("PYTEST_XDIST_WORKER"):
        candidates |= _marked(mark)
    candidates = {p for p in candidates if not _ends_with_this_process(p)}   # (not their children: ranks)
    still = alive_after(sorted(candidates), patience(END_GRACE_S))
    named = [_described(pid) for pid in still]
    for pid in still:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    return named


_FOUND = pytest.StashKey[list]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller keeps what each worker found left running."""
    found = getattr(node, "workeroutput", {}).get(LEFT_RUNNING, [])
    node.config.stash.setdefault(_FOUND, []).extend(found)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process the suite started is still alive at its end, naming it (issue 35 §1: a kernel
    left spinning for 45 minutes after a failed test skipped its clean-up). Under xdist each worker checks its
    own descendants and the controller, after the workers have ended, the session's marked processes."""
    config = session.config
    found = left_running()
    if hasattr(config, "workerinput"):
        config.workeroutput[LEFT_RUNNING] = found
        return
    found = config.stash.setdefault(_FOUND, []) + found
    config.stash[_FOUND] = found
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Under xdist a worker's printout is not shown: the controller prints the panel latency table it wrote.
    And, in the one process that reports, what was left running (pytest_sessionfinish)."""
    found = config.stash.get(_FOUND, [])
    if found and not hasattr(config, "workerinput"):
        terminalreporter.write_sep("=", "processes the suite started were still running at its end (now killed)",
                                   red=True)
        for line in found:
            terminalreporter.write_line(line)
    _latency_table(terminalreporter, config)
