"""Execute notebooks and store their outputs: nbval's expectations, and what a reader without a kernel sees.

Usage: python tools/refresh_notebook.py notebooks/00_start_here.ipynb [...]

The course's convention (docs/notebooks.md):
- Cells starting with `# NBVAL_CHECK_OUTPUT` keep their output exactly as it came: it is
  nbval's expectation (the suite runs `--nbval-lax`, which compares those cells only).
- Every other cell keeps its outputs too, so GitHub, nbviewer and the course site show the
  figures, panels and report tables the prose points at. They are made lean: consecutive
  stream outputs merged and carriage-return progress reduced to its last state (nbconvert's
  CoalesceStreamsPreprocessor), a repeated output in a cell dropped, PNGs stored at the size
  they are shown (never above MAX_WIDTH px) and recompressed losslessly, and this checkout's
  path replaced by `.`.
- A widget's live view (`application/vnd.jupyter.widget-view+json`) is dropped, since no widget
  state is stored and JupyterLab would show "model not found" in its place; its static
  fallbacks (`image/png`, `text/html`, a meaningful `text/plain`) stay. A widget that has only
  ipywidgets' default repr to fall back on (a progress bar) is dropped whole.
- Code cells are numbered 1, 2, ... in order; widget state and machine-specific metadata go.
- Every figure a cell shows is stored with alt text saying what it shows (from its titles, axis
  labels and legend: wmdist.ui.render.describe_figures, run in the kernel before the first cell),
  in its metadata and in a `text/html` <img> beside the PNG: nbconvert's default template and the
  site show the HTML (they prefer it to a PNG, and the template writes no alt for a bare PNG).
  A panel stores its own HTML: the picture and its key numbers (wmdist.ui.panel).

`stale_pictures` is the other half: it compares a cell's stored pictures with those a fresh run
drew (their count and their size as stored), so a stored output that the current code would draw
differently fails the suite's nbval run (tools/nbval_drift.py calls it after every cell).

Fails if a cell raised (unless marked NBVAL_RAISES_EXCEPTION) or a checked output holds an
absolute path of this machine.
"""
from __future__ import annotations

import argparse
import base64
import copy
import html
import io
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbconvert.preprocessors import CoalesceStreamsPreprocessor
from PIL import Image

CHECK = "NBVAL_CHECK_OUTPUT"
RAISES = "NBVAL_RAISES_EXCEPTION"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MAX_WIDTH = 1200                       # px: wider than any panel the course draws (ui/render.py, 1 px per CSS px)
WIDGET_REPR = re.compile(r"^[A-Z]\w*\(.*\)$", re.S)      # ipywidgets' default text/plain: `IntProgress(value=3, ...)`
REPO = Path(__file__).resolve().parents[1]
# Run in the kernel before the notebook's first cell (and not stored): every Figure displayed gets alt text.
PRELUDE = "from wmdist.ui.render import describe_figures\nassert describe_figures(), 'no IPython kernel'"


def screen_size_png(data: str, meta: dict[str, Any]) -> str:
    """A base64 PNG at the size it is shown, recompressed losslessly (kept as it came if that is no smaller).

    The shown width is the display width in `meta` (a "retina" figure stores twice the pixels
    it is shown at) capped at MAX_WIDTH; a display width/height in `meta` is removed once the
    image has exactly that many pixels.
    """
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    width = min(int(meta.get("width", image.width)), MAX_WIDTH, image.width)
    resized = width < image.width
    if resized:
        image = image.resize((width, max(1, round(image.height * width / image.width))), Image.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    encoded = base64.b64encode(out.getvalue()).decode("ascii")
    if resized or int(meta.get("width", -1)) == image.width:
        meta.pop("width", None)
        meta.pop("height", None)
    return encoded if resized or len(encoded) < len(data) else data


def picture_html(png: str, alt: str) -> str:
    """An <img> of a base64 PNG with its alt text: what nbconvert's default (lab) template and the site show, since
    they prefer text/html to image/png and the lab template writes no alt for a bare PNG."""
    return f"<img src='data:image/png;base64,{png}' alt='{html.escape(alt, quote=True)}'>"


def _scrub(value: Any, root: str) -> Any:
    """`value` (text, a list of lines, or nested JSON) with the checkout's absolute path replaced by `.`."""
    if isinstance(value, str):
        return value.replace(root, ".")
    if isinstance(value, list):
        return [_scrub(v, root) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _scrub(v, root)) for k, v in value.items())
    return value


def reader_outputs(outputs: list[Any], root: str = str(REPO)) -> list[Any]:
    """The outputs of an unchecked cell as stored for a reader: lean, static, no widget views, no duplicates."""
    kept, seen = [], set()
    for out in outputs:
        data = out.get("data")
        if data is not None and WIDGET_VIEW in data:
            del data[WIDGET_VIEW]
            if set(data) <= {"text/plain"} and WIDGET_REPR.match("".join(data.get("text/plain", ""))):
                continue                         # only the default repr is left: nothing to show without a kernel
        if data is not None and "image/png" in data:
            meta = out.get("metadata", {})
            data["image/png"] = screen_size_png(data["image/png"], meta.get("image/png", {}))
            alt = meta.get("image/png", {}).get("alt")
            if alt and "text/html" not in data:
                data["text/html"] = picture_html(data["image/png"], alt)
            if meta.get("image/png") == {}:
                del meta["image/png"]
        out = _scrub(out, root)
        key = json.dumps({k: v for k, v in out.items() if k != "execution_count"}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        kept.append(out)
    return kept


def png_sizes(outputs: list[Any]) -> list[tuple[int, int]]:
    """(width, height) in pixels of each `image/png` among `outputs`, in order."""
    return [Image.open(io.BytesIO(base64.b64decode(out["data"]["image/png"]))).size
            for out in outputs if "image/png" in out.get("data", {})]


def stale_pictures(stored: list[Any], fresh: list[Any], *, checked: bool = False, tolerance_px: int = 0,
                   tolerance_share: float = 0.0) -> list[str]:
    """How a cell's stored pictures differ from those a fresh run of it drew ([] when they agree).

    `fresh` are the outputs as a kernel sent them; unless `checked` (an NBVAL_CHECK_OUTPUT cell, stored as
    it came) they are first made what refresh() would store (reader_outputs: screen size, no repeats).
    Compared: how many pictures, and each one's width and height, within the larger of `tolerance_px` and
    `tolerance_share` of the stored size.
    """
    if tolerance_px < 0 or not 0.0 <= tolerance_share < 1.0:
        raise ValueError(f"tolerance_px must be >= 0 and tolerance_share in [0, 1), got {tolerance_px}, "
                         f"{tolerance_share}")

    def off(have: int, want: int) -> bool:
        return abs(have - want) > max(tolerance_px, tolerance_share * have)
    want = png_sizes(fresh if checked else reader_outputs(copy.deepcopy(list(fresh))))
    have = png_sizes(stored)
    if len(want) != len(have):
        return [f"{len(have)} picture(s) stored, the code now shows {len(want)}"]
    return [f"picture {i + 1}: stored {h[0]}x{h[1]} px, the code now draws {w[0]}x{w[1]} px"
            for i, (h, w) in enumerate(zip(have, want))
            if off(h[0], w[0]) or off(h[1], w[1])]


class _Client(NotebookClient):
    """nbclient, running the PRELUDE cell outside the kernel's history: the notebook's cells keep In [1], [2], ..."""

    async def async_execute_cell(self, cell: Any, cell_index: int, execution_count: int | None = None,
                                 store_history: bool = True) -> Any:
        prelude = cell.get("metadata", {}).get("wmdist_prelude", False)
        return await super().async_execute_cell(cell, cell_index, execution_count,
                                                store_history=store_history and not prelude)


def refresh(path: Path, timeout: int = 600) -> float:
    """Execute `path` in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PRELUDE, metadata={"wmdist_prelude": True}))
    # store_widget_state=True: with False, nbclient fails on panels that draw into an Output
    # widget; the state is dropped from the metadata below anyway.
    client = _Client(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            store_widget_state=True, resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    prelude = nb.cells.pop(0)
    problems, count = [f"the prelude raised: {o.ename}: {o.evalue}" for o in prelude.outputs
                       if o.output_type == "error"], 0
    home = str(REPO.parent)
    coalesce = CoalesceStreamsPreprocessor()
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors and RAISES not in cell.source:
            problems.append(f"cell {i} raised {errors[0].ename}: {errors[0].evalue}")
        count += 1
        cell.execution_count = count
        if CHECK in cell.source:
            if home in str(cell.outputs):
                problems.append(f"cell {i} output holds the local path {home}")
        else:
            cell, _ = coalesce.preprocess_cell(cell, {}, i)
            cell.outputs = reader_outputs(cell.outputs)
        for out in cell.outputs:
            if "execution_count" in out:
                out.execution_count = count
        nb.cells[i] = cell
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    if problems:
        raise SystemExit(f"{path}:\n  " + "\n  ".join(problems))
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        print(f"{path}: executed in {refresh(path, args.timeout):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
