"""The way in: `wmdist lab` serves the course, and CI runs the README's own two commands.

- `wmdist lab` starts a real JupyterLab (in a new session, from a folder that is not the
  checkout, so it must find the checkout's notebooks itself), prints one URL, and that URL
  answers 200; the server's root is the notebooks folder and it refuses a request without the
  printed token. The suite runs as root in CI, so there this also proves the root case.
- `.ci/run --print-commands` prints exactly the README's two commands, and .ci/run installs
  nothing else with pip nor sets pip's options behind the README's back.
- The torch pin is exact and names the same release as Binder's.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port
from wmdist import lab

REPO = Path(__file__).resolve().parents[1]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
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
    try:
        for line in server.stdout:
            lines.append(line)
            if "wmdist lab: open " in line:
                break
        # The server logs on: keep reading so a full pipe can never stall it.
        threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
        url = next((ln.split("wmdist lab: open ", 1)[1].strip() for ln in lines if "wmdist lab: open " in ln), "")
        assert url.startswith(f"http://localhost:{port}/lab/tree/00_start_here.ipynb?token="), lines
        token = url.rsplit("token=", 1)[1]
        assert re.search(r"torch \S+ \((the CPU build|a CUDA build)\)", "".join(lines)), lines   # names the build
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status, _ = _get(url)
            except OSError:
                status = None
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, f"no HTTP 200 at {url} within 120 s; the server said:\n{''.join(lines)}"
        status, body = _get(f"http://localhost:{port}/api/contents?content=1", token)
        assert status == 200
        names = {item["name"] for item in json.loads(body)["content"]}
        assert {"00_start_here.ipynb", "09_putting_it_together.ipynb"} <= names   # the notebooks folder is its root
        assert _get(f"http://localhost:{port}/api/contents")[0] == 403             # no token, no course
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_lab_adds_allow_root_only_for_root_and_never_wanders_to_another_port(tmp_path):
    as_root = lab.jupyter_command(tmp_path, 8900, root=True, browser=False, extra=["--ip", "0.0.0.0"])
    as_user = lab.jupyter_command(tmp_path, 8900, root=False, browser=True, extra=[])
    assert "--allow-root" in as_root and "--allow-root" not in as_user
    for cmd in (as_root, as_user):
        assert f"--ServerApp.root_dir={tmp_path}" in cmd and "--ServerApp.port=8900" in cmd
        assert "--ServerApp.port_retries=0" in cmd             # the printed URL is the one it serves
    assert as_root[-2:] == ["--ip", "0.0.0.0"] and "--ServerApp.open_browser=False" in as_root


def test_lab_without_the_notebooks_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        lab.find_notebooks(tmp_path)
    assert stop.value.code == 2
    assert "00_start_here.ipynb" in capsys.readouterr().err


def test_ci_runs_exactly_the_readme_commands():
    printed = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--print-commands"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.splitlines()
    assert len(printed) == 2
    open_course, run_tests = printed
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"```bash\n{open_course}\n```" in readme and f"```bash\n{run_tests}\n```" in readme
    assert open_course.endswith("&& wmdist lab") and run_tests.endswith("&& python -m pytest")
    for cmd in printed:      # fail fast on an unreachable index, and take the CPU build of torch
        assert "--retries 0" in cmd and "--extra-index-url https://download.pytorch.org/whl/cpu" in cmd
    script = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in script if "pip install" in ln or "PIP_" in ln], "CI installs or tunes pip itself"


def test_torch_pin_is_exact_and_is_binders():
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"torch([^"]*)"', pyproject)
    assert len(pins) == 1 and re.fullmatch(r"==\d+\.\d+\.\d+", pins[0]), pins   # a range would take a CUDA build
    binder = (REPO / "binder" / "requirements.txt").read_text()
    assert f"torch{pins[0]}+cpu" in binder.splitlines()
