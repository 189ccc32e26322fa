"""Shared test helpers: which processes are alive (none left behind, none started), one thread, torchrun."""
from __future__ import annotations

import socket

import time

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


def descendants() -> set[int]:
    """Every live process below this one (forkserver, resource tracker and ranks)."""
    return set(alive([p.pid for p in psutil.Process().children(recursive=True)]))


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
    """Register tools/nbval_drift.py: under nbval, a stored picture the code no longer draws fails its cell."""
    import sys
    from pathlib import Path
    tools = str(Path(__file__).resolve().parents[1] / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import nbval_drift
    # what chapter 01 measures for chapter 09 (wmdist/measured.py) goes to this run's own file, not the home
    # folder of whoever runs the suite; the notebooks' kernels inherit it
    import os
    import tempfile
    os.environ.setdefault("WMDIST_MEASURED", os.path.join(tempfile.mkdtemp(prefix="wmdist-measured-"), "m.json"))
    if not config.pluginmanager.is_registered(nbval_drift):
        config.pluginmanager.register(nbval_drift, "wmdist-nbval-drift")


SESSION_START = time.time()
LATENCY_TABLE = "build/browser/latency.txt"     # written by tests/test_browser.py::test_latency_table


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Under xdist a worker's printout is not shown: the controller prints the panel latency table it wrote."""
    from pathlib import Path
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return                                       # a worker, or one process (the test printed it itself)
    path = Path(config.rootpath) / LATENCY_TABLE
    if path.exists() and path.stat().st_mtime >= SESSION_START:
        terminalreporter.write_sep("-", "panel latency, key press -> new picture (tests/test_browser.py)")
        terminalreporter.write_line(path.read_text().rstrip())
