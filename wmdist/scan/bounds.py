"""How far two rollouts of the GRU cell can drift apart through rounding alone, along the actual trajectory.

Splitting a batch of episodes over ranks changes nothing mathematically, but
the CPU's matrix kernel sums in an order that depends on the number of rows,
so the split rollout and the full-batch one differ in the last bits. To say
how far they may differ, follow a rounding gap d_t through the recurrence:
to first order d_t = J_t d_(t-1) + e_t, where J_t = dh_t/dh_(t-1) is the
cell's Jacobian at the reference trajectory and |e_t| is at most the gap two
evaluations of one step can open (cell.reordering_bound for one step). Then

    |d_t| <= sum over s <= t of |J_t J_(t-1) ... J_(s+1)| * max|e|   (elementwise, |.| of the product matrix).

The products of the actual Jacobians shrink (this cell forgets, which is also
why a chunk started from zero slowly recovers), where the worst-case
Lipschitz constant of cell.lipschitz_bound would grow like L^T. The bound is
first order: it neglects terms of the size of the gap squared, about 1e-6 of
it for float32 gaps of 1e-3.
"""
from __future__ import annotations

import torch
from torch.func import jacrev, vmap

from wmdist.costs.validate import require_real
from wmdist.scan.cell import GRUCell, reordering_bound


def step_jacobians(cell: GRUCell, x: torch.Tensor, h0: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """dh_t / dh_(t-1) at every step of a trajectory, float64: (B, T, n, n).

    From x (B, T, m), h0 (B, n) and the trajectory's states (B, T, n).
    """
    prev = torch.cat([h0.unsqueeze(1), states[:, :-1]], dim=1)              # (B, T, n): the state each step reads

    def one(h: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:             # (n,), (m,) -> (n,)
        return cell(h.unsqueeze(0), xt.unsqueeze(0)).squeeze(0)

    return vmap(vmap(jacrev(one)))(prev, x).double()


def amplification(jacobians: torch.Tensor) -> torch.Tensor:
    """Per step t, max over episodes and state rows of sum_(s <= t) |J_t ... J_(s+1)| row sums: (T,).

    Entry t says how much a rounding gap of size 1 opened at every step up to
    t can have grown to by step t. T^2 / 2 small matrix products.
    """
    batch, steps, n, _ = jacobians.shape
    eye = torch.eye(n, dtype=torch.float64).expand(batch, n, n)
    products: list[torch.Tensor] = []                                       # J_t ... J_(s+1) for every s < t
    out = []
    for t in range(steps):
        products = [jacobians[:, t] @ p for p in products] + [eye]          # each (B, n, n)
        out.append(torch.stack(products).abs().sum(dim=0).sum(dim=-1).amax())
    return torch.stack(out)                                                  # (T,)


def propagated_bound(cell: GRUCell, x: torch.Tensor, h0: torch.Tensor, states: torch.Tensor,
                     unit_roundoff: float) -> float:
    """Largest |difference| (first order) between two rollouts that differ only in summation order.

    `states` is the reference trajectory (B, T, n); the one-step gap comes
    from cell.reordering_bound(cell, 1, ...), which assumes |h0| <= 1 and
    bounds each step's local rounding from the weights and max |x|.
    """
    u = require_real("unit_roundoff", unit_roundoff)
    one_step = reordering_bound(cell, 1, float(x.abs().max()), u)
    return one_step * float(amplification(step_jacobians(cell, x, h0, states)).max())
