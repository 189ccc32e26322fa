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
#
# The rounds run on views of one flat buffer: chunks follow costs.ring_chunk_sizes
# (torch.tensor_split's layout), and rank r owns chunk r after the reduce-scatter.
# Received data lands in place wherever it can, because fresh memory is not free:
# first-touch page faults on a 16 MiB buffer cost as much as sending it.

def _reduce_scatter_rounds(ctx: Context, chunks: list[torch.Tensor], rank: int, n: int, phase: str,
                           group: dist.ProcessGroup | None) -> None:
    """N-1 rounds; round s sends partial chunk (r-s-1) right, receives chunk (r-s-2) from the left and adds it."""
    right, left = (rank + 1) % n, (rank - 1) % n
    scratch = chunks[0].new_empty(max(c.numel() for c in chunks))   # one receive buffer for every round
    for s in range(n - 1):
        out_i, in_i = (rank - s - 1) % n, (rank - s - 2) % n
        incoming = scratch[: chunks[in_i].numel()]
        exchange(ctx, chunks[out_i], right, incoming, left, phase, group)
        chunks[in_i] += incoming


def _all_gather_rounds(ctx: Context, chunks: list[torch.Tensor], rank: int, n: int, phase: str,
                       group: dist.ProcessGroup | None) -> None:
    """N-1 rounds; round s forwards chunk (r-s) right and receives chunk (r-s-1) from the left, in place."""
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        exchange(ctx, chunks[(rank - s) % n], right, chunks[(rank - s - 1) % n], left, phase, group)


def ring_reduce_scatter(ctx: Context, flat: torch.Tensor, phase: str = "reduce-scatter",
                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum a 1-D tensor across the ring; return this rank's chunk of the sum (chunk r).

    N-1 rounds. The input is not modified. The result owns its memory (a copy
    of chunk r), so the full-size working buffer is freed on return: what a
    ZeRO rank holds afterwards is really only its shard.
    """
    group, r, n = _group_info(ctx, group)
    chunks = list(torch.tensor_split(flat.reshape(-1).clone(), n))      # N views of (~G/N,)
    _reduce_scatter_rounds(ctx, chunks, r, n, phase, group)
    return chunks[r].clone()


def ring_all_gather(ctx: Context, chunk: torch.Tensor, sizes: list[int], phase: str = "all-gather",
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's 1-D chunk (rank r holds chunk r of `sizes`).

    N-1 rounds; returns the full 1-D tensor of sum(sizes) elements.
    """
    group, r, n = _group_info(ctx, group)
    if len(sizes) != n or chunk.numel() != sizes[r]:
        raise ValueError(f"rank {r}: chunk of {chunk.numel()} elements does not match sizes {sizes}")
    out = chunk.new_empty(sum(sizes))                                     # (sum(sizes),)
    chunks = list(torch.split(out, sizes))
    chunks[r].copy_(chunk.reshape(-1))
    _all_gather_rounds(ctx, chunks, r, n, phase, group)
    return out


def ring_all_reduce(ctx: Context, tensor: torch.Tensor, phase: str = "all-reduce",
                    group: dist.ProcessGroup | None = None, inplace: bool = False) -> torch.Tensor:
    """Sum `tensor` over all ranks with a ring: reduce-scatter, then all-gather.

    Each rank sends 2(N-1)G/N bytes (exactly costs.ring_allreduce_bytes). Returns
    a new tensor of the input's shape, or, with `inplace=True`, writes the sum
    into `tensor` (which must be contiguous) and returns it, as dist.all_reduce does.
    """
    group, r, n = _group_info(ctx, group)
    if inplace and not tensor.is_contiguous():
        raise ValueError("ring_all_reduce(inplace=True) needs a contiguous tensor")
    out = tensor if inplace else tensor.clone(memory_format=torch.contiguous_format)
    chunks = list(torch.tensor_split(out.view(-1), n))                     # N views of (~G/N,)
    _reduce_scatter_rounds(ctx, chunks, r, n, f"{phase}/reduce-scatter", group)
    _all_gather_rounds(ctx, chunks, r, n, f"{phase}/all-gather", group)
    return out
