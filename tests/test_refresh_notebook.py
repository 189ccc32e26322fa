"""tools/refresh_notebook.py's rules for what an unchecked cell stores, on hand-made outputs (no kernel).

A reader without a kernel gets the static pictures, not a widget view that would say "model
not found"; PNGs are stored at the size they are shown; a repeat and a bare progress bar are
not stored; this checkout's path is not written into the notebook.
"""
from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import nbformat
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import refresh_notebook as rn  # noqa: E402  (a script in tools/, not a package)

VIEW = "application/vnd.jupyter.widget-view+json"


def _png(width: int, height: int) -> str:
    image = Image.new("RGB", (width, height), "white")
    image.paste((30, 120, 40), (width // 4, height // 4, width // 2, height // 2))
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _size(data: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(data))).size


def _display(data: dict, metadata: dict | None = None) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data=data, metadata=metadata or {})


def test_widget_views_go_and_their_static_pictures_stay():
    panel = _display({VIEW: {"model_id": "abc", "version_major": 2}, "text/plain": "ring bytes: 6,000",
                      "image/png": _png(760, 360)})
    progress = _display({VIEW: {"model_id": "def", "version_major": 2}, "text/plain": "IntProgress(value=4, max=4)"})
    kept = rn.reader_outputs([panel, progress])
    assert len(kept) == 1 and set(kept[0].data) == {"text/plain", "image/png"}
    assert _size(kept[0].data["image/png"]) == (760, 360)           # already at screen size: not resized


def test_pngs_are_stored_at_the_size_they_are_shown():
    retina = _display({"image/png": _png(1600, 800), "text/plain": "<Figure>"},
                      {"image/png": {"width": 800, "height": 400}})
    huge = _display({"image/png": _png(3000, 1000), "text/plain": "<Figure 2>"})
    small, capped = rn.reader_outputs([retina, huge])
    assert _size(small.data["image/png"]) == (800, 400) and "image/png" not in small.metadata
    assert _size(capped.data["image/png"]) == (rn.MAX_WIDTH, 400)


def test_a_repeat_is_dropped_and_the_checkout_path_is_not_stored():
    text = nbformat.v4.new_output("stream", name="stderr", text=f"warning from {REPO}/wmdist/x.py\n")
    figure = _display({"image/png": _png(200, 100), "text/plain": "<Figure>"})
    kept = rn.reader_outputs([text, figure, nbformat.from_dict(dict(figure))])
    assert len(kept) == 2
    assert str(REPO) not in kept[0].text and "./wmdist/x.py" in kept[0].text


def test_a_figure_with_alt_text_is_stored_with_an_html_picture_that_carries_it():
    """nbconvert's default template and the site show text/html first and write no alt for a bare PNG."""
    figure = _display({"image/png": _png(300, 200), "text/plain": "<Figure>"},
                      {"image/png": {"alt": "Figure, 1 chart. 'a' & <b>"}})
    panel = _display({"image/png": _png(300, 200), "text/html": "<div>its own</div>", "text/plain": "n = 3"})
    bare = _display({"image/png": _png(300, 200), "text/plain": "<Figure 2>"})
    stored_figure, stored_panel, stored_bare = rn.reader_outputs([figure, panel, bare])
    assert stored_figure.data["text/html"] == (f"<img src='data:image/png;base64,{stored_figure.data['image/png']}' "
                                               "alt='Figure, 1 chart. &#x27;a&#x27; &amp; &lt;b&gt;'>")
    assert stored_figure.metadata["image/png"]["alt"] == "Figure, 1 chart. 'a' & <b>"
    assert stored_panel.data["text/html"] == "<div>its own</div>" and "text/html" not in stored_bare.data
