"""The session-end check of tests/conftest.py (issue 35 §1): a pytest run whose tests leave a process running
fails, naming that process, and ends it; a run that ends all it starts passes. Run as a pytest of its own (one
process, and under xdist with 2 workers, where the workers and the controller are separate processes), with this
suite's conftest loaded as a plugin."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import alive, alive_after, patience

TESTS = Path(__file__).resolve().parent
# The inner runs' grace for a process that is ending anyway: their leaked sleeper never ends, so the default
# 15 s (stretched by the load) would only be waited out, once per check (worker and controller).
INNER_GRACE_S = 1.0

LEAKS = '''
import os, subprocess, sys
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)  # leaked-by-test"]

def test_ends_what_it_starts():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    p.kill()
    p.wait()

def test_leaves_a_child():
    p = subprocess.Popen(SLEEPER)
    open(os.environ["PIDS"], "a").write(f"{p.pid}\\n")

def test_leaves_a_daemon():
    """Started through a process that exits at once: the sleeper is re-parented, no one's descendant."""
    start = ("import subprocess, sys; "       # the sleeper holds none of the pipes run() waits on
             "print(subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    out = subprocess.run([sys.executable, "-c", start, *SLEEPER], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    open(os.environ["PIDS"], "a").write(out)
'''


def _inner_run(tmp_path: Path, selection: str, *workers: str) -> tuple[subprocess.CompletedProcess, list[int]]:
    """pytest on LEAKS's tests matching `selection`; its output and the pids its tests left."""
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    pids = tmp_path / "pids"
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PIDS": str(pids), "WMDIST_TEST_END_GRACE_S": str(INNER_GRACE_S), "PYTHONPATH": path}
    env.pop("PYTEST_XDIST_WORKER", None)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:randomly", "-p",
                               "no:cacheprovider", "--rootdir", str(tmp_path), "-k", selection, *workers,
                               str(tmp_path / "test_leaks.py")], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=patience(240))
    finally:
        left = [int(n) for n in pids.read_text().split()] if pids.exists() else []
        for pid in alive(left):                         # whatever the check did, nothing of this test stays
            os.kill(pid, signal.SIGKILL)
    return done, left


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_run_that_ends_what_it_starts_passes(tmp_path, workers):
    done, _ = _inner_run(tmp_path, "ends_what", *workers)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "still running at its end" not in done.stdout


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one-process", "xdist"])
@pytest.mark.parametrize("leak", ["child", "daemon"])
def test_a_run_that_leaves_a_process_fails_naming_it_and_ends_it(tmp_path, workers, leak):
    done, left = _inner_run(tmp_path, f"ends_what or leaves_a_{leak}", *workers)
    assert len(left) == 1, (left, done.stdout[-3000:])
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout[-3000:]            # the tests passed; the check failed the run
    assert "processes the suite started were still running at its end (now killed)" in done.stdout
    named = [line for line in done.stdout.splitlines() if line.startswith(f"pid {left[0]}: ")]
    assert named and "leaked-by-test" in named[0], done.stdout[-3000:]
    assert alive_after(left, 10) == [], "the check named the process but left it running"
