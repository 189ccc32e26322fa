"""The course's panels in a real browser: every panel of every notebook, in JupyterLab, in headless Chromium.

Everything else tests the panels by setting `.value` in Python (docs/widgets.md). These tests
check what those cannot reach: the JupyterLab front end, ipywidgets' JavaScript and the kernel
round trip. One throw-away JupyterLab server serves copies of the course's notebooks (the
repository's files are never opened for writing).

- `test_every_panel_of_every_notebook`: each notebook that shows a panel runs all its cells
  (none may error). In a laptop's 1366 x 768 window, every panel is at most 700 px tall, its
  figure is shown at its own pixel size (never shrunk, so its text stays legible), no
  readout, label, status or summary text is clipped, and every slider in every control tab has
  a track of at least 120 px (each tab is clicked). On every panel a slider moves and both
  the figure and the numbers change; the key press -> new picture latency of a few presses is
  measured in page time and printed as a table (not asserted: the machine is shared); every
  view button shows its own picture; the "run it" button shows progress and then the measured
  overlay. On the first panels of chapters 00 and 01 the slider is a known one, and the summary
  the kernel computes must show the text the pure model predicts before and after the key
  press. A screenshot of each panel is saved as an artifact under build/browser/, and the
  latency table as build/browser/latency.txt. The browser console, from the page's first load
  on, never says "Comm not found" (a comm_close the page's kernel connection cannot place).
- In the same test, every notebook with a prediction (`answer_with`) asks first: after Run All,
  neither the measured value nor the formula's value of any prediction is anywhere in the
  notebook's text (cells, outputs, widgets), and neither the reveal's formula nor its why is in
  the text above the prediction's buttons (every cell's source and output as the page shows
  them); Check with an empty box and with "abc" says why and measures nothing; Show me answers;
  the measured value as the reveal prints it, typed as a guess, is "exactly right". A `Choice`, answered
  by a name, is given away by a sentence naming it as the leader ("dp sends the most bytes"): none is
  above its buttons (test_predict_sources.answer_phrase), and the values its reveal lists (3+ digits)
  are nowhere on the page after Run All.

Needs the Debian `chromium` package and the `playwright` Python package; Playwright's own browser
download (`playwright install`) is never used. If either is missing the tests are skipped, and
fail instead when CI=true, because CI installs both (.ci/run, the `test` extra).
"""
from __future__ import annotations

import json
import os
import re
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

from conftest import free_port, patience
from test_predict_sources import WHY_WORDS, answer_phrase, stated as _stated
from wmdist.costs.units import seconds
from wmdist.data_parallel.scaling import ScalingParams, scaling_curve
from wmdist.memory.footprint import format_bytes, per_rank_bytes
from wmdist.memory.panel import teaching_config

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "build" / "browser"
WAIT_S = 120                   # the bound on every single wait
MS = WAIT_S * 1000             # the same, for Playwright (which counts in ms)
RUN_ALL_S = 600                # a whole notebook, on a loaded 2-core machine
VIEWPORT = {"width": 1366, "height": 768}     # a laptop screen
MAX_PANEL_PX = 700             # what is left of 768 px under the browser's and JupyterLab's bars
PRESSES = 3                    # key presses timed per panel (reported; `wmdist bench panels` times many more)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def _notebooks_with(*needles: str) -> list[str]:
    """Notebooks with at least one code cell whose source holds one of `needles`."""
    out = []
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        if any(c.cell_type == "code" and any(n in c.source for n in needles) for c in cells):
            out.append(path.name)
    return out


PANEL = "Panel("                 # a cell that builds a panel
ASKED = ".answer_with("          # a cell that answers a prediction when asked


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


def _course_kernel(path_dir: Path) -> None:
    """Install the course's forking kernel (binder/jupyter's spec, what Binder and `wmdist lab` run) as
    this server's python3, with this interpreter: the page then talks to the kernels learners get, so a
    widget comm target the zygote fails to register shows (as "Comm not found") here too."""
    spec = json.loads((REPO / "binder" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    spec["argv"][0] = sys.executable
    (path_dir / "kernels" / "python3").mkdir(parents=True)
    (path_dir / "kernels" / "python3" / "kernel.json").write_text(json.dumps(spec))


def _stop(proc: subprocess.Popen | None) -> None:
    """Stop the server (it shuts its kernels down), then kill whatever of its tree is still there.

    Process objects, not pids: psutil will not signal a pid that has been reused since.
    """
    procs: list[psutil.Process] = []
    if proc is not None:
        try:
            procs = psutil.Process(proc.pid).children(recursive=True)
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(browser, base url): a JupyterLab server over copies of the notebooks, and headless Chromium."""
    chromium, sync_playwright = _tools()
    tmp = tmp_path_factory.mktemp("lab")
    root, settings, workspaces = tmp / "root", tmp / "settings", tmp / "workspaces"
    for d in (root, settings, workspaces, tmp / "config", tmp / "data", tmp / "runtime"):
        d.mkdir()
    for name in _notebooks_with(PANEL, ASKED):
        shutil.copy(REPO / "notebooks" / name, root / name)
    _write_settings(settings)
    _course_kernel(tmp / "path")
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND",)}   # the kernel must use the inline backend
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(workspaces), JUPYTER_PATH=str(tmp / "path"))   # first: before the venv's
    log = tmp / "jupyter.log"
    before = _alive_descendants()
    proc = None
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
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS, timeout=MS)
            try:
                _wait_for_server(proc, base, log)
                with urllib.request.urlopen(base + "api/kernelspecs", timeout=30) as reply:
                    argv = json.load(reply)["kernelspecs"]["python3"]["spec"]["argv"]
                assert argv[1:3] == ["-m", "wmdist.kernel"], f"the page would not talk to the course's kernel: {argv}"
                yield browser, base
            finally:
                browser.close()
    finally:
        _stop(proc)
    deadline = time.monotonic() + 15
    while (left := _alive_descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:                                 # do not leave them running, and say so
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"processes left behind by the browser tests: {left}"


KERNEL_READY_JS = """(path) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && w.context.path === path && k.status === 'idle'; }"""
BUSY_JS = """() => { const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent);
  const unrun = w.content.model ? [...Array(w.content.model.cells.length).keys()].filter(i => {
      const c = w.content.model.cells.get(i); return c.type === 'code' && c.executionCount === null; }).length : 0;
  return {idle: !!k && k.status === 'idle', busy: prompts.some(p => p.includes('*')), unrun: unrun}; }"""
ERRORS_JS = """() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells; const out = [];
  for (let i = 0; i < cells.length; i++) { const j = cells.get(i).toJSON();
    for (const o of (j.outputs || [])) if (o.output_type === 'error') out.push(`cell ${i}: ${o.ename}: ${o.evalue}`); }
  return out; }"""
PLOT_JS = """([out, old]) => {
    const imgs = out.querySelectorAll('img');
    if (imgs.length !== 1) return false;
    const src = imgs[0].getAttribute('src');
    return src !== old && imgs[0].complete && imgs[0].naturalWidth > 100 ? src : false;
}"""
CLIPPED_JS = """(panel) => {
  const bad = [];
  const clipped = e => e.offsetWidth === 0 || e.scrollWidth > e.clientWidth + 1;
  for (const e of panel.querySelectorAll('.widget-readout, .widget-label, .widget-inline-hbox > label'))
    if (e.offsetParent !== null && clipped(e)) bad.push(`readout/label '${e.textContent.trim()}'`);
  for (const e of panel.querySelectorAll('.wmdist-status, .wmdist-status *, .wmdist-summary, .wmdist-summary *'))
    if (e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
      bad.push(`text '${e.textContent.trim().slice(0, 60)}'`);
  for (const img of panel.querySelectorAll('.wmdist-figure img'))
    if (Math.abs(img.getBoundingClientRect().width - img.naturalWidth) > 1)
      bad.push(`figure shown at ${Math.round(img.getBoundingClientRect().width)} px of its ${img.naturalWidth}`);
  const box = panel.getBoundingClientRect();
  for (const e of panel.querySelectorAll('.wmdist-figure, .wmdist-summary'))
    if (e.getBoundingClientRect().right > box.right + 1)
      bad.push(`${e.className.split(' ').pop()} ends at ${Math.round(e.getBoundingClientRect().right)} px, past the panel's ${Math.round(box.right)}`);
  return bad; }"""
ARM_JS = """(panel) => {
  window.__key = null;
  if (!window.__keyListener) {
    document.addEventListener('keydown', () => { window.__key = performance.now(); }, true);
    window.__keyListener = true;
  }
  const img = panel.querySelector('.wmdist-figure img');
  return [img ? img.getAttribute('src') : null, panel.querySelector('.wmdist-summary').textContent];
}"""
ANSWERED_JS = """([panel, src, text]) => {
  const img = panel.querySelector('.wmdist-figure img');
  const s = panel.querySelector('.wmdist-summary').textContent;
  if (window.__key === null || !img || img.getAttribute('src') === src || !img.complete || s === text) return false;
  return performance.now() - window.__key;
}"""


def _open(browser, base: str, name: str, console: list[str] | None = None):
    """A new page on notebook `name`, its kernel idle; every console message of the page goes to `console`."""
    page = browser.new_page(viewport=VIEWPORT)
    if console is not None:                          # from the first load on: the widget manager probes at kernel start
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.set_default_timeout(MS)
    page.goto(base + f"lab/tree/{name}?reset", timeout=MS)     # ?reset: no notebook of an earlier page reopens
    page.wait_for_function(KERNEL_READY_JS, arg=name, timeout=MS)
    return page


def _run_all(page) -> None:
    """Run every cell and wait until all have run and the kernel is idle again (checked three times)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    deadline, stable = time.monotonic() + RUN_ALL_S, 0
    while time.monotonic() < deadline:
        st = page.evaluate(BUSY_JS)
        stable = stable + 1 if st["idle"] and not st["busy"] and st["unrun"] == 0 else 0
        if stable >= 3:
            return
        time.sleep(1)
    raise AssertionError(f"Run All still busy after {RUN_ALL_S} s: {page.evaluate(BUSY_JS)}")


def _plot(page, panel, other_than: str | None = None) -> str:
    """Wait until the panel's figure shows one loaded image other than `other_than`; return its src."""
    out = panel.locator(".wmdist-figure").first
    out.wait_for(state="attached", timeout=MS)
    return page.wait_for_function(PLOT_JS, arg=[out.element_handle(), other_than], timeout=MS).json_value()


def _shoot(panel, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(path))


# The texts the kernel must show after one ArrowRight, computed here by the same pure models.

def _scaling_expected(n: int) -> str:
    at = scaling_curve(ScalingParams(alpha=3e-3, max_workers=n)).at(n)
    return f"At N = {n}: all-reduce {seconds(at['allreduce'])}"


def _memory_expected(dp: int) -> str:
    import dataclasses
    total = per_rank_bytes(dataclasses.replace(teaching_config(), dp=dp))["total"]
    return f"of {dp * 2}, {format_bytes(total)}"


# notebook -> (control tab or None, slider on its first panel, summary before, summary texts after one ArrowRight)
KNOWN = {"00_start_here.ipynb": ("parallel", "dp degree", lambda: [_memory_expected(4)],
                                 lambda: [_memory_expected(6)]),
         "01_data_parallel.ipynb": (None, "N max", lambda: [_scaling_expected(32)], lambda: [_scaling_expected(33)])}


def _away_from_end(handle, key: str = "ArrowRight") -> str:
    """The arrow key that moves a slider: `key`, unless the slider is at that end."""
    now, low, high = (float(handle.get_attribute(a) or 0) for a in ("aria-valuenow", "aria-valuemin",
                                                                      "aria-valuemax"))
    return "ArrowLeft" if now >= high else "ArrowRight" if now <= low else key


def _latency(page, panel, handle) -> list[float]:
    """Key press -> the new picture and numbers on screen, in page milliseconds, for PRESSES presses."""
    from playwright.sync_api import expect
    out, key, moved = [], "ArrowRight", []
    for _ in range(PRESSES):
        time.sleep(0.8)                                  # a learner looks before the next press
        key = _away_from_end(handle, key)                # turn at either end
        src, text = page.evaluate(ARM_JS, panel.element_handle())
        handle.press(key)
        ms = page.wait_for_function(ANSWERED_JS, arg=[panel.element_handle(), src, text], timeout=MS)
        out.append(round(ms.json_value(), 1))
        moved.append("ArrowLeft" if key == "ArrowRight" else "ArrowRight")
    for back in reversed(moved):                        # put the slider back where it was (untimed)
        text = panel.locator(".wmdist-summary").inner_text()
        handle.press(back)
        expect(panel.locator(".wmdist-summary")).not_to_have_text(text, timeout=MS)
    return out


SHUTDOWN_JS = """async () => { const w = window.jupyterapp.shell.currentWidget;
  if (w && w.sessionContext && w.sessionContext.session) await w.sessionContext.shutdown(); }"""


NOTEBOOK_JS = "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook').textContent"


def _answer_shown(value: str, unit: str) -> str:
    """The text that would give `value` away on the page: with its unit, or alone when it has 3+ digits.

    A bare one- or two-digit number ("3", "0.5") cannot tell an answer from any other number on a
    page, so it is looked for with its unit only (and not at all without one)."""
    if unit:
        return f"{value} {unit}"
    return value if sum(ch.isdigit() for ch in value) >= 3 else ""


ABOVE_JS = """(button) => {
  const cell = button.closest('.jp-Cell');
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  const out = [];
  for (const c of cells) {
    if (c === cell) { const i = c.querySelector('.jp-InputArea'); if (i) out.push(i.innerText); break; }
    out.push(c.innerText);
  }
  return out.join('\\n'); }"""


def _reveal_rows(answer) -> dict[str, str]:
    """The reveal table's rows shown in an answer area: first cell -> second cell."""
    rows = answer.locator(".wmdist-reveal tr")
    return {rows.nth(i).locator("th").inner_text().strip(): rows.nth(i).locator("td").first.inner_text().strip()
            for i in range(rows.count())}


def _predictions_ask_first(page, name: str, page_after_run_all: str) -> None:
    """Every prediction on the page after Run All: its answer is nowhere on the page until a button is pressed;
    nor its formula or its reasoning (the reveal's formula and why) in any cell above its buttons, source or output;
    a choice's answer is not named as the leader above its buttons, and its listed values are nowhere on the page;
    an empty box and an unreadable guess are refused without measuring; Show me answers; the measured value as the
    reveal prints it, typed as a guess, is exactly right."""
    from playwright.sync_api import expect
    cells = nbformat.read(REPO / "notebooks" / name, as_version=4).cells
    asked = sum(c.source.count(ASKED) for c in cells if c.cell_type == "code")
    checks = page.locator(".wmdist-check")
    assert checks.count() == asked, f"{name}: {asked} answer_with calls, {checks.count()} Check buttons shown"
    above = [page.evaluate(ABOVE_JS, checks.nth(k).element_handle()) for k in range(asked)]   # before any press
    for k in range(asked):
        check, show, answer = checks.nth(k), page.locator(".wmdist-show").nth(k), page.locator(".wmdist-answer").nth(k)
        box = check.locator("xpath=..").locator(".wmdist-guess input")
        assert answer.locator(".wmdist-reveal").count() == 0, f"{name} prediction {k}: answered before asked"
        for typed, said in (("", "no guess entered"), ("abc", re.compile("not a number|not one of"))):
            box.scroll_into_view_if_needed()
            box.fill(typed)
            check.click()
            expect(answer).to_contain_text(said, timeout=MS)
            assert answer.locator(".wmdist-reveal").count() == 0, f"{name} prediction {k}: {typed!r} was compared"
        box.fill("")                                       # re-judged when it arrives: wait for that before Show
        expect(answer).to_contain_text("no guess entered", timeout=MS)
        show.click()
        expect(answer.locator(".wmdist-reveal")).to_be_visible(timeout=RUN_ALL_S * 1000)
        rows = _reveal_rows(answer)
        unit = page.evaluate("(el) => el.parentElement.querySelector('.widget-label').textContent", box.element_handle())
        shown = {key: value for key, value in rows.items() if key == "measured" or key.startswith("formula")}
        assert "measured" in shown, f"{name} prediction {k}: no measured row in {rows}"
        for key, value in shown.items():
            number = value[: -len(unit)].strip() if unit and value.endswith(unit) else value
            needle = _answer_shown(number, unit.strip())
            assert not needle or needle not in page_after_run_all, \
                f"{name} prediction {k}: its {key} value {needle!r} was on the page before anyone asked"
        formula = [key[len("formula"):].strip() for key in rows if key.startswith("formula")]
        why = answer.locator(".wmdist-reveal > div", has_text="why:")
        why = why.first.inner_text().split("why:", 1)[1].strip() if why.count() else ""
        assert formula or why, f"{name} prediction {k}: the reveal states neither a formula nor a why: {rows}"
        for kind, text, words in [("formula", f, None) for f in formula if f] + [("why", why, WHY_WORDS)]:
            said = _stated(text, above[k], words)
            assert not said, f"{name} prediction {k}: its {kind} ({said!r}) is above its buttons before any press"
        if not any(ch.isdigit() for ch in rows["measured"]):        # a Choice: its answer is a name
            said = answer_phrase(rows["measured"], above[k])
            assert not said, f"{name} prediction {k}: its answer is stated above its buttons: {said!r}"
            listed = list(rows)[list(rows).index("measured") + 1:]      # each name's value, as the reveal lists it
            for key in listed:
                needle = _answer_shown(rows[key].split(" ")[0], "")
                assert not needle or needle not in page_after_run_all, \
                    f"{name} prediction {k}: {key}'s value {needle!r} was on the page before anyone asked"
        guess = rows["measured"].split(" ")[0]
        box.fill(guess)
        check.click()
        expect(answer.locator(".wmdist-reveal")).to_contain_text("exactly right", timeout=MS)


TRACKS_JS = """(panel) => [...panel.querySelectorAll('.widget-slider')].filter(s => s.offsetParent !== null).map(s => {
  const label = s.querySelector('.widget-label'), track = s.querySelector('.noUi-target');
  return [label ? label.textContent.trim() : '?', track ? Math.round(track.getBoundingClientRect().width) : 0]; })"""
MIN_TRACK_PX = 120             # the shortest track whose handle position a learner can read and drag (issue 33 §2)


def _tab_problems(page, panel, where: str) -> list[str]:
    """Each tab of `panel` clicked in turn (the first shown again after): every slider track shorter than
    MIN_TRACK_PX, the panel taller than MAX_PANEL_PX, and clipped text, as "where, tab: what"."""
    from playwright.sync_api import expect
    tabs = panel.locator(".lm-TabBar-tab")
    problems = []
    for t in range(max(tabs.count(), 1)):
        tab = "no tabs"
        if tabs.count():
            tabs.nth(t).click()
            tab = f"tab '{tabs.nth(t).inner_text().strip()}'"
            expect(tabs.nth(t)).to_have_class(re.compile(r"\blm-mod-current\b"), timeout=MS)
        problems += [f"{where}, {tab}, slider '{label}': track {px} px" for label, px in panel.evaluate(TRACKS_JS)
                     if px < MIN_TRACK_PX]
        if (height := panel.bounding_box()["height"]) > MAX_PANEL_PX:
            problems.append(f"{where}, {tab}: panel {height:.0f} px tall")
        problems += [f"{where}, {tab}: {bad}" for bad in page.evaluate(CLIPPED_JS, panel.element_handle())]
    if tabs.count():
        tabs.first.click()
    return problems


COMM_NOT_FOUND = "Comm not found"    # JupyterLab's kernel connection: a comm_close for a comm it does not hold


LATENCY: dict[str, tuple[int, list[float]]] = {}         # "notebook panel i" -> (panel height, ms per press)


@pytest.mark.parametrize("name", _notebooks_with(PANEL, ASKED))
def test_every_panel_of_every_notebook(lab, name):
    from playwright.sync_api import expect
    browser, base = lab
    console: list[str] = []
    page = _open(browser, base, name, console)
    stem = Path(name).stem
    try:
        _run_all(page)
        assert page.evaluate(ERRORS_JS) == [], f"{name}: cells raised"
        page_after_run_all = page.evaluate(NOTEBOOK_JS)
        panels = page.locator(".wmdist-panel")
        if name in _notebooks_with(PANEL):
            assert panels.count() >= 1, f"{name} builds a panel but none rendered"
        for i in range(panels.count()):
            panel = panels.nth(i)
            panel.scroll_into_view_if_needed()
            summary = panel.locator(".wmdist-summary")
            before_text, before_plot = summary.inner_text(), _plot(page, panel)
            _shoot(panel, ARTIFACTS / f"{stem}_panel{i}.png")
            height = panel.bounding_box()["height"]
            assert height <= MAX_PANEL_PX, f"{name} panel {i} is {height:.0f} px tall in a 1366 x 768 window"
            assert page.evaluate(CLIPPED_JS, panel.element_handle()) == [], f"{name} panel {i} before any action"
            assert _tab_problems(page, panel, f"{name} panel {i}") == [], "a tab does not fit or shows a short track"
            if i == 0 and name in KNOWN:                 # the kernel must answer with the pure model's numbers
                tab, label, before, after = KNOWN[name]
                for text in before():
                    expect(summary).to_contain_text(text, timeout=MS)
                if tab:
                    panel.locator(".lm-TabBar-tab", has_text=tab).click()
                panel.locator(".widget-slider", has_text=label).locator(".noUi-handle").press("ArrowRight")
                for text in after():                     # the text itself: an intermediate reply may come first
                    expect(summary).to_contain_text(text, timeout=MS)
            else:
                handle = panel.locator(".widget-slider .noUi-handle").first
                handle.press(_away_from_end(handle))     # decided before pressing: a second press could undo it
            expect(summary).not_to_have_text(before_text, timeout=MS)
            _plot(page, panel, other_than=before_plot)   # the kernel redrew the figure too
            assert page.evaluate(CLIPPED_JS, panel.element_handle()) == [], f"{name} panel {i} after a slider"
            LATENCY[f"{stem} panel {i}"] = (round(height), _latency(page, panel, panel.locator(
                ".widget-slider .noUi-handle").first))
            views = panel.locator(".wmdist-views button")
            for v in range(views.count() if views.count() > 1 else 0):               # every plot is one click away, and each is its own
                plot = _plot(page, panel)
                if "mod-active" in (views.nth(v).get_attribute("class") or ""):
                    continue
                views.nth(v).click()
                _plot(page, panel, other_than=plot)
                assert page.evaluate(CLIPPED_JS, panel.element_handle()) == [], f"{name} panel {i} view {v}"
            if views.count() > 1:
                plot = _plot(page, panel)
                views.first.click()
                _plot(page, panel, other_than=plot)
            run = panel.locator(".wmdist-run")
            if run.is_visible():
                plot = _plot(page, panel)
                run.click()
                expect(panel.locator(".wmdist-progress")).to_be_visible(timeout=MS)
                expect(run).to_be_enabled(timeout=RUN_ALL_S * 1000)
                status = panel.locator(".wmdist-status").inner_text()
                assert "failed" not in status and "cannot" not in status, f"{name} panel {i}: {status}"
                _plot(page, panel, other_than=plot)      # the measured overlay is drawn
                assert page.evaluate(CLIPPED_JS, panel.element_handle()) == [], f"{name} panel {i} after run"
            _shoot(panel, ARTIFACTS / f"{stem}_panel{i}_after.png")
        _predictions_ask_first(page, name, page_after_run_all)
        assert page.evaluate(ERRORS_JS) == [], f"{name}: a cell shows an error after the interactions"
        said = "\n".join(console)
        assert COMM_NOT_FOUND not in said, f"{name}: the browser console says:\n{said}"
    finally:
        try:                                             # the kernel and its warm ranks go with the page
            page.evaluate(SHUTDOWN_JS)
        finally:
            page.close()


KERNEL_ID_JS = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id"


def test_a_second_window_on_a_kernel_leaves_the_first_one_quiet(lab):
    """Two windows on one notebook (or a reload) share its kernel. The second page's widget manager probes the
    kernel with a control comm; a kernel without ipywidgets' comm targets answers with a comm_close, which
    the first page logs as "Comm not found". The course's forking kernel did, until each forked kernel
    registered the targets itself (the zygote imports ipywidgets before any kernel exists)."""
    browser, base = lab
    name = "01_data_parallel.ipynb"
    console: list[str] = []
    first = _open(browser, base, name, console)
    second = None
    try:
        second = _open(browser, base, name)
        assert first.evaluate(KERNEL_ID_JS) == second.evaluate(KERNEL_ID_JS), "the two windows should share a kernel"
        time.sleep(patience(5))                      # the probe's answer reaches every page on the kernel in ms
        said = "\n".join(console)
        assert COMM_NOT_FOUND not in said, f"the first window's console says:\n{said}"
    finally:
        try:
            first.evaluate(SHUTDOWN_JS)
        finally:
            first.close()
            if second is not None:
                second.close()


def test_latency_table(lab, capsys):
    """Print what the panel test measured (it runs after it): key press -> new picture, per panel."""
    if not LATENCY:
        pytest.skip("no panel was measured (run with the panel test)")
    lines = [f"{'panel':34} {'height px':>9} {'median ms':>9} {'max ms':>7}  presses (ms)"]
    for key, (height, ms) in LATENCY.items():
        med = f"{sorted(ms)[len(ms) // 2]:9.0f}" if ms else f"{'-':>9}"
        lines.append(f"{key:34} {height:9d} {med} {max(ms, default=float('nan')):7.0f}  {ms}")
    table = "\n".join(lines)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "latency.txt").write_text(table + "\n")
    with capsys.disabled():
        print("\n" + table)
    assert all(ms for _, ms in LATENCY.values()), f"a panel never answered a key press:\n{table}"
