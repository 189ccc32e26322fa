"""The notebook's tables: a Report's measured integers next to the formulas, as plain text.

Deterministic text (integers and fixed-width columns), so the notebook can
store it and nbval can compare it.
"""
from __future__ import annotations

from fractions import Fraction

from wmdist.costs import tensor_parallel as costs
from wmdist.course.report import Report


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


def _measured(report: Report, quantity: str, case: str, rank: int) -> int:
    return report.counts(quantity=quantity, case=case, rank=rank)[0].measured


def shape_of(report: Report) -> costs.BlockShape:
    """The block shape a block demo's Report ran with."""
    p = report.params
    return costs.BlockShape(batch=p["batch"], seq=p["seq"], width=p["width"], heads=p["heads"], hidden=p["hidden"])


def ideal_bytes(col: costs.Collective, *, elem_size: int = 4) -> Fraction:
    """The papers' per-rank figure: 2(N-1)/N G for an all-reduce, (N-1)/N G for a reduce-scatter or all-gather."""
    n = len(col.sizes)
    return Fraction((2 if col.op == "all-reduce" else 1) * (n - 1) * col.numel * elem_size, n)


def traffic_table(report: Report, schedule: list[costs.Collective], case: str, *, rank: int = 0) -> str:
    """One row per collective: payload (elements), bytes rank `rank` sent (ledger), the exact ring formula,
    and the papers' figure: 2(N-1)G/N for an all-reduce, (N-1)G/N for a reduce-scatter or all-gather."""
    rows = [("collective", "payload", "ledger", "ring formula", "papers' rule")]
    for col in schedule:
        if len(col.sizes) == 1:
            continue
        measured = report.counts(quantity="bytes sent", phase=col.phase, case=case, rank=rank)
        rows.append((col.phase, str(col.numel), str(measured[0].measured), str(col.bytes_sent(rank)),
                     str(ideal_bytes(col))))
    total = report.counts(quantity="bytes sent", phase="total", case=case, rank=rank)[0]
    rows.append(("total", "", str(total.measured), str(total.predicted),
                 str(sum((ideal_bytes(c) for c in schedule if len(c.sizes) > 1), Fraction(0)))))
    return _table(rows)


def layouts_table(report: Report, *, rank: int = 0) -> str:
    """One row per MLP layout: collectives by op and bytes sent by rank `rank`, measured and predicted."""
    rows = [("layout", "collectives", "all-reduce", "all-gather", "ledger bytes", "formula bytes")]
    for layout in costs.MLP_LAYOUTS:
        total = report.counts(quantity="bytes sent", phase="total", case=layout, rank=rank)[0]
        rows.append((layout, *(str(_measured(report, q, layout, rank))
                               for q in ("collectives", "all-reduce calls", "all-gather calls")),
                     str(total.measured), str(total.predicted)))
    return _table(rows)


def sequence_table(report: Report, *, rank: int = 0) -> str:
    """SP vs CP side by side: the collectives each runs per step and what rank `rank` sends and keeps."""
    single = report.data.single_saved_bytes
    rows = [("layout", "all-reduce", "reduce-scatter", "all-gather", "bytes sent", "bytes kept", "kept / one device")]
    for layout in ("tp", "sp", "sp-regather", "cp"):
        kept = report.data.saved_bytes[layout][rank]
        rows.append((layout, *(str(_measured(report, f"{op} calls", layout, rank)) for op in costs.OPS),
                     str(report.data.bytes_sent[layout][rank]), str(kept), f"{kept / single:.3f}"))
    return _table(rows)


def layout_memory_table(report: Report, *, layouts: tuple[str, ...] = ("tp", "sp", "sp-regather", "cp")) -> str:
    """Bytes each rank kept for backward, measured and predicted, for each layout."""
    rows = [("layout", "measured per rank", "formula per rank")]
    for layout in layouts:
        rows.append((layout, str(report.measured(quantity="saved activation bytes", case=layout)),
                     str(report.predicted(quantity="saved activation bytes", case=layout))))
    return _table(rows)
