"""Single-process Adam, the reference every ZeRO run is checked against, and the tolerance of that check.

How far may N ranks' weights sit from one process's? The gradients are the
same B*T row terms added in another order (per rank, then the reduce-scatter
across ranks), so each entry differs by at most `costs.reordered_sum_bound`
with the sum of |terms| as its partial-sum bound (`models.linear_term_sums`).
What Adam then does with such a difference depends on 1/sqrt(v) of each entry
and on the curvature over the steps, which no short formula bounds usefully.
So the tolerance is measured, and says so: the reference is run again with
every gradient entry of every step moved by its full bound (random signs),
and the largest displacement of the final weights is allowed, plus one
float32 rounding of |theta| per step for the update itself.
"""
from __future__ import annotations

import torch

from wmdist.costs.rounding import FLOAT32_ROUNDOFF, reordered_sum_bound
from wmdist.costs.validate import require_int
from wmdist.memory.zero import ZeroConfig
from wmdist.models.world import flat_grads, flat_params, linear_term_sums, make_batch, make_model, set_flat_grads

EXTRA_ROUNDINGS = 2        # the loss scale 1/B, rounded in each run
PROBE_SEEDS = (1, 2)       # sign patterns the reference is perturbed with


def reference_run(cfg: ZeroConfig, *, perturb: tuple[list[torch.Tensor], int] | None = None
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Single process, whole batch, torch.optim.Adam: final flat parameters (P,) and each step's gradient bound.

    `perturb=(bounds, seed)` adds +-bounds[step] (random signs) to each step's gradient before Adam sees it.
    """
    model = make_model(seed=cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    signs = torch.Generator().manual_seed(perturb[1]) if perturb else None
    bounds = []
    for k in range(cfg.steps):
        batch = make_batch(cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed + k)
        opt.zero_grad()
        terms = linear_term_sums(model, lambda m: m.per_example_loss(batch).sum() / cfg.batch_size)
        rows = cfg.batch_size * cfg.seq_len
        bounds.append(reordered_sum_bound(rows, 1.0, extra_roundings=EXTRA_ROUNDINGS) * terms)
        if perturb is not None:
            sign = torch.randint(0, 2, terms.shape, generator=signs) * 2 - 1            # (P,) of +-1
            set_flat_grads(model, (flat_grads(model).double() + sign * perturb[0][k]).float())
        opt.step()
    return flat_params(model), bounds


def reference_adam(cfg: ZeroConfig) -> torch.Tensor:
    """Single process, whole batch, torch.optim.Adam: the flat parameters after cfg.steps steps. (P,)"""
    return reference_run(cfg)[0]


def adam_tolerance(cfg: ZeroConfig, world_size: int) -> tuple[float, str]:
    """Allowed max |difference| from single-process Adam, and why (measured; see the module docstring)."""
    require_int("world_size", world_size, 1)
    if world_size == 1:
        return 0.0, "one rank: the same sums in the same order, bitwise equal"
    params, bounds = reference_run(cfg)
    moved = max(float((reference_run(cfg, perturb=(bounds, seed))[0] - params).abs().max()) for seed in PROBE_SEEDS)
    tol = moved + cfg.steps * FLOAT32_ROUNDOFF * float(params.abs().max())
    return tol, (f"measured: single-process Adam moved at most this when every gradient entry of its {cfg.steps} "
                 "steps was perturbed by its full reordering bound (gradient sums in another order)")
