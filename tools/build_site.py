"""Build the course site: a static HTML page per chapter from the stored notebooks, and an index.

Usage:
    python tools/build_site.py                  all twelve chapters -> build/site/index.html
    python tools/build_site.py --chapters 00 05 only those (what the test suite builds)
    python tools/build_site.py --readme         rewrite the README's Binder links from pyproject.toml

Needs the `site` extra (`pip install -e '.[site]'`). Nothing is executed: every page shows
the outputs stored in the notebook (figures, panels' pictures, report tables), as
tools/refresh_notebook.py left them, so the site says exactly what a run printed.

The tool is Sphinx with MyST-NB (the notebook reader behind Jupyter Book 1): pure Python (no
Node.js, no pandoc), it renders stored outputs without a kernel, builds the table of contents,
the previous/next links and the search page, and it is told to skip a widget's live view for
the static PNG beside it. `-W` makes any warning (a broken reference, an unreadable output) an
error, so a bad notebook fails the build instead of shipping a broken page.

Readable offline: formulas are turned into MathML while the site is built (latex2mathml, a
pure-Python package of the `site` extra), which browsers draw natively, so no page loads MathJax
or anything else from the network; code and printed output wrap inside the column
(`white-space: pre-wrap` in the site's CSS) instead of scrolling sideways. This file is also
the Sphinx extension that does both (`setup` below, named in the generated conf.py).

Each chapter page starts with its Binder launch link; the index lists the chapters with theirs.
The repository Binder opens is `[tool.wmdist] binder-repo` in pyproject.toml, the one place it
is written (`--readme` copies it into the README's link block).
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import nbformat
from docutils import nodes

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"
BEGIN, END = "<!-- binder links: begin", "<!-- binder links: end -->"

CONF = '''\
# Written by tools/build_site.py for one build; edit that file, not this one.
import sys
sys.path.insert(0, {tools!r})
project = "wmdist"
author = "the wmdist authors"
extensions = ["myst_nb", "build_site"]          # build_site: formulas as MathML, the wrapping CSS
html_math_renderer = "mathml"                   # drawn by the browser itself: no MathJax, no network
html_static_path = ["_static"]
html_css_files = ["wmdist.css"]
nb_execution_mode = "off"                       # show what tools/refresh_notebook.py stored; run nothing
# No widget state is stored: skip a widget's live view and show the static picture it carries.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
myst_enable_extensions = ["dollarmath", "amsmath"]
html_theme = "alabaster"
# Panels are drawn up to ~1000 px wide at one image pixel per CSS pixel (wmdist/ui/render.py): room for them.
html_theme_options = {{"page_width": "1320px", "sidebar_width": "230px", "body_max_width": "none",
                       "show_relbars": True}}
html_show_copyright = False
html_title = "wmdist: distributed training of world models, run for real"
html_show_sourcelink = False
html_copy_source = False
exclude_patterns = ["_build"]
'''

# Alabaster scrolls a long line inside its box (`overflow: auto`): on a page that is read, not edited,
# the end of a call would be hidden. Wrap it at the column instead, breaking a long word if it must.
CSS = """\
div.highlight pre, div.cell_output pre, div.output pre {
    white-space: pre-wrap;
    overflow-wrap: anywhere;
}
div.math { overflow-x: auto; margin: 0.8em 0; }
math[display="block"] { font-size: 115%; }
/* A font with an OpenType MATH table spaces fractions and limits properly; `math` is the browser's own choice. */
math { font-family: "STIX Two Math", "Latin Modern Math", "DejaVu Math TeX Gyre", math; }
"""


def mathml(tex: str, *, display: bool) -> str:
    """`tex` as a MathML element (block or inline); ValueError naming the formula if it cannot be converted."""
    from latex2mathml.converter import convert
    try:
        return convert(tex.strip(), display="block" if display else "inline")
    except Exception as err:            # latex2mathml raises its own exception types, and some plain ones
        raise ValueError(f"cannot convert the formula {tex!r} to MathML: {err}") from err


def _math(translator, node: nodes.Element, *, display: bool) -> None:
    """Write `node`'s formula as MathML (a build warning, so an error under -W, and the TeX as code if it fails)."""
    tag = "div" if display else "span"
    try:
        body = mathml(node.astext(), display=display)
    except ValueError as err:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(str(err), location=node)
        body = f"<code>{translator.encode(node.astext())}</code>"
    translator.body.append(translator.starttag(node, tag, "", CLASS="math") + body + f"</{tag}>")
    raise nodes.SkipNode


def setup(app) -> dict[str, bool]:
    """The Sphinx extension: the "mathml" math renderer for HTML."""
    app.add_html_math_renderer("mathml", (lambda t, n: _math(t, n, display=False), None),
                               (lambda t, n: _math(t, n, display=True), None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def binder_repo() -> str:
    """`owner/name` from `[tool.wmdist] binder-repo` in pyproject.toml."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["wmdist"]["binder-repo"]


def binder_url(notebook: str | None = None, repo: str | None = None) -> str:
    """The mybinder.org link that opens `notebook` (default: chapter 00) in JupyterLab."""
    name = notebook or "00_start_here.ipynb"
    return f"https://mybinder.org/v2/gh/{repo or binder_repo()}/HEAD?urlpath=lab/tree/notebooks/{name}"


def chapters(selected: list[str] | None = None, folder: Path = NOTEBOOKS) -> list[Path]:
    """The chapter notebooks in `folder`, in order; `selected` keeps those whose number (`05`) or stem is given."""
    every = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not selected:
        return every
    chosen = [p for p in every if p.stem[:2] in selected or p.stem in selected]
    unknown = set(selected) - {p.stem[:2] for p in chosen} - {p.stem for p in chosen}
    if unknown:
        raise SystemExit(f"no chapter {', '.join(sorted(unknown))} in {folder}")
    return chosen


def title(nb: nbformat.NotebookNode) -> str:
    """The notebook's first heading (`00 · Start here`)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found = re.search(r"^#\s+(.+)$", cell.source, re.MULTILINE)
            if found:
                return found.group(1).strip()
    raise SystemExit("a chapter notebook has no `# title` heading")


def with_launch_link(nb: nbformat.NotebookNode, url: str) -> nbformat.NotebookNode:
    """The notebook with its Binder launch link under the title (a copy's first cell is edited)."""
    link = f"[▶ Run this chapter on Binder]({url}) · [all chapters](index.md)"
    first = nb.cells[0]
    if first.cell_type == "markdown" and first.source.startswith("# "):
        head, _, rest = first.source.partition("\n")
        first.source = f"{head}\n\n{link}\n{rest}"
    else:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(link))
    return nb


def index_page(entries: list[tuple[str, str]], repo: str) -> str:
    """The front page: what the course is, the chapters with their Binder links, the table of contents."""
    rows = "\n".join(f"| [{name}]({stem}.ipynb) | [launch]({binder_url(stem + '.ipynb', repo)}) |"
                     for stem, name in entries)
    toc = "\n".join(stem for stem, _ in entries)
    return f"""# wmdist: distributed training of world models, run for real

A course in which every experiment runs on real processes: gloo ranks on one CPU, every byte
they send counted and compared with its formula, every result compared with a single-device
run. These pages show the notebooks as last executed, outputs included; to run them, open a
chapter on Binder (nothing to install) or follow the repository's README.

[▶ Open the course on Binder]({binder_url(None, repo)})

| chapter | run it |
|---|---|
{rows}

```{{toctree}}
:maxdepth: 1
:caption: Chapters
:hidden:

{toc}
```
"""


def build(selected: list[str] | None = None, out: Path = BUILD / "site", notebooks: Path = NOTEBOOKS) -> Path:
    """Build the site into `out` (its generated sources beside it, in `out`-src); return the index page's path."""
    from sphinx.cmd.build import build_main

    repo = binder_repo()
    out = out.resolve()
    src, doctrees = out.with_name(out.name + "-src"), out.with_name(out.name + "-doctrees")
    for folder in (src, out, doctrees):
        shutil.rmtree(folder, ignore_errors=True)
    src.mkdir(parents=True)
    entries = []
    for path in chapters(selected, notebooks):
        nb = nbformat.read(path, as_version=4)
        entries.append((path.stem, title(nb)))
        nbformat.write(with_launch_link(nb, binder_url(path.name, repo)), src / path.name)
    (src / "index.md").write_text(index_page(entries, repo), encoding="utf-8")
    (src / "conf.py").write_text(CONF.format(tools=str(Path(__file__).resolve().parent)), encoding="utf-8")
    (src / "_static").mkdir()
    (src / "_static" / "wmdist.css").write_text(CSS, encoding="utf-8")
    code = build_main(["-b", "html", "-q", "-W", "--keep-going", "-d", str(doctrees),
                       str(src), str(out)])
    if code:
        raise SystemExit(f"sphinx-build failed (exit {code}); its messages are above")
    return out / "index.html"


def readme_block(repo: str) -> str:
    """The README's Binder link definitions (markdown reference links: one per chapter, and the badge's)."""
    note = f"{BEGIN} (written by `python tools/build_site.py --readme` from [tool.wmdist] binder-repo) -->"
    lines = [note, f"[binder]: {binder_url(None, repo)}"]
    lines += [f"[binder-{p.stem[:2]}]: {binder_url(p.name, repo)}" for p in chapters()]
    return "\n".join(lines + [END])


def update_readme() -> bool:
    """Rewrite the README's Binder link block; return whether it changed."""
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    if not found:
        raise SystemExit(f"README.md has no block between '{BEGIN}' and '{END}'")
    new = text[:found.start()] + readme_block(binder_repo()) + text[found.end():]
    readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", nargs="+", metavar="NN", help="build only these chapters (e.g. 00 05)")
    parser.add_argument("--out", type=Path, default=BUILD / "site", help="output folder (default build/site)")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS,
                        help="where the notebooks are (default notebooks/)")
    parser.add_argument("--readme", action="store_true", help="only rewrite the README's Binder links")
    args = parser.parse_args(argv)
    if args.readme:
        print("README.md: Binder links " + ("rewritten" if update_readme() else "already current"))
        return 0
    print(f"site: {build(args.chapters, args.out, args.notebooks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
