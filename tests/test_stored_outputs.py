"""What the notebooks store is what a reader without a kernel needs, and what the current code draws.

- Every stored picture has alt text, and a picture stored with its numbers (a panel) shows both in
  the HTML every renderer picks: nbconvert's page of each notebook names every image and carries
  each panel's key numbers. Read from the stored notebooks (no kernel): these pass once
  tools/refresh_notebook.py has stored them.
- A stored picture the current code would draw at another size fails the suite: nbval executes
  every notebook once, and tools/nbval_drift.py (a plugin tests/conftest.py registers) compares each cell's stored pictures with the
  fresh ones (tools/refresh_notebook.py's `stale_pictures`). Shown here on hand-made outputs, on a
  figure the course draws, and on a one-cell notebook run through nbval with that plugin.
"""
from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import refresh_notebook as rn  # noqa: E402  (a script in tools/, not a package)

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLUGIN = REPO / "tools" / "nbval_drift.py"
NO_ALT = "No description has been provided for this image"      # what nbconvert writes for a missing alt


def _png(width: int, height: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, format="png")
    return base64.b64encode(out.getvalue()).decode("ascii")


def _figure_output(width: int, height: int, meta: dict | None = None) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={"image/png": _png(width, height),
                                                        "text/plain": "<Figure size 800x300 with 1 Axes>"},
                                  metadata=meta or {})


def _pictures(path: Path):
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if "image/png" in out.get("data", {}):
                yield i, out


# --- the stored notebooks, as a reader gets them ---------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_stored_picture_has_alt_text_and_a_panel_shows_its_numbers_in_html(path):
    problems = []
    for i, out in _pictures(path):
        alt = out.get("metadata", {}).get("image/png", {}).get("alt", "")
        shown_alt = re.search(r"<img\b[^>]*\balt='([^']{10,})'", "".join(out.data.get("text/html", "")))
        if len(alt.strip()) < 10 and not shown_alt:         # a figure's metadata, or a panel's own HTML
            problems.append(f"cell {i}: a picture without alt text")
        numbers = "".join(out.data.get("text/plain", ""))
        if numbers and not numbers.startswith("<Figure"):      # a panel: picture and key numbers
            shown = "".join(out.data.get("text/html", ""))
            if "<img" not in shown or not all(part in _text(shown) for part in numbers.split("; ")[:3]):
                problems.append(f"cell {i}: its numbers ({numbers[:60]}...) are not in the HTML with its picture")
    assert not problems, f"{path.name} (run tools/refresh_notebook.py):\n  " + "\n  ".join(problems)


def _text(markup: str) -> str:
    """The text of some HTML, as wmdist.ui.panel writes a panel's numbers as text/plain."""
    from wmdist.ui.static import strip_tags
    return strip_tags(markup)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_nbconvert_names_every_image(path):
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_filename(str(path))
    assert NO_ALT not in page, f"{path.name}: nbconvert found {page.count(NO_ALT)} image(s) without alt text"


# --- stale_pictures: the comparison the nbval run makes after every cell -------------------------------

def test_a_picture_drawn_at_another_size_is_reported_and_one_at_the_same_size_is_not():
    stored = [_figure_output(860, 300)]
    assert rn.stale_pictures(stored, [_figure_output(700, 300)]) == \
        ["picture 1: stored 860x300 px, the code now draws 700x300 px"]
    assert rn.stale_pictures(stored, [_figure_output(860, 300)]) == []
    assert rn.stale_pictures(stored, [_figure_output(862, 300)], tolerance_px=2) == []


def test_a_missing_or_extra_picture_is_reported():
    assert rn.stale_pictures([_figure_output(700, 300)], []) == ["1 picture(s) stored, the code now shows 0"]
    assert rn.stale_pictures([], [_figure_output(700, 300)]) == ["0 picture(s) stored, the code now shows 1"]


def test_fresh_pictures_are_compared_as_they_would_be_stored():
    """A retina figure (twice the pixels, shown at half) is stored at its shown size; a repeat once."""
    retina = _figure_output(1600, 600, {"image/png": {"width": 800, "height": 300}})
    repeat = _figure_output(700, 300)
    assert rn.stale_pictures([_figure_output(800, 300)], [retina]) == []
    assert rn.stale_pictures([repeat], [repeat, nbformat.from_dict(json.loads(json.dumps(repeat)))]) == []
    assert rn.stale_pictures([_figure_output(800, 300)], [retina], checked=True) != []   # checked: as it came


def test_a_bad_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance_px"):
        rn.stale_pictures([], [], tolerance_px=-1)
    with pytest.raises(ValueError, match="tolerance_share"):
        rn.stale_pictures([], [], tolerance_share=1.5)


def test_the_suites_tolerance_lets_measured_labels_move_and_still_catches_another_size():
    """The nbval hook's tolerance, pinned to the two cases it is chosen between: a legend of measured values
    (chapter 01's fit figure, 728 vs 715 px in two runs) passes; a figure drawn at another size fails."""
    import nbval_drift
    allow = {"tolerance_px": nbval_drift.TOLERANCE_PX, "tolerance_share": nbval_drift.TOLERANCE_SHARE}
    assert rn.stale_pictures([_figure_output(728, 356)], [_figure_output(715, 356)], **allow) == []
    assert rn.stale_pictures([_figure_output(860, 300)], [_figure_output(700, 300)], **allow) != []
    assert rn.stale_pictures([_figure_output(728, 356)], [_figure_output(700, 356)], **allow) != []   # 3.8 %


def test_a_course_figure_redrawn_smaller_than_stored_is_caught():
    """The case that happened: timelines stored at 860 px tall after the code moved to 700 px."""
    from IPython.core.pylabtools import print_figure

    from wmdist.base.spans import Span
    from wmdist.ui.timeline import timelines_figure

    rows = [Span(row=r, start=0.01 * (r + k), end=0.01 * (r + k + 1), kind="compute") for r in range(4) for k in range(3)]
    fig = timelines_figure({name: rows for name in ("a", "b", "c")})
    png = base64.b64encode(print_figure(fig, "png", bbox_inches="tight")).decode("ascii")
    width, height = Image.open(io.BytesIO(base64.b64decode(png))).size
    assert 0 < height <= 720, f"three 4-rank timelines should fit 700 px, drew {height}"
    fresh = [nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})]
    assert rn.stale_pictures([_figure_output(width, 860)], fresh) == \
        [f"picture 1: stored {width}x860 px, the code now draws {width}x{height} px"]


# --- the nbval run itself --------------------------------------------------------------------------

def test_the_suites_nbval_run_fails_on_a_stale_stored_picture(tmp_path):
    """nbval with tools/nbval_drift.py registered (as tests/conftest.py does): a one-cell notebook stored by
    tools/refresh_notebook.py passes; the same notebook with its stored picture 40 px taller than the code draws
    fails, naming both sizes."""
    assert PLUGIN.is_file(), "tools/nbval_drift.py (the hook that calls stale_pictures under nbval) is missing"
    folder, tools = tmp_path / "notebooks", tmp_path / "tools"
    folder.mkdir()
    tools.mkdir()
    shutil.copy(REPO / "tools" / "refresh_notebook.py", tools)
    shutil.copy(PLUGIN, tools)
    (folder / "conftest.py").write_text("import sys\nsys.path.insert(0, %r)\nimport nbval_drift\n\n\n"
                                        "def pytest_configure(config):\n"
                                        "    config.pluginmanager.register(nbval_drift)\n" % str(tools))
    cell = nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\n\nwith plt.ioff():\n"
                                     "    fig, ax = plt.subplots(figsize=(3, 2))\n"
                                     "ax.plot([0, 1])\nax.set_title('a line')\nplt.close(fig)\nfig")
    nb = nbformat.v4.new_notebook(cells=[cell])
    good, stale = folder / "good.ipynb", folder / "stale.ipynb"
    nbformat.write(nb, good)
    rn.refresh(good, timeout=120)                      # stored as the course stores it, alt text included
    nb = nbformat.read(good, as_version=4)
    (out,) = nb.cells[0].outputs
    assert out.metadata["image/png"]["alt"].startswith("Figure, 1 chart. a line")
    width, height = Image.open(io.BytesIO(base64.b64decode(out.data["image/png"]))).size
    out.data["image/png"] = _png(width, height + 40)
    nbformat.write(nb, stale)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                          "--nbval-current-env", "--rootdir", str(tmp_path), good.name, stale.name],
                         cwd=folder, capture_output=True, text=True, timeout=240)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 failed, 1 passed" in run.stdout and "stale.ipynb" in run.stdout.split("short test summary")[-1], tail
    assert f"stored {width}x{height + 40} px, the code now draws {width}x{height} px" in run.stdout, tail


# --- where the alt text and the numbers come from -------------------------------------------------

def test_a_figures_alt_text_says_what_its_titles_axes_and_key_say():
    from wmdist.base.spans import Span
    from wmdist.ui.render import figure_alt
    from wmdist.ui.timeline import timelines_figure

    fig = timelines_figure({"GPipe": [Span(row=0, start=0.0, end=1.0, kind="forward"), Span(row=1, start=1.0, end=2.0, kind="backward")],
                            "1F1B": [Span(row=0, start=0.0, end=1.0, kind="forward")]})
    assert figure_alt(fig) == ("Figure, 2 charts. 1) GPipe — key: forward, backward. "
                               "2) 1F1B — x axis time (ms); key: forward.")


def test_describe_figures_attaches_the_alt_text_and_survives_a_new_png_formatter():
    from types import SimpleNamespace

    from IPython.core.formatters import DisplayFormatter
    from matplotlib.figure import Figure

    from wmdist.ui.render import canvas_figure, describe_figures
    shell = SimpleNamespace(display_formatter=DisplayFormatter())
    fig = canvas_figure(200, 100)
    fig.add_subplot().set_title("a title")
    assert describe_figures(shell=shell)
    shell.display_formatter.formatters["image/png"].for_type(Figure, lambda f: "PNG")   # as `%matplotlib inline`
    data, meta = shell.display_formatter.format(fig)
    assert data["image/png"] == "PNG" and meta["image/png"]["alt"] == "Figure, 1 chart. a title."


def test_a_displayed_panel_holds_its_picture_alt_text_and_numbers_in_one_html_block():
    from wmdist.pipeline.panel import BubblePanel
    from wmdist.ui.static import static_html, strip_tags

    panel = BubblePanel()
    bundle = panel._repr_mimebundle_()
    shown = bundle["text/html"]
    assert bundle["image/png"] in shown and "application/vnd.jupyter.widget-view+json" in bundle
    alt = re.search(r"alt='([^']+)'", shown).group(1)
    assert alt.startswith("BubblePanel, view &#x27;") and "chart" in alt, alt
    assert bundle["text/plain"] and bundle["text/plain"] in strip_tags(shown)
    def refuse(config):
        raise ValueError("M must be >= 1")
    panel.compute = refuse                                           # a bad input: the error, no picture
    panel.update()
    assert "M must be &gt;= 1" in panel._repr_mimebundle_()["text/html"] and "<img" not in static_html(panel)
    panel.prefetch.idle()
