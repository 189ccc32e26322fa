"""The notebook's tables: formula next to ledger per axis, calculator next to measured bytes held (plain text)."""
from __future__ import annotations

from collections.abc import Sequence

from wmdist.costs.mesh import TRAFFIC_AXES
from wmdist.mesh.spec import MeshRun
from wmdist.mesh.patterns import PATTERNS
from wmdist.mesh.step import HELD


def _span(values: Sequence[int]) -> str:
    """'4,096' when every rank has the same value, else 'min..max'."""
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def side_by_side(run: MeshRun) -> str:
    """One row per axis: what travels, messages and bytes per rank per step, from the formula and from the ledger."""
    n = len(run.coords)
    rows = []
    for a in TRAFFIC_AXES:
        f_msg = [p[a].messages for p in run.predicted]
        m_msg = [m[a].messages for m in run.measured]
        f_bytes = [p[a].bytes_sent for p in run.predicted]
        m_bytes = [m[a].bytes_sent for m in run.measured]
        equal = sum(fm == mm and fb == mb for fm, mm, fb, mb in zip(f_msg, m_msg, f_bytes, m_bytes))
        rows.append([a, PATTERNS[a], _span(f_msg), _span(m_msg), _span(f_bytes), _span(m_bytes), f"{equal}/{n}"])
    header = ["axis", "pattern", "messages (formula)", "(ledger)", "bytes sent (formula)", "(ledger)", "equal on"]
    return f"{run.spec.degrees}, one training step, per rank:\n" + _table(header, rows)


def mesh_memory_table(run: MeshRun) -> str:
    """One row per kind: the memory calculator's bytes per rank, and the bytes each rank holds after the step."""
    n = len(run.coords)
    rows = []
    for kind in HELD:
        want = [h[kind] for h in run.held_predicted]
        got = [h[kind] for h in run.held]
        rows.append([kind, _span(want), _span(got), f"{sum(w == g for w, g in zip(want, got))}/{n}"])
    return f"{run.spec.degrees}, bytes held per rank after the step:\n" + _table(
        ["kind", "calculator", "measured", "equal on"], rows)
