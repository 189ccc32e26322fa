"""`wmdist verify` and `wmdist bench` stopped by a signal leave nothing running (issue 35 §1): once its ranks
are up, the command is sent SIGINT (`kill -INT`, or Ctrl-C) or SIGKILL, and every process below it, the
forkserver, the resource tracker and each rank, must be gone within a few seconds; a Ctrl-C in `wmdist verify`
says so in one line and exits 130 (§7: it printed a 40-line traceback). Through the CLI, as a
subprocess in a session of its own (which the test kills at the end, pass or fail)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import alive_after, patience


def _cmdline(p: psutil.Process) -> list[str]:
    """Its command line, or [] for a process that ended while we looked (a zombie has none to read)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _parent(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def _ranks_up(proc: subprocess.Popen) -> list[int]:
    """Every process below `proc` once some rank runs (a child of its forkserver); [] if it never did."""
    deadline = time.monotonic() + patience(120)
    while time.monotonic() < deadline and proc.poll() is None:
        below = psutil.Process(proc.pid).children(recursive=True)
        servers = {p.pid for p in below if "forkserver" in " ".join(_cmdline(p))}
        if any(_parent(p) in servers for p in below):
            return [p.pid for p in below]
        time.sleep(0.2)
    return []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
@pytest.mark.parametrize("command", [["verify"], ["bench"]], ids=" ".join)
def test_a_signalled_command_leaves_no_rank_or_forkserver(command, sig):
    proc = subprocess.Popen([sys.executable, "-m", "wmdist", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    below: list[int] = []
    out = err = ""
    try:
        below = _ranks_up(proc)
        assert below, f"no ranks started: {proc.poll()}"
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=patience(60))
        left = alive_after(below, patience(10))
        named = []
        for pid in left:
            with contextlib.suppress(psutil.Error):
                named.append(" ".join(psutil.Process(pid).cmdline())[:120])
        assert not left, f"left running after {sig.name}: {named}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in below:                              # a rank in another session: killed by its pid
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    if command == ["verify"] and sig == signal.SIGINT:  # Ctrl-C: one line and status 130, not a 40-line traceback
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("left out: ")]
        assert "Traceback" not in err and len(lines) == 1, err[-3000:]
        assert lines[0].startswith("wmdist verify: interrupted in run ") and "nothing is reported" in lines[0], lines
        assert proc.returncode == 130 and out == "", (proc.returncode, out[-2000:])
