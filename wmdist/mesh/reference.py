"""The same training step on one device, and how far the mesh may be from it (tolerances derived, stated).

The mesh computes the same mathematics as one device; only the order of
some float32 sums changes:
  * tp: a row-parallel layer's output is a sum over its input features, done
    as tp partial sums added around the ring; a column-parallel layer's
    input gradient likewise, over its output features (at most 3H or F terms);
  * cp: attention's sums over keys are merged block by block (online
    softmax) instead of in one pass (T terms);
  * dp, cp and microbatches: every weight gradient is a sum over the B*T
    token rows, now grouped by rank and microbatch and added around rings.
So every entry is a K-term sum in another order, K = max(3H, F, B*T), and
two orders differ by at most 2(K-1) u times the largest partial sum
(costs.reordered_sum_bound, u = 2^-24), which we take to be max|X| of the
compared tensor X: chapter 04's rule (tensor_parallel.compare). It is a
first-order allowance, not a bound: it assumes no cancellation, and it does
not add up how later layers pass an earlier difference on.
The parameters after one SGD step (momentum buffer = gradient on the first
step) inherit lr times that, plus two roundings of p - lr g on each side.
The loss is a mean of B*T*O squared errors: reordered, plus, to first
order, 2 sqrt(loss) times the predictions' own allowance (Cauchy-Schwarz:
mean |e| <= sqrt(mean e^2)). A wrong slice, a missing or doubled sum, or a
token seen by the wrong position changes results by about max|X| instead.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wmdist.course.compare import bound_ratio, one_thread, reordered_terms as block_terms
from wmdist.costs.rounding import FLOAT32_ROUNDOFF, reordered_sum_bound
from wmdist.mesh.spec import MeshSpec
from wmdist.mesh.stage import MeshStage, full_model
from wmdist.mesh.step import Momentum, RankStep
from wmdist.models.world import make_batch
from wmdist.course.report import Check, max_abs_error

PARAM_WHY = ("lr x the gradient's first-order allowance, plus p - lr g rounded twice on each side: "
             "2 2^-24 (lr max|g| + max|p|)")
WHY = "float32 sums regrouped by tp, cp, dp and microbatch: 2(K-1) 2^-24 max|X|, K = max(3H, F, B*T) (first order)"


@dataclass(kw_only=True, frozen=True)
class Reference:
    """One device, the whole batch: loss, every gradient, every parameter after the step, and the bounds' sizes."""
    loss: float
    pred_abs: float                      # max |prediction|: the scale of the predictions' rounding
    grads: dict[str, torch.Tensor]       # by model name
    params: dict[str, torch.Tensor]      # after SGD with momentum 0.9, one step
    terms: int                           # K, the most terms of any reordered sum

    def grad_tolerance(self, want: torch.Tensor) -> float:
        """2(K-1) u max|want|: the gradient entries of one tensor, summed in another order."""
        return reordered_sum_bound(self.terms, float(want.abs().max()))

    def param_tolerance(self, lr: float, grad: torch.Tensor, want: torch.Tensor) -> float:
        """lr times the gradient's first-order allowance, plus p - lr g rounded (twice) on each side."""
        u = FLOAT32_ROUNDOFF
        return lr * self.grad_tolerance(grad) + 2 * u * (lr * float(grad.abs().max()) + float(want.abs().max()))

    def loss_tolerance(self, batch: int, seq_len: int, obs_dim: int) -> float:
        """B*T*O positive terms reordered, plus 2 sqrt(loss) times the predictions' first-order allowance."""
        return (reordered_sum_bound(batch * seq_len * obs_dim, self.loss)
                + 2 * math.sqrt(self.loss) * reordered_sum_bound(self.terms, self.pred_abs))


def mesh_terms(spec: MeshSpec) -> int:
    """K = max(3H, F, B*T) of this mesh's block (`wmdist.course.compare.reordered_terms` on the spec's sizes)."""
    return block_terms(spec.width, spec.mlp_ratio * spec.width, spec.batch * spec.seq_len)


def reference_step(spec: MeshSpec) -> Reference:
    """The step on one device and one thread (as every rank runs): full batch, mean loss, SGD with momentum."""
    with one_thread():
        model = full_model(spec)
        batch = make_batch(spec.batch, seq_len=spec.seq_len, seed=spec.seed)
        pred = model(batch["obs"], batch["actions"])                                   # (B, T, O)
        loss = (pred - batch["next_obs"]).pow(2).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        Momentum(list(model.parameters()), spec.lr).step()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return Reference(loss=loss.item(), pred_abs=pred.detach().abs().max().item(), grads=grads, params=params, terms=mesh_terms(spec))


def _worst(label: str, got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]],
           tolerance: Callable[[int, str, torch.Tensor], float], reason: str) -> Check:
    """One Check for every tensor of every rank: the entry furthest from its tolerance (error / tolerance largest)."""
    worst = (-1.0, 0.0, 1.0, "")
    for rank, (mine, theirs) in enumerate(zip(got, want)):
        for name, w in theirs.items():
            err, tol = max_abs_error(mine[name], w), tolerance(rank, name, w)
            ratio = bound_ratio(mine[name], w, tol)      # NaN if anything is not finite; x/0 = inf
            if math.isnan(ratio):
                return Check(name=f"{label} == single device, every rank", error=math.nan, tolerance=tol, reason=reason,
                             detail=f"{name} on rank {rank}")
            if ratio > worst[0]:
                worst = (ratio, err, tol, f"{name} on rank {rank}")
    return Check(name=f"{label} == single device, every rank", error=worst[1], tolerance=worst[2], reason=reason, detail=worst[3])


def agreement(spec: MeshSpec, ref: Reference, runs: list[RankStep]) -> list[Check]:
    """Loss, every gradient and every parameter after the step, each rank's slice against the single device's."""
    stages: dict[tuple[int, int], MeshStage] = {}
    for r in runs:
        key = (r.coords["tp"], r.coords["pp"])
        if key not in stages:
            stages[key] = MeshStage(full_model(spec), spec, *key)
    mine = [stages[(r.coords["tp"], r.coords["pp"])] for r in runs]
    want_g = [{n: st.shard(n, ref.grads[n]) for n in r.grads} for r, st in zip(runs, mine)]
    want_p = [{n: st.shard(n, ref.params[n]) for n in r.params} for r, st in zip(runs, mine)]
    loss = sum(r.loss for r in runs if r.loss is not None and r.coords["tp"] == 0)   # each tp rank repeats it
    return [
        Check(name="loss (sum of the last stage's shares) == single device", error=abs(loss - ref.loss),
              tolerance=ref.loss_tolerance(spec.batch, spec.seq_len, mine[0].cfg.obs_dim),
              reason="B*T*O squared errors summed in another order, plus 2 sqrt(loss) x the predictions' "
              "first-order allowance"),
        _worst("every gradient", [r.grads for r in runs], want_g, lambda r, n, w: ref.grad_tolerance(w), WHY),
        _worst("every parameter after the step", [r.params for r in runs], want_p,
               lambda r, n, w: ref.param_tolerance(spec.lr, want_g[r][n], w), PARAM_WHY),
    ]
