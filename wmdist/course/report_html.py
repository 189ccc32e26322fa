"""A Report's checks and counts as HTML tables a reader can scan (used by Report._repr_html_).

Checks are grouped by their reason, which is said once above its rows, not
on every row; a group of more than FOLD_ROWS checks is folded under its
verdict and count (opened when one fails), so one report stays about a
screen high; numbers never wrap in the middle. A yes/no check (`fact`) shows
"holds" or "does NOT hold" in place of its numbers.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

NUMBER = "style='text-align:right; white-space:nowrap'"
FOLD_ROWS = 8


def checks_html(checks: Sequence[Any]) -> str:
    """Checks (name, error, tolerance, reason, passed, must_differ) as tables, one per run of equal reasons."""
    esc = html.escape
    groups: list[list[Any]] = []
    for c in checks:
        if groups and groups[-1][0].reason == c.reason:
            groups[-1].append(c)
        else:
            groups.append([c])
    parts = []
    for group in groups:
        rows = "".join(f"<tr><td>{'ok' if c.passed else 'FAIL'}</td><td style='text-align:left'>{esc(c.name)}"
                       f"{_where(c)}</td>{_numbers(c)}</tr>" for c in group)
        table = f"<table><tr><th></th><th>check</th><th>error</th><th>tolerance</th></tr>{rows}</table>"
        failed = sum(not c.passed for c in group)
        head = (f"<b>{'all ok' if not failed else f'{failed} FAIL'}</b>, {len(group)} check(s). "
                f"<i>Why this tolerance:</i> {esc(group[0].reason)}")
        if len(group) > FOLD_ROWS:
            parts.append(f"<details{' open' if failed else ''}><summary>{head}</summary>{table}</details>")
        else:
            parts.append(f"<p style='margin-bottom:2px'>{head}</p>{table}")
    return "\n".join(parts)


def counts_html(groups: Sequence[Sequence[Any]]) -> str:
    """Exact counts (label, measured, predicted, passed), one row per quantity with its per-rank lists."""
    esc = html.escape
    rows = "".join(f"<tr><td>{'ok' if all(r.passed for r in g) else 'FAIL'}</td>"
                   f"<td style='text-align:left'>{esc(g[0].label)}</td><td {NUMBER}>{[r.measured for r in g]}</td>"
                   f"<td {NUMBER}>{[r.predicted for r in g]}</td></tr>" for g in groups)
    return ("<table><tr><th></th><th>exact count</th><th>measured per rank</th><th>predicted per rank</th></tr>"
            f"{rows}</table>")


def _where(check: Any) -> str:
    """Where a check's error was largest, small after its name (empty when the demo did not say)."""
    return f" <small>(worst: {html.escape(check.detail)})</small>" if check.detail else ""


def _numbers(check: Any) -> str:
    """The error and tolerance cells of a check's row (one cell saying whether it holds, for a yes/no check)."""
    if check.fact:
        return f"<td colspan=2>{'holds' if check.passed else 'does NOT hold'}</td>"
    sign = "&ge;" if check.must_differ else "&le;"
    return f"<td {NUMBER}>{check.error:.3g}</td><td {NUMBER}>{sign} {check.tolerance:.3g}</td>"
