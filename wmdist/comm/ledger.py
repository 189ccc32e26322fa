"""The per-rank ledger, and the one seam through which every communication is counted.

A rank function never writes a record by hand: the counted wrappers in
`wmdist.comm` (point to point, collectives, rings) call `counted(ctx, ...)`
around the torch.distributed call, which notes the op before it starts (so a
hang can be reported with it) and records bytes, messages and phase after it
returns. The costs package predicts the same integers, so a notebook can
compare formula and measurement exactly.

A *round* is one communication step of this rank: a send, a receive, a
paired send+receive (`exchange`) or a collective call. *Messages* are the
messages this rank sent: a receive records none (its message is counted once,
by the rank that sent it), so summed over ranks they count each message once.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Literal, get_args

if TYPE_CHECKING:
    from wmdist.comm.context import Context

COMPLETED = "(completed)"
Kind = Literal["p2p", "collective"]      # a record is a point-to-point message or part of a collective
KINDS: tuple[str, ...] = get_args(Kind)


@dataclass(kw_only=True, frozen=True)
class Record:
    """One communication step as this rank saw it.

    For point-to-point ops the byte counts are exact wire payloads. For a
    built-in collective (`kind == "collective"`) they are the local input and
    output payload: the library picks its own algorithm, so wire bytes are not
    observable from Python.
    """
    op: str
    phase: str
    kind: str           # "p2p" or "collective"
    bytes_sent: int
    bytes_recv: int
    messages: int       # messages this rank sent (a receive records 0: its sender counts it)
    peer: int | None = None


@dataclass(kw_only=True)
class Ledger:
    """Everything one rank communicated during one call, in order."""
    rank: int
    records: list[Record] = field(default_factory=list)
    last_entered: str = ""
    in_progress: bool = False
    on_enter: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def enter(self, description: str) -> None:
        """Note the op about to start (or be waited for), so a hang can be reported with it."""
        self.last_entered, self.in_progress = description, True
        if self.on_enter is not None:
            self.on_enter(description)

    def leave(self) -> None:
        """Mark the last entered op as returned."""
        self.in_progress = False
        if self.on_enter is not None:
            self.on_enter(self.last_status())

    def add(self, record: Record) -> None:
        """Count an op."""
        self.records.append(record)

    def reset(self) -> None:
        """Forget every record (e.g. to keep only the last training step's communication)."""
        self.records.clear()

    def last_status(self) -> str:
        """The last op entered, marked '(completed)' if it returned; '' if none."""
        if not self.last_entered or self.in_progress:
            return self.last_entered
        return f"{self.last_entered} {COMPLETED}"

    def select(self, *, phase: str | None = None, kind: Kind | None = "p2p", prefix: bool = False, since: int = 0
               ) -> list[Record]:
        """Records of one kind (None: both), optionally of one phase (or of every phase starting with it).

        `since`: only records from that index on (len(records) taken before a step: that step's records).
        """
        def phase_ok(r: Record) -> bool:
            return phase is None or (r.phase.startswith(phase) if prefix else r.phase == phase)
        return [r for r in self.records[since:] if (kind is None or r.kind == kind) and phase_ok(r)]

    def totals(self, *, phase: str | None = None, kind: Kind | None = "p2p", prefix: bool = False, since: int = 0
               ) -> dict[str, int]:
        """Summed bytes, messages sent and rounds, optionally for one phase (or phase prefix); `since` as select."""
        rows = self.select(phase=phase, kind=kind, prefix=prefix, since=since)
        return {"bytes_sent": sum(r.bytes_sent for r in rows), "bytes_recv": sum(r.bytes_recv for r in rows),
                "messages": sum(r.messages for r in rows), "rounds": len(rows)}

    def by_phase(self, *, kind: Kind | None = "p2p", since: int = 0) -> dict[str, dict[str, int]]:
        """totals() for every phase that appears, in first-seen order; `since` as select."""
        phases: dict[str, None] = defaultdict(lambda: None)
        for r in self.records[since:]:
            if kind is None or r.kind == kind:
                phases[r.phase]
        return {p: self.totals(phase=p, kind=kind, since=since) for p in phases}

    def __getstate__(self) -> dict:
        # The callback writes to this process's shared status buffer: never ship it.
        return {**self.__dict__, "on_enter": None}


def _describe(op: str, phase: str, sent: int, recv: int, peer: int | None, src: int | None) -> str:
    parts = [op]
    if sent:
        parts.append(f"send {sent} B" + (f" to rank {peer}" if peer is not None else ""))
    if recv:
        parts.append(f"recv {recv} B" + (f" from rank {src}" if src is not None else ""))
    return f"{', '.join(parts)} [phase {phase!r}]"


@contextlib.contextmanager
def counted(ctx: Context, op: str, phase: str, *, sent: int = 0, recv: int = 0, kind: Kind = "collective",
            peer: int | None = None, src: int | None = None, messages: int | None = None) -> Iterator[None]:
    """The counting seam: note `op` on entry, record it once the body returns.

    `sent`/`recv` are this rank's bytes; `messages` defaults to one message
    when anything is sent. On an axis view (`ctx.phase_prefix`, e.g. "tp/")
    the phase is recorded under that prefix unless it already starts with it.
    A body that raises is not recorded, and the
    ledger keeps it as the op in progress, which is what a failure report
    should name.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not phase.startswith(ctx.phase_prefix):      # an axis view (Context.along) names its axis once
        phase = ctx.phase_prefix + phase
    ledger = ctx.ledger
    ledger.enter(_describe(op, phase, sent, recv, peer, src))
    yield
    ledger.add(Record(op=op, phase=phase, kind=kind, bytes_sent=sent, bytes_recv=recv, messages=(1 if sent else 0) if messages is None else messages, peer=peer))
    ledger.leave()
