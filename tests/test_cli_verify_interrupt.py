"""Ctrl-C during `wmdist verify` says so in one line (issue 35 §7): it used to print a 40-line traceback,
though the command stops within a second and leaves nothing running. Through the CLI, as a subprocess in a
session of its own (killed at the end, pass or fail)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil

from conftest import alive_after, patience
from test_cli_signals import _ranks_up


def test_ctrl_c_during_verify_is_one_line_and_status_130():
    proc = subprocess.Popen([sys.executable, "-m", "wmdist", "verify"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    below: list[int] = []
    try:
        below = _ranks_up(proc)
        assert below, f"no ranks started: {proc.poll()}"
        os.kill(proc.pid, signal.SIGINT)                      # what Ctrl-C sends
        out, err = proc.communicate(timeout=patience(60))
        assert alive_after(below, patience(10)) == [], "a rank or the forkserver outlived the Ctrl-C"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in below:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("left out: ")]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("wmdist verify: interrupted in run ") and "nothing is reported" in lines[0], lines
    assert proc.returncode == 130 and out == "", (proc.returncode, out[-2000:])
