"""One real-browser smoke test: the course's panels render and answer in JupyterLab, in headless Chromium.

Everything else tests the panels by setting `.value` in Python (docs/widgets.md). This test
checks the part those tests cannot reach: the JupyterLab front end, ipywidgets' JavaScript
and the kernel round trip. It starts a throw-away JupyterLab server, opens a two-cell notebook
that shows ScalingPanel and MemoryPanel, and runs all cells. Then it presses a key on one slider
of each panel and waits for the summary that the kernel computes to show the text that the pure
model predicts for the new setting, and for the plot in the panel's Output to be redrawn.

It needs the Debian `chromium` package and the `playwright` Python package. Playwright's own
browser download (`playwright install`) is never used. If either is missing, the test is skipped.
When CI=true it fails instead, because CI installs both (.ci/run, the `test` extra).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from conftest import free_port
from wmdist.data_parallel.scaling import ScalingParams, scaling_curve
from wmdist.memory.footprint import MemoryConfig, format_bytes, per_rank_bytes

WAIT_S = 60                    # the bound on every single wait
MS = WAIT_S * 1000             # the same, for Playwright (which counts in ms; its expect() defaults to 5 s)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def _tools() -> tuple[str, object]:
    """(chromium path, playwright.sync_api.sync_playwright), or skip (fail under CI=true) naming what is missing."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [what for what, ok in (("the `chromium` executable on PATH (Debian: apt-get install chromium)",
                                      chromium),
                                     ("the `playwright` Python package (pip install -e '.[test]')",
                                      sync_playwright)) if not ok]
    if missing:
        reason = "real-browser test needs " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; CI=true, and CI installs both, so this is an error")
        pytest.skip(reason)
    return chromium, sync_playwright


def _write_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("from wmdist.data_parallel.panel import ScalingPanel\nScalingPanel()"),
                nbformat.v4.new_code_cell("from wmdist.memory.panel import MemoryPanel\nMemoryPanel()")]
    nbformat.write(nb, path)


def _write_settings(settings: Path) -> None:
    """Render every cell (no windowing) and keep news toasts out of the page."""
    files = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
             "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                 {"fetchNews": "false", "checkForUpdates": False}}
    for name, value in files.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))


def _wait_for_server(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "api/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"jupyter lab did not answer within {WAIT_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen | None, extra: list[psutil.Process]) -> None:
    """Stop the server (it shuts its kernels down), then kill whatever of its tree is still there.

    Process objects, not pids: psutil will not signal a pid that has been reused since.
    """
    procs = list(extra)
    if proc is not None:
        try:
            procs += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)         # jupyter's clean stop: shuts the kernels down, then exits
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _alive_descendants() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


_PLOT_JS = """([out, old]) => {
    const imgs = out.querySelectorAll('img');
    if (imgs.length !== 1) return false;
    const src = imgs[0].getAttribute('src');
    return src !== old && imgs[0].complete && imgs[0].naturalWidth > 100 ? src : false;
}"""


def _plot(page, panel, other_than: str | None = None) -> str:
    """Wait until the panel's Output widget shows one loaded plot image, other than `other_than`; its src."""
    out = panel.locator(".widget-output").first
    out.wait_for(state="attached", timeout=MS)
    return page.wait_for_function(_PLOT_JS, arg=[out.element_handle(), other_than], timeout=MS).json_value()


# The texts the kernel must show after one ArrowRight, computed here by the same pure models.

def _allreduce_expected(n: int) -> str:
    at = scaling_curve(ScalingParams(max_workers=n)).at(n)
    return f"At N = {n}: all-reduce T = {at['allreduce']:.3g} s"


def _memory_expected(log10_params: float) -> tuple[str, str]:
    total = per_rank_bytes(MemoryConfig(params=int(round(10 ** log10_params))))["total"]
    return f"Total {format_bytes(total)}", f"{total:,}"


def test_panels_render_and_answer_in_a_real_browser(tmp_path):
    chromium, sync_playwright = _tools()
    from playwright.sync_api import expect

    root, settings, workspaces = tmp_path / "root", tmp_path / "settings", tmp_path / "workspaces"
    for d in (root, settings, workspaces, tmp_path / "config", tmp_path / "data", tmp_path / "runtime"):
        d.mkdir()
    _write_notebook(root / "panels.ipynb")
    _write_settings(settings)
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND",)}   # the kernel must use the inline backend
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(workspaces))
    log = tmp_path / "jupyter.log"
    before = _alive_descendants()
    proc, kernels = None, []
    try:
        with open(log, "w") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                 "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--allow-root",
                 "--LabApp.expose_app_in_browser=True", f"--ServerApp.root_dir={root}",
                 f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workspaces}",
                 "--ServerApp.terminals_enabled=False"],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=root)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
                                         timeout=MS)   # while the server starts
            page = None
            try:
                _wait_for_server(proc, base, log)
                page = browser.new_page(viewport={"width": 1600, "height": 2200})
                page.set_default_timeout(MS)
                page.goto(base + "lab/tree/panels.ipynb", timeout=MS)
                page.wait_for_function(
                    "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                    " const k = w && w.sessionContext && w.sessionContext.session"
                    "   && w.sessionContext.session.kernel;"
                    " return !!k && w.context.path === 'panels.ipynb' && k.status === 'idle'; }",
                    timeout=MS)
                kernels = psutil.Process(proc.pid).children(recursive=True)   # killed in the end if still alive
                # Not awaited here: the command's promise ends when every cell has run; the bounded waits below
                # wait for what the cells show instead.
                page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

                cells = page.locator(".jp-Notebook .jp-CodeCell")
                expect(cells).to_have_count(2, timeout=MS)
                allreduce, memory = cells.nth(0), cells.nth(1)
                allreduce_summary = allreduce.locator(".widget-html-content", has_text="At N =")
                memory_summary = memory.locator(".widget-html-content", has_text="Fullest rank")

                # Both panels rendered from the kernel: the default summaries and a plot in each Output.
                expect(allreduce_summary).to_contain_text(_allreduce_expected(32), timeout=MS)
                expect(memory_summary).to_contain_text(_memory_expected(9.0)[0], timeout=MS)
                allreduce_plot, memory_plot = _plot(page, allreduce), _plot(page, memory)

                # ScalingPanel: "N max" 32 -> 33 with the keyboard on the noUi handle. Wait for the
                # expected text itself: a reply computed for an intermediate value could come first.
                slider = allreduce.locator(".widget-slider", has_text="N max")
                slider.locator(".noUi-handle").press("ArrowRight")
                expect(slider).to_contain_text("33", timeout=MS)
                expect(allreduce_summary).to_contain_text(_allreduce_expected(33), timeout=MS)
                _plot(page, allreduce, other_than=allreduce_plot)      # redrawn after the summary

                # MemoryPanel: "parameters P" 10^9 -> 10^9.1 (the log slider's step is 0.1 in the exponent).
                memory.locator(".widget-slider", has_text="parameters P").locator(".noUi-handle").press("ArrowRight")
                total_text, total_bytes = _memory_expected(9.1)
                expect(memory_summary).to_contain_text(total_text, timeout=MS)
                expect(memory_summary).to_contain_text(total_bytes, timeout=MS)
                _plot(page, memory, other_than=memory_plot)
                page.screenshot(path=str(tmp_path / "panels.png"))
            except Exception:
                try:                                 # what the page showed when a wait ran out
                    page.screenshot(path=str(tmp_path / "failure.png"), timeout=10_000)
                    print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
                except Exception:
                    pass
                print(f"server log: {log}")
                raise
            finally:
                browser.close()
    finally:
        _stop(proc, kernels)

    deadline = time.monotonic() + 15
    while (left := _alive_descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:                                         # report them, but do not leave them running
        names = {}
        for pid in left:
            try:
                p = psutil.Process(pid)
                names[pid] = " ".join(p.cmdline())[:200]
                p.kill()
            except psutil.NoSuchProcess:
                pass
        raise AssertionError(f"processes left behind: {names}")
