"""The nonlinear cell on N ranks: what splitting time costs, and which axis splits for free.

Three schemes, run one after another on the same ranks and inputs:

  from zero:  rank r rolls out its time chunk from a zero state (rank 0 from
              h0). No communication, all ranks busy at once, and wrong: the
              pitfall the text names, with its error measured step by step.
  hand-off:   rank r waits for the true state leaving chunk r - 1, rolls out
              its chunk, sends its last state on. Exact (bit for bit), and
              sequential: rank r idles until every rank before it is done.
  episodes:   rank r takes its share of the independent episodes (batch rows)
              and rolls them out over all T steps. Exact, parallel, and no
              communication at all: the axis that splits.

A real world model's core costs far more per step than this small GRU (which
takes microseconds, less than one message), so each step also sleeps
`step_seconds` per episode it processes: the timelines then show what the
schedule does, not gloo's latency. Sleeping ranks do not compete for the CPU.

`CellInputs` is the validated cell, inputs and states (refused before any
process starts); `boundaries_rank` runs on it and returns a `BoundaryRank`.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from wmdist.comm import Context, barrier, recv, send
from wmdist.costs.scan import time_chunk_sizes
from wmdist.costs.validate import require_choice, require_int, require_real
from wmdist.runtime import run
from wmdist.scan.cell import GRUCell, rollout
from wmdist.base.spans import Span

Scheme = Literal["from zero", "hand-off", "episodes"]   # the three ways this file splits the cell's work
SCHEMES: tuple[Scheme, ...] = get_args(Scheme)


class CountingStep:
    """The cell as a step function that counts its calls and sleeps `step_seconds` per episode per call."""

    def __init__(self, cell: GRUCell, step_seconds: float) -> None:
        self.cell, self.step_seconds, self.calls = cell, step_seconds, 0

    def __call__(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.step_seconds:
            time.sleep(self.step_seconds * h.shape[0])
        return self.cell(h, x)


def check_inputs(cell: GRUCell, x: torch.Tensor, h0: torch.Tensor, world_size: int, *, step_seconds: float,
                 min_world_size: int = 1) -> int:
    """One clear ValueError for a bad world size, shape or state size, before any process starts."""
    n = require_int("world_size", world_size, min_world_size)
    require_real("step_seconds", step_seconds, low=0.0, high=1.0)
    if not isinstance(cell, GRUCell):
        raise TypeError(f"cell must be a GRUCell, got {type(cell).__name__}")
    if x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"x must be (B, T, m) with T >= 1, got shape {tuple(x.shape)}")
    if h0.dim() != 2 or h0.shape[0] != x.shape[0]:
        raise ValueError(f"h0 must be (B, n) with x's batch B={x.shape[0]}, got shape {tuple(h0.shape)}")
    if h0.shape[1] != cell.state_size or x.shape[2] != cell.input_size:
        raise ValueError(f"state size mismatch: the cell takes n={cell.state_size}, m={cell.input_size}; "
                         f"got h0 with n={h0.shape[1]}, x with m={x.shape[2]}")
    time_chunk_sizes(x.shape[1], n)                            # world_size <= T, or "chunks must be <= steps"
    if n > x.shape[0]:
        raise ValueError(f"world_size must be <= batch B={x.shape[0]} (every rank needs an episode), got {n}")
    return n


@dataclass(frozen=True, kw_only=True)
class CellInputs:
    """A cell, inputs x (B, T, m) and initial states h0 (B, n) for N ranks, checked by `check_inputs` when built."""
    world_size: int
    cell: GRUCell
    x: torch.Tensor
    h0: torch.Tensor
    step_seconds: float = 0.0
    min_world_size: int = 1

    def __post_init__(self) -> None:
        check_inputs(self.cell, self.x, self.h0, self.world_size, step_seconds=self.step_seconds,
                     min_world_size=self.min_world_size)


def time_chunk(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s steps of x (B, T, m): (B, L_r, m), first T % N chunks one step longer."""
    return torch.split(x, time_chunk_sizes(x.shape[1], world_size), dim=1)[rank]


@dataclass(kw_only=True, frozen=True)
class SchemeRun:
    """One rank's part in one scheme: its states, its spans (absolute clock), its cell calls and traffic."""
    states: torch.Tensor          # (B, L_r, n) for a time split, (B_r, T, n) for episodes
    spans: tuple[Span, ...]
    calls: int
    bytes_sent: int
    bytes_recv: int


def _timed(spans: list[Span], rank: int, kind: str, label: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    start = time.perf_counter()
    out = fn()
    spans.append(Span(row=rank, start=start, end=time.perf_counter(), kind=kind, label=label))
    return out


def _scheme(ctx: Context, name: str, cell: GRUCell, x: torch.Tensor, h0: torch.Tensor,
            step_seconds: float) -> SchemeRun:
    r, n = ctx.rank, ctx.world_size
    step, spans = CountingStep(cell, step_seconds), []
    barrier(ctx, phase=f"{name}: start together")
    if name == "episodes":
        xs, hs = torch.tensor_split(x, n, dim=0)[r], torch.tensor_split(h0, n, dim=0)[r]
        states = _timed(spans, r, "compute", "my episodes, all steps", lambda: rollout(step, xs, hs))
    else:
        xs = time_chunk(x, r, n)
        if name == "from zero":
            start = h0 if r == 0 else torch.zeros_like(h0)
        else:
            start = h0 if r == 0 else _timed(spans, r, "idle", "wait for boundary state",
                                             lambda: recv(ctx, torch.empty_like(h0), r - 1, phase=name))
        states = _timed(spans, r, "compute", "my chunk", lambda: rollout(step, xs, start))
        if name == "hand-off" and r < n - 1:
            _timed(spans, r, "send", "boundary state", lambda: send(ctx, states[:, -1], r + 1, phase=name))
    sent = ctx.ledger.totals(phase=name)
    return SchemeRun(states=states, spans=tuple(spans), calls=step.calls, bytes_sent=sent["bytes_sent"], bytes_recv=sent["bytes_recv"])


@dataclass(frozen=True)
class BoundaryRank:
    """One rank's part in the three schemes, in SCHEMES order."""
    from_zero: SchemeRun
    hand_off: SchemeRun
    episodes: SchemeRun

    def __getitem__(self, name: Scheme) -> SchemeRun:
        """The run of scheme `name` (one of SCHEMES)."""
        return (self.from_zero, self.hand_off, self.episodes)[SCHEMES.index(require_choice("scheme", name, SCHEMES))]


def boundaries_rank(ctx: Context, inputs: CellInputs) -> BoundaryRank:
    """Rank function: the three schemes in turn, each started together after a barrier."""
    return BoundaryRank(*(_scheme(ctx, name, inputs.cell, inputs.x, inputs.h0, inputs.step_seconds)
                          for name in SCHEMES))


def relative(spans: list[Span]) -> list[Span]:
    """Spans shifted so the earliest starts at 0 (perf_counter is one clock for all processes on a machine)."""
    t0 = min((s.start for s in spans), default=0.0)
    return [Span(row=s.row, start=s.start - t0, end=s.end - t0, kind=s.kind, label=s.label) for s in spans]


def run_boundaries(world_size: int, cell: GRUCell, x: torch.Tensor, h0: torch.Tensor, *,
                   step_seconds: float = 0.0) -> list[BoundaryRank]:
    """Validate, then run the three schemes on N ranks: result[rank][scheme].

    A helper for tests: it calls `runtime.run` itself; the demo is cell_demos.CELL_DEMO.
    """
    inputs = CellInputs(world_size=world_size, cell=cell, x=x, h0=h0, step_seconds=step_seconds)
    return run(boundaries_rank, inputs.world_size, inputs)


def stitch(results: list[BoundaryRank], name: Scheme) -> torch.Tensor:
    """The whole (B, T, n) trajectory of one scheme: chunks joined along time, episodes along the batch."""
    return torch.cat([r[name].states for r in results], dim=0 if name == "episodes" else 1)


def timeline(results: list[BoundaryRank], name: Scheme) -> list[Span]:
    """Every rank's spans of one scheme, from 0 at its first span."""
    return relative([s for r in results for s in r[name].spans])


def waits(results: list[BoundaryRank], *, name: Scheme = "hand-off") -> list[float]:
    """Seconds each rank spent waiting for its boundary state in one scheme."""
    return [sum((s.duration for s in r[name].spans if s.kind == "idle"), 0.0) for r in results]
