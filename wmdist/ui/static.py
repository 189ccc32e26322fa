"""A panel as a reader without a kernel sees it: its picture with alt text, and its numbers, in one HTML block.

Every HTML renderer (nbconvert, the course site, GitHub) shows one representation of an output and
prefers `text/html` to `image/png`, so a panel stores both its picture and its key numbers there.
"""
from __future__ import annotations

import html
import re
from typing import Any

from wmdist.ui.render import figure_alt, img_html


def strip_tags(markup: str) -> str:
    """HTML to one plain line: tags dropped, entities decoded, line breaks kept as '; '."""
    text = re.sub(r"<br\s*/?>|</p>|</tr>", "; ", markup)
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip(" ;")


def alt_text(panel: Any) -> str:
    """What the panel's picture on screen shows, in words: the panel, the view, the figure's own text."""
    what = figure_alt(panel.shown) if panel.shown is not None else "no figure"
    return f"{type(panel).__name__}, view '{panel.selector.value}'. {what}"


def static_html(panel: Any) -> str:
    """The picture on screen (with its alt text), then the key numbers and the last run's status line; the
    error alone after a bad input."""
    if not panel.png:
        parts = [f"<b>{type(panel).__name__}: cannot compute:</b> {html.escape(panel.error)}"]
    else:
        parts = [img_html(panel.png, alt_text(panel)), panel.summary.value]
        if strip_tags(panel.status.value):
            parts.append(panel.status.value)
    return "<div class='wmdist-static'>" + "".join(parts) + "</div>"
