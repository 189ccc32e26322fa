"""The course site: built from the stored notebooks, and read page by page in headless Chromium.

The whole site (all twelve chapters) is built once into a temporary folder by tools/build_site.py
(a few seconds: nothing is executed), then served on 127.0.0.1 and crawled from its index.
Every page reached must load with HTTP 200, every image on it must load (requests that leave
this machine are refused, so an image from elsewhere fails too), every link must resolve (a
page or file of the site, an anchor that exists on its page, or an https link to a known
host), and no page may show a Python traceback, a widget error, a formula left as TeX or a line
of code that scrolls sideways out of its box. Each chapter page carries its Binder launch link
and at least as many images as its notebook stores PNGs; formulas are MathML, drawn by Chromium
itself with the network refused (a stacked fraction is taller than a line of text).

Needs the `site` extra (part of `test`), Debian's `chromium` and the `playwright` package; like
tests/test_browser.py it skips without the browser tools, and fails under CI=true.
"""
from __future__ import annotations

import functools
import http.server
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import nbformat
import pytest

from conftest import free_port
from test_browser import CHROMIUM_ARGS, _tools

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import build_site  # noqa: E402  (a script in tools/, not a package)

# myst-parser 5 still reads a Sphinx attribute that Sphinx 11 will drop: not this project's to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Check CHANGES for Sphinx API")
EXTERNAL_HOSTS = {"mybinder.org", "github.com", "www.sphinx-doc.org", "alabaster.readthedocs.io"}
BAD_TEXT = ("Traceback (most recent call last)", "Error displaying widget", "model not found")
# TeX a reader would see if formulas were not rendered (outside code, where a backslash is Python's).
RAW_TEX = r"\\(frac|alpha|beta|cdot|times|text|sum|sqrt|left|right|le|ge|lceil|log|ell|qquad)(?![a-zA-Z])|\$\$"
PROSE_TEXT = """() => {
    const skip = n => n.parentElement.closest('pre, code, math, script, style');
    const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT,
        {acceptNode: n => skip(n) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    let out = ''; while (walk.nextNode()) out += walk.currentNode.textContent + ' '; return out; }"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:      # keep the test's output to what fails
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The whole site, built from notebooks/ into a temporary folder (its time is printed, not judged: a loaded
    machine may take minutes for what takes 20 s on a quiet one)."""
    pytest.importorskip("myst_nb", reason="the site needs the `site` extra: pip install -e '.[site]'")
    start = time.perf_counter()
    index = build_site.build(out=tmp_path_factory.mktemp("course") / "site")
    seconds = time.perf_counter() - start
    print(f"the site built in {seconds:.0f} s")
    return index.parent


def test_every_chapter_has_a_page_with_its_launch_link_and_its_figures(site):
    chapters = build_site.chapters()
    assert len(chapters) == 12
    index = (site / "index.html").read_text(encoding="utf-8")
    for path in chapters:
        page = site / f"{path.stem}.html"
        assert page.is_file(), f"no page for {path.name}"
        html = page.read_text(encoding="utf-8")
        launch = build_site.binder_url(path.name).replace("&", "&amp;")
        assert launch in html and launch in index, f"{path.stem}: its Binder link is missing"
        stored = sum("image/png" in out.get("data", {}) for cell in nbformat.read(path, as_version=4).cells
                     if cell.cell_type == "code" for out in cell.outputs)
        shown = len(re.findall(r"<img\b", html))
        assert shown >= stored, f"{path.stem}: {stored} stored PNGs but {shown} images on its page"


def _check_page(page, url: str, pages: dict[str, str], origin: str, anchors: dict[str, set[str]],
                wanted: list[tuple[str, str, str]]) -> list[str]:
    """Problems on the page at `url`. Adds the site pages it links to `pages` (url -> where it was linked), its
    element ids to `anchors[url]`, and each link's anchor to `wanted` as (page, anchor, linked from)."""
    problems = []
    answer = page.goto(url, wait_until="load")
    if answer is None or answer.status != 200:
        return [f"{url}: HTTP {answer.status if answer else 'no answer'} (linked from {pages[url]})"]
    broken = page.evaluate("""() => [...document.images]
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'))""")
    problems += [f"{url}: image does not load: {src}" for src in broken]
    text = page.inner_text("body")
    problems += [f"{url}: shows {bad!r}" for bad in BAD_TEXT if bad in text]
    problems += [f"{url}: a formula is shown as TeX: ...{m.string[max(0, m.start() - 40):m.end() + 40]}..."
                 for m in list(re.finditer(RAW_TEX, page.evaluate(PROSE_TEXT)))[:3]]
    wide = page.evaluate("""() => [...document.querySelectorAll('pre')].filter(p => p.scrollWidth > p.clientWidth + 1)
        .map(p => p.innerText.split('\\n').reduce((a, b) => a.length >= b.length ? a : b))""")
    problems += [f"{url}: a code box scrolls sideways, its longest line: {line[:100]!r}" for line in wide]
    anchors[url] = set(page.evaluate("() => [...document.querySelectorAll('[id]')].map(e => e.id)"))
    for href in page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))"):
        target, fragment = urldefrag(urljoin(url, href))
        parsed = urlparse(target)
        if target.startswith(origin):
            if fragment:
                wanted.append((target, fragment, url))
            if target.endswith((".html", "/")):
                pages.setdefault(target, url)
            elif page.request.get(target).status != 200:
                problems.append(f"{url}: link to a missing file {href}")
        elif parsed.scheme != "https" or parsed.hostname not in EXTERNAL_HOSTS:
            problems.append(f"{url}: link leaves the site for an unexpected place: {href}")
    return problems


def test_every_page_opens_in_chromium_with_its_images_and_links(site):
    chromium, sync_playwright = _tools()
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{port}/"
    pages, problems, seen = {origin + "index.html": "(start)"}, [], set()
    anchors: dict[str, set[str]] = {}
    wanted: list[tuple[str, str, str]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1320, "height": 900})
            page.set_default_timeout(60_000)
            # Nothing leaves this machine: a script or image from elsewhere (MathJax's CDN) is refused.
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(origin)
                       else route.abort())
            while len(seen) < len(pages):
                url = next(u for u in pages if u not in seen)
                seen.add(url)
                problems += _check_page(page, url, pages, origin, anchors, wanted)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    problems += [f"{source}: link to #{fragment} on {target}, which has no such element"
                 for target, fragment, source in wanted if fragment not in anchors.get(target, set())]
    chapter_pages = {u for u in seen if re.search(r"/\d\d_\w+\.html$", u)}
    assert len(chapter_pages) == 12, f"the crawl reached {len(chapter_pages)} chapter pages: {sorted(seen)}"
    assert not problems, "\n".join(problems)


def test_readme_binder_links_follow_the_one_place_the_repository_is_named():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert build_site.readme_block(build_site.binder_repo()) in readme, \
        "README's Binder links are stale: run `python tools/build_site.py --readme`"
    for path in build_site.chapters():
        assert f"[binder-{path.stem[:2]}]" in readme.split(build_site.BEGIN)[0], f"no Binder link for {path.stem}"
    assert "](https://mybinder.org/v2/" not in readme       # every link goes through the generated block


def test_formulas_are_drawn_as_mathml_with_the_network_refused(site, tmp_path):
    """Chapter 05's bubble formula, a stacked fraction, laid out by Chromium's own MathML engine: the fraction's
    box is 1.67 times its font size here (numerator over denominator); the same elements laid out as a line of
    text measure 1.07, and TeX left as text has no fraction element at all. 1.4 lies between the two."""
    html = (site / "05_pipeline_parallel.html").read_text(encoding="utf-8")
    assert "mathjax" not in re.sub(r"mathjax_ignore", "", html.lower()), "the page still loads MathJax"
    chromium, sync_playwright = _tools()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1320, "height": 900})
        refused: list[str] = []
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                   else (refused.append(route.request.url), route.abort()))
        page.goto((site / "05_pipeline_parallel.html").as_uri(), wait_until="load")
        boxes = page.evaluate("""() => [...document.querySelectorAll('math[display="block"] mfrac')].map(f => {
                f.scrollIntoView();
                const r = f.getBoundingClientRect();
                return {width: r.width, height: r.height, font: parseFloat(getComputedStyle(f).fontSize)}; })""")
        page.screenshot(path=str(tmp_path / "05_formula.png"))     # for a person to look at: pytest's tmp folder
        browser.close()
    assert boxes, "no displayed fraction on chapter 05's page"
    for box in boxes:
        assert box["width"] > 0 and box["height"] > 1.4 * box["font"], f"a fraction is not laid out as one: {box}"
    assert not refused, f"the page asked the network for {refused}"
