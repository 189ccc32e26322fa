"""A nonlinear (Dreamer-style) recurrent cell, and why its time axis does not split like a scan.

h_t = (1 - u) * h_{t-1} + u * tanh(W_c [r * h_{t-1}, x_t] + c_c), with update
and reset gates u, r = sigmoid(W [h_{t-1}, x_t] + c). Two steps of this cell
do not compose into a step of the same small form, so there is no chunk
summary to exchange. What this file shows instead, single process:
  chunk_from_zero: every chunk after the first starts from zeros: wrong;
  picard:          sweeps that restart every chunk from the previous sweep's
                   boundary states: exact after at most N sweeps, at the price
                   of redoing all T steps per sweep;
  split_episodes:  the batch axis (independent episodes or particles) is the
                   exact parallel axis: each rank rolls out its own rows.
Any step callable (h (B, n), x_t (B, m)) -> (B, n) works where a cell does.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from wmdist.costs.scan import time_chunk_sizes
from wmdist.costs.validate import require_int, require_real

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # (h (B, n), x_t (B, m)) -> h (B, n)


@dataclass(frozen=True)
class GRUCell:
    """A GRU-style recurrent core: three (n, n + m) weight matrices and their biases."""
    w_update: torch.Tensor   # (n, n + m)
    w_reset: torch.Tensor    # (n, n + m)
    w_cand: torch.Tensor     # (n, n + m)
    bias: torch.Tensor       # (3, n): update, reset, candidate

    def __post_init__(self) -> None:
        n, width = self.w_update.shape
        if width <= n or any(w.shape != (n, width) for w in (self.w_reset, self.w_cand)):
            raise ValueError(f"weights must all be (n, n + m) with m >= 1, got {self.w_update.shape}, "
                             f"{self.w_reset.shape}, {self.w_cand.shape}")
        if self.bias.shape != (3, n):
            raise ValueError(f"bias must be (3, n) = {(3, n)}, got {tuple(self.bias.shape)}")

    @classmethod
    def seeded(cls, state_size: int, input_size: int, *, seed: int = 0, scale: float = 1.0,
               dtype: torch.dtype = torch.float64) -> GRUCell:
        """A cell with weights ~ N(0, scale^2 / (n + m)) and biases ~ N(0, 0.1^2) from `seed`."""
        n = require_int("state_size", state_size, 1)
        width = n + require_int("input_size", input_size, 1)
        s = require_real("scale", scale) / width ** 0.5
        g = torch.Generator().manual_seed(require_int("seed", seed, 0))
        w = [torch.randn(n, width, generator=g, dtype=torch.float64) * s for _ in range(3)]
        bias = torch.randn(3, n, generator=g, dtype=torch.float64) * 0.1
        return cls(*(t.to(dtype) for t in (*w, bias)))

    @property
    def state_size(self) -> int:
        return self.w_update.shape[0]

    @property
    def input_size(self) -> int:
        return self.w_update.shape[1] - self.w_update.shape[0]

    def __call__(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One step: h (B, n), x_t (B, m) -> next h (B, n)."""
        hx = torch.cat([h, x], dim=-1)                                  # (B, n + m)
        u = torch.sigmoid(hx @ self.w_update.T + self.bias[0])          # (B, n)
        r = torch.sigmoid(hx @ self.w_reset.T + self.bias[1])           # (B, n)
        cand = torch.tanh(torch.cat([r * h, x], dim=-1) @ self.w_cand.T + self.bias[2])
        return (1 - u) * h + u * cand


def lipschitz_bound(cell: GRUCell) -> float:
    """A bound L on how much one step can stretch a state difference, max norm, states in [-1, 1].

    Row sums of the Jacobian: the update gate moves h by at most |c - h| <= 2
    times sigmoid' <= 1/4 times |W_u(h part)|; the candidate path gives
    K = |W_c(h part)| (1 + |W_r(h part)| / 4); (1 - u) + u K <= max(1, K).
    Norms are max row sums of |W| over the h columns.
    """
    n = cell.state_size
    norm = [float(w[:, :n].abs().sum(dim=1).max()) for w in (cell.w_update, cell.w_reset, cell.w_cand)]
    return max(1.0, norm[2] * (1 + norm[1] / 4)) + norm[0] / 2


def reordering_bound(cell: GRUCell, steps: int, x_max: float, unit_roundoff: float, *, ulps: float = 4.0) -> float:
    """A bound on |difference| between two rollouts (|h0| <= 1) whose matrix products sum in other orders.

    Why batch-split rollouts are not bit-identical: the CPU's matrix kernel
    picks its summation by the number of rows. States stay in [-1, 1] (each
    is a convex mix of the last one and a tanh). One step's local error is at
    most e: each pre-activation is a dot product of n + m + 1 terms
    (gamma(n + m + 1) times its absolute sum), sigmoid' <= 1/4, tanh' <= 1, and
    each sigmoid/tanh is assumed within `ulps` units in the last place (SLEEF's
    documented 1-3.5). Two runs part by at most 2e per step, and a gap
    grows by at most lipschitz_bound per step: 2e (1 + L + ... + L^(T-1)).
    """
    t = require_int("steps", steps, 1)
    u = require_real("unit_roundoff", unit_roundoff)
    n, k = cell.state_size, cell.state_size + cell.input_size
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    scale = max(1.0, require_real("x_max", x_max))

    def absolute_sum(w: torch.Tensor, row: int) -> float:          # bound on sum |W| |[h, x]| + |bias|
        return float(w.abs().sum(dim=1).max()) * scale + float(cell.bias[row].abs().max())

    d_update = gamma * absolute_sum(cell.w_update, 0) / 4 + ulps * u
    d_reset = gamma * absolute_sum(cell.w_reset, 1) / 4 + ulps * u
    d_cand = float(cell.w_cand[:, :n].abs().sum(dim=1).max()) * (d_reset + u) + gamma * absolute_sum(
        cell.w_cand, 2) + ulps * u
    local = 2 * d_update + d_cand + 4 * u                          # (1 - u) h + u c: four roundings
    lip = lipschitz_bound(cell)
    return 2 * local * sum(lip ** j for j in range(t))


def _check(x: torch.Tensor, h0: torch.Tensor, cell: Step | None = None) -> None:
    if x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"x must be (B, T, m) with T >= 1, got shape {tuple(x.shape)}")
    if h0.dim() != 2 or h0.shape[0] != x.shape[0]:
        raise ValueError(f"h0 must be (B, n) with x's batch B={x.shape[0]}, got {tuple(h0.shape)}")
    if isinstance(cell, GRUCell) and (h0.shape[1], x.shape[2]) != (cell.state_size, cell.input_size):
        raise ValueError(f"cell takes n={cell.state_size}, m={cell.input_size}; "
                         f"got h0 with n={h0.shape[1]}, x with m={x.shape[2]}")


def rollout(cell: Step, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """Every state h_1 .. h_T (B, T, n) from inputs x (B, T, m) and h0 (B, n): T dependent cell calls."""
    _check(x, h0, cell)
    states, h = [], h0
    for t in range(x.shape[1]):
        h = cell(h, x[:, t])
        states.append(h)
    return torch.stack(states, dim=1)


def _replay(cell: Step, x: torch.Tensor, starts: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    """Run every chunk from its start state (chunks are independent: ranks would run them in parallel)."""
    pieces = torch.split(x, sizes, dim=1)
    return torch.cat([rollout(cell, xc, h) for xc, h in zip(pieces, starts)], dim=1)   # (B, T, n)


def chunk_from_zero(cell: Step, x: torch.Tensor, h0: torch.Tensor, chunks: int) -> torch.Tensor:
    """The pitfall: N chunks each rolled out without its true incoming state, concatenated (B, T, n).

    Chunk 0 starts from h0 (its owner knows it); every later chunk from zeros,
    since nothing told it where the trajectory was. Chunk 0 is exact; every
    later chunk starts wrong, and the error fades only as fast as the cell
    forgets.
    """
    _check(x, h0, cell)
    sizes = time_chunk_sizes(x.shape[1], chunks)
    return _replay(cell, x, [h0] + [torch.zeros_like(h0)] * (len(sizes) - 1), sizes)


def step_errors(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Largest |approx - exact| over batch and state at each time step: (B, T, n) -> (T,), for a plot."""
    if approx.shape != exact.shape or approx.dim() != 3:
        raise ValueError(f"need two (B, T, n) tensors of one shape, got {tuple(approx.shape)}, {tuple(exact.shape)}")
    return (approx - exact).abs().amax(dim=(0, 2))


@dataclass(frozen=True)
class ScanPicardResult:
    """What `picard` did: the last sweep's states, and per sweep its error, boundary change and work."""
    states: torch.Tensor      # (B, T, n) after the last sweep
    errors: list[float]       # max |states - exact| after each sweep (needs the exact answer)
    changes: list[float]      # max |boundary states a sweep produced - those it started from|: observable; 0 = done
    work: int                 # cell evaluations over all sweeps, per sequence


def picard(cell: Step, x: torch.Tensor, h0: torch.Tensor, chunks: int, *, sweeps: int | None = None) -> ScanPicardResult:
    """Fixed-point (Picard) sweeps over the chunk boundary states; exact after `chunks` sweeps.

    Sweep 0 starts chunk 0 from h0 and every other chunk from zeros (which is
    chunk_from_zero). Each sweep runs all chunks from the current boundary
    states, as N ranks would in parallel, then sets the state entering chunk
    r to the last state chunk r-1 just produced. Chunk 0 is exact after sweep
    0; if chunk r-1 was exact after sweep k-1, chunk r starts from the true
    state in sweep k, so after sweep k the first k+1 chunks are exact: all of
    them after N sweeps (sweeps default to N). They are even bitwise equal to
    `rollout`: a chunk that starts from the true state bit for bit calls the
    cell on the same tensors in the same order. Every sweep costs T cell
    evaluations, so N sweeps cost N * T, against the loop's T.
    """
    _check(x, h0, cell)
    sizes = time_chunk_sizes(x.shape[1], chunks)
    n_sweeps = require_int("sweeps", len(sizes) if sweeps is None else sweeps, 1)
    exact = rollout(cell, x, h0)                                        # reference only: not counted as work
    ends = torch.cumsum(torch.tensor(sizes), 0) - 1                     # last step of each chunk
    starts = [h0] + [torch.zeros_like(h0)] * (len(sizes) - 1)
    errors, changes, work = [], [], 0
    for _ in range(n_sweeps):
        states = _replay(cell, x, starts, sizes)                        # (B, T, n)
        work += x.shape[1]
        new_starts = [h0] + [states[:, int(e)] for e in ends[:-1]]
        changes.append(max(float((a - b).abs().max()) for a, b in zip(new_starts, starts)))
        errors.append(float((states - exact).abs().max()))
        starts = new_starts
    return ScanPicardResult(states=states, errors=errors, changes=changes, work=work)


def split_episodes(x: torch.Tensor, h0: torch.Tensor, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank r's share of independent episodes: rows of x (B, T, m) and h0 (B, n), tensor_split over B.

    Episodes never read each other's states, so each rank rolls out its rows
    in time order and the concatenated states are the full batch's: exact
    mathematics, though not always the same bits, since the CPU's matrix
    kernel sums in an order that depends on the number of rows
    (reordering_bound bounds the gap). The first B % N ranks get one extra
    episode; world_size > B is refused (a rank with no episode has nothing to do).
    """
    _check(x, h0)
    n = require_int("world_size", world_size, 1)
    if n > x.shape[0]:
        raise ValueError(f"world_size must be <= batch B={x.shape[0]} (one episode per rank at least), got {n}")
    return list(zip(torch.tensor_split(x, n, dim=0), torch.tensor_split(h0, n, dim=0)))
