"""The way in: `wmdist lab` serves the course, and CI runs the README's own two commands.

- `wmdist lab` starts a real JupyterLab (in a new session, from a folder that is not the
  checkout, so it must find the checkout's notebooks itself), prints one URL once it answers,
  so the first request after the line is answered 200; the server's root is the notebooks
  folder and it refuses a request without the printed token; its banner says one Ctrl-C, not
  "twice". The suite runs as root in CI, so there this also proves the root case.
- Before it starts anything: a busy --port, a missing notebooks folder or a bad argument is one
  `wmdist lab: error:` line (a pasted-in argument named, not echoed); it starts JupyterLab
  without importing torch. One Ctrl-C at a terminal stops it and its server (by pid).
  (tests/test_lab_server.py: the same around a stand-in server, for the cases JupyterLab
  cannot be made to show: a server that dies early or never answers, SIGKILL.)
- `.ci/run --print-commands` prints exactly the README's two commands, and .ci/run installs
  nothing else with pip nor sets pip's options behind the README's back.
- The torch pin is exact and names the same release as Binder's.
"""
from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import alive, free_port, patience
from wmdist.app import lab
from wmdist.app.cli import main

REPO = Path(__file__).resolve().parents[1]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_wmdist_lab_serves_chapter_00_at_the_url_it_prints(tmp_path):
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    env.pop("JUPYTER_TOKEN", None)
    server = subprocess.Popen([sys.executable, "-m", "wmdist", "lab", "--no-browser", "--port", str(port)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    lines: list[str] = []
    stop = threading.Timer(patience(240), os.kill, (server.pid, signal.SIGKILL))   # a lab that never answers
    try:
        stop.start()
        for line in server.stdout:
            lines.append(line)
            if "wmdist lab: open " in line:
                break
        # The server logs on: keep reading so a full pipe can never stall it.
        threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
        url = next((ln.split("wmdist lab: open ", 1)[1].strip() for ln in lines if "wmdist lab: open " in ln), "")
        assert url.startswith(f"http://localhost:{port}/lab/tree/00_start_here.ipynb?token="), lines
        token = url.rsplit("token=", 1)[1]
        banner = "".join(lines)
        assert re.search(r"torch \S+ \((the CPU build|a CUDA build)\)", banner), lines   # names the build
        try:
            status = _get(url)[0]               # the first try, at once: a learner clicks it as it appears
        except OSError as err:
            status = err
        assert status == 200, f"the printed {url} did not answer: {status}; the server said:\n{banner}"
        assert "twice to skip confirmation" not in banner and f"all kernels {lab.ONE_CTRL_C}" in banner, banner
        status, body = _get(f"http://localhost:{port}/api/contents?content=1", token)
        assert status == 200
        names = {item["name"] for item in json.loads(body)["content"]}
        assert {"00_start_here.ipynb", "09_putting_it_together.ipynb"} <= names   # the notebooks folder is its root
        assert _get(f"http://localhost:{port}/api/contents")[0] == 403             # no token, no course
        status, body = _get(f"http://localhost:{port}/api/kernelspecs", token)
        argv = json.loads(body)["kernelspecs"]["python3"]["spec"]["argv"]          # the notebooks' kernel is the
        assert status == 200 and argv[1:3] == ["-m", "wmdist.kernel"], argv       # sharing one (wmdist/kernel)
    finally:
        stop.cancel()
        os.kill(server.pid, signal.SIGTERM)      # wmdist lab passes it on to its server
        try:
            server.wait(timeout=patience(60))
        except subprocess.TimeoutExpired:
            server.kill()                        # and PR_SET_PDEATHSIG stops the server
            server.wait(timeout=60)


def test_lab_adds_allow_root_only_for_root_and_never_wanders_to_another_port(tmp_path):
    as_root = lab.jupyter_command(tmp_path, 8900, root=True, browser=False, extra=["--ip", "0.0.0.0"])
    as_user = lab.jupyter_command(tmp_path, 8900, root=False, browser=True, extra=[])
    assert "--allow-root" in as_root and "--allow-root" not in as_user
    for cmd in (as_root, as_user):
        assert f"--ServerApp.root_dir={tmp_path}" in cmd and "--ServerApp.port=8900" in cmd
        assert "--ServerApp.port_retries=0" in cmd             # the printed URL is the one it serves
    assert as_root[-2:] == ["--ip", "0.0.0.0"] and "--ServerApp.open_browser=False" in as_root


def _usage_error(args: list[str], capsys) -> str:
    """What `wmdist ARGS` prints on stderr, having exited with status 2 (in this process: the console script's main)."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_lab_without_the_notebooks_is_a_usage_error(tmp_path, capsys):
    err = _usage_error(["lab", "--notebooks", str(tmp_path)], capsys)
    assert err.startswith(f"wmdist lab: error: no 00_start_here.ipynb in {tmp_path}") and err.count("\n") == 1


def test_lab_errors_say_error_like_every_other_command(capsys):
    err = _usage_error(["lab", "--port", "70000"], capsys)
    assert err == "wmdist lab: error: --port must be in 1..65535, got 70000\n"
    assert _usage_error(["lab", "--port", "x"], capsys).startswith("wmdist lab: error: argument --port")


@pytest.mark.parametrize("args", [["lab", "--notebooks", "x" * 100_000], ["lab", "--port", "9" * 100_000],
                                  ["verify", "y" * 100_000], ["z" * 100_000]])
def test_an_argument_pasted_by_mistake_is_named_not_echoed(args, capsys):
    err = _usage_error(args, capsys)
    assert len(err) < 600 and "(100,000 characters)" in err and err.count("\n") == 1, err[:600]


def test_a_busy_port_is_refused_before_jupyterlab_starts(tmp_path):
    port = free_port()
    with socket.socket() as other:                # another program listens on the port asked for
        other.bind(("127.0.0.1", port))
        other.listen()
        done = subprocess.run([sys.executable, "-m", "wmdist", "lab", "--no-browser", "--port", str(port)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (f"wmdist lab: error: --port {port} is in use by another program; pass another port, "
                           "or leave --port out to take a free one\n")


def test_lab_starts_jupyterlab_without_importing_torch(tmp_path):
    """Its first lines come, and JupyterLab is started, without importing torch (seconds on a busy machine)."""
    probe = ("import sys\n"
             "from wmdist.app import lab\n"
             "lab.serve = lambda *a, **k: (print('torch imported:', 'torch' in sys.modules), 0)[1]\n"
             "from wmdist.app.cli import main\n"
             f"sys.exit(main(['lab', '--no-browser', '--port', '{free_port()}']))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wmdist lab: starting JupyterLab on port" in done.stdout and "torch imported: False" in done.stdout
    assert "wmdist lab: open" not in done.stdout, done.stdout       # only serve prints it, once the server answers


def test_one_ctrl_c_stops_wmdist_lab(tmp_path):
    """At a terminal JupyterLab answers a first Ctrl-C with "Shut down this Jupyter server (y/[n])?" and goes on
    serving after 5 s without an answer; `wmdist lab` stops at the first, and takes its server with it. The
    terminal is a pseudo-terminal here, the Ctrl-C a SIGINT to wmdist lab's process group, as a terminal sends it."""
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    terminal, tty = pty.openpty()
    server = subprocess.Popen([sys.executable, "-m", "wmdist", "lab", "--no-browser", "--port", str(port)],
                              cwd=tmp_path, env=env, stdin=tty, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    os.close(tty)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
    jupyter: list[int] = []
    try:
        deadline = time.monotonic() + patience(120)
        while time.monotonic() < deadline and server.poll() is None and "wmdist lab: open " not in "".join(lines):
            time.sleep(0.5)
        assert "wmdist lab: open " in "".join(lines), f"JupyterLab did not answer on {port}:\n{''.join(lines)}"
        jupyter = [p.pid for p in psutil.Process(server.pid).children()]
        assert len(jupyter) == 1 and _status(port) is not None, (jupyter, "".join(lines))   # it answers
        os.killpg(server.pid, signal.SIGINT)
        try:
            code = server.wait(timeout=patience(30))    # it stops in about a second; JupyterLab alone never does
        except subprocess.TimeoutExpired:
            pytest.fail(f"still serving {patience(30):.0f} s after one Ctrl-C:\n{''.join(lines[-5:])}")
        assert code == 0 and _status(port) is None and not alive(jupyter), (jupyter, "".join(lines[-5:]))
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=patience(60))
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=60)
        for pid in alive(jupyter):
            os.kill(pid, signal.SIGKILL)
        os.close(terminal)


def _status(port: int) -> int | None:
    """The HTTP status a server on `port` answers with, None when nothing answers."""
    try:
        return _get(f"http://127.0.0.1:{port}/api/status")[0]
    except OSError:
        return None


def test_ci_runs_exactly_the_readme_commands():
    printed = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--print-commands"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.splitlines()
    assert len(printed) == 2
    open_course, run_tests = printed
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"```bash\n{open_course}\n```" in readme and f"```bash\n{run_tests}\n```" in readme
    assert open_course.endswith("&& wmdist lab") and run_tests.endswith("&& python -m pytest -n 2 --dist loadfile")
    for cmd in printed:      # fail fast on an unreachable index, and take the CPU build of torch
        # PIP_RETRIES in the environment, not --retries: the editable build's own pip process (build
        # isolation, fetching hatchling) inherits the environment and not the options.
        assert cmd.startswith("PIP_RETRIES=0 pip install ") and "--retries" not in cmd
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in cmd
    script = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in script if "pip install" in ln or "PIP_" in ln], "CI installs or tunes pip itself"


def test_torch_pin_is_exact_and_is_binders():
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"torch([^"]*)"', pyproject)
    assert len(pins) == 1 and re.fullmatch(r"==\d+\.\d+\.\d+", pins[0]), pins   # a range would take a CUDA build
    binder = (REPO / "binder" / "requirements.txt").read_text()
    assert f"torch{pins[0]}+cpu" in binder.splitlines()
