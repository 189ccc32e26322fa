"""`wmdist lab` around its server, with a stand-in for JupyterLab (tests/fake_lab_server.py, started by
tests/lab_runner.py through the real CLI path) that refuses, then answers 503, then 200 when told:

- the address is printed once, and only after the server has answered it 200;
- a server that exits before it answers, or never answers 200 within the deadline, is one
  `wmdist lab: error:` line and status 1, with the server's own output above it and no address;
- a Ctrl-C to the process group (as a terminal sends it), a SIGTERM to `wmdist lab` alone, or a
  SIGKILL to it alone (Linux: PR_SET_PDEATHSIG) stops the server: exactly one stop request
  reaches it, and no process is left (checked by pid).

No wall-time assertions: every wait is a deadline scaled by the machine's load (conftest.patience),
and every process started here ends (finally).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import alive, free_port, patience
from wmdist.app import lab

RUNNER = Path(__file__).with_name("lab_runner.py")
OPEN = "wmdist lab: open "


class Lab:
    """One `wmdist lab` run with the fake server, in a session of its own, its output read as it comes."""

    def __init__(self, tmp_path: Path, *, delay: float = 1.0, refusals: int = 2, base_wait: float = 120.0,
                 release: Path | None = None):
        self.port = free_port()
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
        args = [str(self.port), str(delay), str(refusals), str(base_wait)] + ([str(release)] if release else [])
        self.proc = subprocess.Popen([sys.executable, str(RUNNER), *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, words: str, seconds: float) -> str:
        """The first line holding `words`, waiting up to patience(seconds); fails with the output if none comes."""
        deadline = time.monotonic() + patience(seconds)
        ended = None                        # when wmdist lab was first seen exited: its last lines may be in flight
        while time.monotonic() < deadline and (ended is None or time.monotonic() < ended + 2):
            found = [ln for ln in list(self.lines) if words in ln]
            if found:
                return found[0]
            if ended is None and self.proc.poll() is not None:
                ended = time.monotonic()
            time.sleep(0.1)
        pytest.fail(f"no {words!r} (wmdist lab's status: {self.proc.poll()}):\n{self.text()}")

    def server_pid(self) -> int:
        return int(self.wait_for("fake server: pid ", 120).split("pid ", 1)[1])

    def end(self, seconds: float = 60) -> int:
        """Wait for `wmdist lab` to exit (failing after patience(seconds)) and return its status."""
        try:
            return self.proc.wait(timeout=patience(seconds))
        except subprocess.TimeoutExpired:
            pytest.fail(f"wmdist lab still running {patience(seconds):.0f} s later:\n{self.text()}")

    def kill(self, server: int | None) -> None:
        """Finally: nothing of this run is left, whatever the test did."""
        for pid in alive([p for p in (server, self.proc.pid) if p]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=60)


def _status(url: str) -> int | str:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=60) as answer:
            return answer.status
    except OSError as err:
        return repr(err)


def _gone(pid: int, seconds: float) -> bool:
    """Whether process `pid` has ended (or is a zombie) within patience(seconds)."""
    deadline = time.monotonic() + patience(seconds)
    while alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive([pid])


def test_the_address_is_printed_once_and_only_after_it_answers_200(tmp_path):
    run, server = Lab(tmp_path, delay=1.0, refusals=2), None
    try:
        server = run.server_pid()
        url = run.wait_for(OPEN, 120).split(OPEN, 1)[1].strip()
        assert url.startswith(f"http://localhost:{run.port}/lab/tree/00_start_here.ipynb?token="), url
        assert _status(url) == 200                       # a click on it at once is answered
        lines = [ln.strip() for ln in run.lines]
        printed = next(i for i, ln in enumerate(lines) if ln.startswith(OPEN))
        assert "fake server: answering 200" in lines[:printed], run.text()   # the 200 went out before the line
        assert lines[:printed].count("fake server: answering 503") == 2, run.text()   # a 503 is not an answer
        os.killpg(run.proc.pid, signal.SIGINT)          # one Ctrl-C, to the group, as a terminal sends it
        assert run.end() == 0
        assert [ln for ln in run.lines if ln.startswith(OPEN)] == [f"{OPEN}{url}\n"]   # once
    finally:
        run.kill(server)


def test_a_server_that_exits_before_it_answers_is_an_error_with_its_output(tmp_path):
    run, server = Lab(tmp_path, refusals=-1), None
    try:
        server = run.server_pid()
        assert run.end() == 1
        text = run.text()
        assert "fake server: cannot start, the port is haunted\n" in text
        assert (f"wmdist lab: error: JupyterLab exited with status 3 before it answered at "
                f"http://localhost:{run.port}/lab/tree/00_start_here.ipynb (its output is above)\n") in text
        assert OPEN not in text and "token=" not in text.split("error:", 1)[1], text   # no address, no token
    finally:
        run.kill(server)


def test_a_server_that_never_answers_200_is_stopped_at_the_deadline(tmp_path):
    """Base 2 s on an idle machine (answer_wait stretches it by the load); the server answers only 503."""
    run, server = Lab(tmp_path, refusals=10**9, base_wait=2.0), None
    try:
        server = run.server_pid()
        assert run.end(120) == 1
        text = run.text()
        assert "wmdist lab: error: JupyterLab did not answer HTTP 200 at " in text, text
        assert "(last answer: 503); stopping it" in text and OPEN not in text, text
        assert text.count("fake server: SIGTERM") == 1 and _gone(server, 30), text
    finally:
        run.kill(server)


STOPS = {"a Ctrl-C to its process group": (True, signal.SIGINT),
         "SIGTERM to wmdist lab alone": (False, signal.SIGTERM),
         "SIGKILL to wmdist lab alone": (False, signal.SIGKILL)}


@pytest.mark.parametrize("how", list(STOPS))
def test_a_stop_reaches_the_server_once_and_leaves_no_process(tmp_path, how):
    group, number = STOPS[how]
    if number == signal.SIGKILL and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG, which ends the server of a killed wmdist lab, is Linux's")
    run, server = Lab(tmp_path), None
    try:
        server = run.server_pid()
        run.wait_for(OPEN, 120)
        (os.killpg if group else os.kill)(run.proc.pid, number)
        code = run.end()
        assert _gone(server, 60), f"the server (pid {server}) outlived wmdist lab after {how}:\n{run.text()}"
        time.sleep(0.5)                                   # let the reader take the server's last lines
        text = run.text()
        assert text.count("fake server: SIGTERM") == 1 and "fake server: SIGINT" not in text, text
        assert code == (-signal.SIGKILL if number == signal.SIGKILL else 0), text
    finally:
        run.kill(server)


def test_a_second_ctrl_c_while_it_stops_is_not_passed_on(tmp_path):
    """The server lingers after its first stop request until told (the file `release`), as JupyterLab does
    while it shuts its kernels down; a second stop request would run that clean-up twice."""
    release = tmp_path / "release"
    run, server = Lab(tmp_path, release=release), None
    try:
        server = run.server_pid()
        run.wait_for(OPEN, 120)
        os.killpg(run.proc.pid, signal.SIGINT)
        run.wait_for("fake server: SIGTERM", 60)         # stopping, and lingering
        os.killpg(run.proc.pid, signal.SIGINT)
        run.wait_for("wmdist lab: JupyterLab is stopping (it shuts its kernels down first)", 60)
        release.touch()
        assert run.end() == 0 and _gone(server, 60)
        assert run.text().count("fake server: SIGTERM") == 1 and "fake server: SIGINT" not in run.text(), run.text()
    finally:
        release.touch()
        run.kill(server)


def test_the_deadline_grows_with_the_load_per_core_up_to_8x():
    assert lab.answer_wait(120, load=0.0, cores=2) == 120          # idle: the base
    assert lab.answer_wait(120, load=3.0, cores=2) == 120 * 2.0    # 1.5 per core
    assert lab.answer_wait(120, load=100.0, cores=2) == 120 * 8    # capped
    assert lab.answer_wait(120, load=1.0, cores=0) == 120 * 1.5    # an unknown core count counts as one
