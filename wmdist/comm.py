"""Counted communication: the per-rank Ledger and the ring collectives built on it.

Every send, receive and collective a demo performs goes through the functions
here, which record what this rank moved (bytes, messages, rounds, by phase)
before calling torch.distributed. The costs module predicts the same integers,
so a notebook can compare formula and measurement exactly.

A *round* is one communication step of this rank: a send, a receive, a paired
send+receive (`exchange`) or a collective call.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist


COMPLETED = "(completed)"


@dataclass(frozen=True)
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
    messages: int       # messages sent
    peer: int | None = None


@dataclass
class Ledger:
    """Everything one rank communicated during one call, in order."""
    rank: int
    records: list[Record] = field(default_factory=list)
    last_entered: str = ""
    in_progress: bool = False
    on_enter: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def enter(self, description: str) -> None:
        """Note the op about to start, so a hang can be reported with it."""
        self.last_entered, self.in_progress = description, True
        if self.on_enter is not None:
            self.on_enter(description)

    def add(self, record: Record) -> None:
        """Count a finished op (and mark the last entered op as completed)."""
        self.records.append(record)
        self.in_progress = False
        if self.on_enter is not None:
            self.on_enter(self.last_status())

    def last_status(self) -> str:
        """The last op entered, marked '(completed)' if it returned; '' if none."""
        if not self.last_entered or self.in_progress:
            return self.last_entered
        return f"{self.last_entered} {COMPLETED}"

    def totals(self, phase: str | None = None, kind: str = "p2p") -> dict[str, int]:
        """Summed bytes, messages and rounds, optionally for one phase."""
        rows = [r for r in self.records if r.kind == kind and (phase is None or r.phase == phase)]
        return {
            "bytes_sent": sum(r.bytes_sent for r in rows),
            "bytes_recv": sum(r.bytes_recv for r in rows),
            "messages": sum(r.messages for r in rows),
            "rounds": len(rows),
        }

    def by_phase(self, kind: str = "p2p") -> dict[str, dict[str, int]]:
        """totals() for every phase that appears, in first-seen order."""
        phases: dict[str, None] = defaultdict(lambda: None)
        for r in self.records:
            if r.kind == kind:
                phases[r.phase]
        return {p: self.totals(p, kind) for p in phases}

    def __getstate__(self) -> dict:
        # The callback writes to this process's shared buffer: never ship it.
        return {**self.__dict__, "on_enter": None}


@dataclass
class Context:
    """What a rank function receives: who it is and how to talk.

    `group` is the default process group (None means the world group);
    `groups` holds named subgroups a demo creates (e.g. {"tp": ..., "dp": ...}).
    """
    rank: int
    world_size: int
    ledger: Ledger
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "gloo"
    group: dist.ProcessGroup | None = None
    groups: dict[str, dist.ProcessGroup] = field(default_factory=dict)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _global(group: dist.ProcessGroup | None, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _group_info(ctx: Context, group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup | None, int, int]:
    group = ctx.group if group is None else group
    if group is None:
        return None, ctx.rank, ctx.world_size
    return group, dist.get_rank(group), dist.get_world_size(group)


# --- point to point -----------------------------------------------------------

def send(ctx: Context, tensor: torch.Tensor, dst: int, phase: str = "send",
         group: dist.ProcessGroup | None = None) -> None:
    """Blocking send to group rank `dst`, counted."""
    group, _, _ = _group_info(ctx, group)
    n = _nbytes(tensor)
    ctx.ledger.enter(f"send {n} B to rank {dst} [phase {phase!r}]")
    dist.send(tensor.contiguous(), _global(group, dst), group=group)
    ctx.ledger.add(Record("send", phase, "p2p", n, 0, 1, dst))


def recv(ctx: Context, tensor: torch.Tensor, src: int, phase: str = "recv",
         group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Blocking receive into `tensor` from group rank `src`, counted."""
    group, _, _ = _group_info(ctx, group)
    n = _nbytes(tensor)
    ctx.ledger.enter(f"recv {n} B from rank {src} [phase {phase!r}]")
    dist.recv(tensor, _global(group, src), group=group)
    ctx.ledger.add(Record("recv", phase, "p2p", 0, n, 0, src))
    return tensor


def exchange(ctx: Context, send_tensor: torch.Tensor, dst: int, recv_tensor: torch.Tensor, src: int,
             phase: str = "exchange", group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send to `dst` while receiving from `src`: one round of a ring.

    The send is posted asynchronously first so that a ring in which every
    rank sends and receives at once cannot deadlock.
    """
    group, _, _ = _group_info(ctx, group)
    out, inn = _nbytes(send_tensor), _nbytes(recv_tensor)
    ctx.ledger.enter(f"exchange: send {out} B to rank {dst}, recv {inn} B from rank {src} [phase {phase!r}]")
    request = dist.isend(send_tensor.contiguous(), _global(group, dst), group=group)
    dist.recv(recv_tensor, _global(group, src), group=group)
    request.wait()
    ctx.ledger.add(Record("exchange", phase, "p2p", out, inn, 1, dst))
    return recv_tensor


# --- built-in collectives, counted by payload -------------------------------------

def all_reduce(ctx: Context, tensor: torch.Tensor, phase: str = "all_reduce",
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """torch.distributed.all_reduce (sum, in place), recorded as a collective."""
    group, _, _ = _group_info(ctx, group)
    n = _nbytes(tensor)
    ctx.ledger.enter(f"all_reduce {n} B [phase {phase!r}]")
    dist.all_reduce(tensor, group=group)
    ctx.ledger.add(Record("all_reduce", phase, "collective", n, n, 1))
    return tensor


def barrier(ctx: Context, phase: str = "barrier", group: dist.ProcessGroup | None = None) -> None:
    """torch.distributed.barrier, recorded so a hang inside it is named."""
    group, _, _ = _group_info(ctx, group)
    ctx.ledger.enter(f"barrier [phase {phase!r}]")
    dist.barrier(group=group)
    ctx.ledger.add(Record("barrier", phase, "collective", 0, 0, 0))


# --- hand-written ring collectives ------------------------------------------------

def ring_reduce_scatter(ctx: Context, flat: torch.Tensor, phase: str = "reduce-scatter",
                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum a 1-D tensor across the ring; return this rank's chunk of the sum.

    Chunks follow costs.ring_chunk_sizes (tensor_split layout), and rank r ends
    with chunk r. Round s: send partial chunk (r-s-1) to the right, receive
    chunk (r-s-2) from the left and add it. N-1 rounds.
    """
    group, r, n = _group_info(ctx, group)
    chunks = [c.clone() for c in torch.tensor_split(flat.reshape(-1), n)]   # N x (~G/N,)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        out_i, in_i = (r - s - 1) % n, (r - s - 2) % n
        buf = torch.empty_like(chunks[in_i])
        exchange(ctx, chunks[out_i], right, buf, left, phase, group)
        chunks[in_i] += buf
    return chunks[r]


def ring_all_gather(ctx: Context, chunk: torch.Tensor, sizes: list[int], phase: str = "all-gather",
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's 1-D chunk (rank r holds chunk r of `sizes`).

    Round s: send chunk (r-s) to the right, receive chunk (r-s-1) from the
    left. N-1 rounds; returns the full 1-D tensor of sum(sizes) elements.
    """
    group, r, n = _group_info(ctx, group)
    if len(sizes) != n or chunk.numel() != sizes[r]:
        raise ValueError(f"rank {r}: chunk of {chunk.numel()} elements does not match sizes {sizes}")
    chunks = [chunk.reshape(-1) if i == r else chunk.new_empty(sizes[i]) for i in range(n)]
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        exchange(ctx, chunks[(r - s) % n], right, chunks[(r - s - 1) % n], left, phase, group)
    return torch.cat(chunks)


def ring_all_reduce(ctx: Context, tensor: torch.Tensor, phase: str = "all-reduce",
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` over all ranks with a ring: reduce-scatter, then all-gather.

    Each rank sends 2(N-1)G/N bytes (exactly costs.ring_allreduce_bytes).
    Returns a new tensor of the input's shape; the input is not modified.
    """
    _, _, n = _group_info(ctx, group)
    flat = tensor.reshape(-1)
    sizes = [c.numel() for c in torch.tensor_split(flat, n)]
    mine = ring_reduce_scatter(ctx, flat, f"{phase}/reduce-scatter", group)
    return ring_all_gather(ctx, mine, sizes, f"{phase}/all-gather", group).reshape(tensor.shape)
