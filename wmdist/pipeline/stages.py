"""The single-device runs a pipeline is checked against, and their rounding bounds.

The stages themselves (StageModule, the model every rank builds, the batch,
whole-trajectory microbatches, each microbatch's share of the loss) live in
executor.py with the code that runs them, and are re-exported here. The
reference chains those same modules in one process: its loss and gradients are
what every pipeline run must reproduce, up to the bounds derived below.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wmdist.course.compare import one_thread
from wmdist.costs.rounding import reordered_sum_bound
from wmdist.pipeline.executor import (  # the model cut into stages lives with the executor; re-exported here
    StageModule,
    batch_for,
    microbatch_loss,
    model_for,
    split_microbatches,
    stage_modules,
    stage_parameter_names,
)

__all__ = ["StageModule", "batch_for", "microbatch_loss", "model_for", "split_microbatches", "stage_modules",
           "stage_parameter_names", "PipelineReference", "reference", "stage_gradient_bound", "gradient_tolerance",
           "loss_tolerance"]
from wmdist.pipeline.plan import PipeWork
from wmdist.models.transformer import TransformerConfig, TransformerWorldModel


@dataclass(kw_only=True, frozen=True)
class PipelineReference:
    """One process: the full batch at once, and each microbatch's gradient on its own."""
    output: torch.Tensor                            # (B, T, O) the whole batch in one call
    loss: torch.Tensor                              # () full-batch mean loss
    grads: dict[str, torch.Tensor]                  # full-batch gradient, by parameter name
    per_microbatch: list[dict[str, torch.Tensor]]   # per_microbatch[m]: gradient of microbatch m's loss share
    bound: float                                    # max over entries of sum_rows |row term| (see gradient_bound)

    def accumulated(self, backward_orders: list[list[int]], model: TransformerWorldModel) -> dict[str, torch.Tensor]:
        """The microbatch gradients added up as a rank's autograd adds them: stage s in backward_orders[s]."""
        out = {}
        for s, names in enumerate(stage_parameter_names(model, len(backward_orders))):
            for n in names:
                acc = self.per_microbatch[backward_orders[s][0]][n].clone()
                for m in backward_orders[s][1:]:
                    acc += self.per_microbatch[m][n]
                out[n] = acc
        return out


def reference(work: PipeWork, microbatches: int, *, gradients: bool = True) -> PipelineReference:
    """Run the single-device references for `work` split into `microbatches` microbatches, on one thread.

    `gradients=False` computes the output and loss only.
    """
    with one_thread():
        return _reference(work, microbatches, gradients)


def _reference(work: PipeWork, microbatches: int, gradients: bool) -> PipelineReference:
    model, batch = model_for(work), batch_for(work)
    output = model(batch["obs"], batch["actions"]).detach()                     # (B, T, O)
    loss = model.loss(batch)
    if not gradients:
        return PipelineReference(output=output, loss=loss.detach(), grads={}, per_microbatch=[], bound=0.0)
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    per_mb = []
    for mb in split_microbatches(batch, microbatches):
        model.zero_grad()
        microbatch_loss(model(mb["obs"], mb["actions"]), mb["next_obs"], work.batch_size).backward()
        per_mb.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return PipelineReference(output=output, loss=loss.detach(), grads=grads, per_microbatch=per_mb, bound=stage_gradient_bound(work))


def stage_gradient_bound(work: PipeWork) -> float:
    """Largest sum over token rows of |one row's term| in any parameter's gradient: the scale of its rounding.

    Every gradient that crosses rows is a sum over the B*T token rows: a
    Linear's weight gradient is sum_n dy_n x_n^T, its bias sum_n dy_n, a
    LayerNorm's sum_n dy_n * xhat_n, the positions' sum over trajectories.
    Summing those rows in M microbatch groups instead of one pass changes
    only the order, so reordered_sum_bound(B*T, this) bounds the difference
    (every per-row operation is the same whatever the microbatch).
    """
    model, batch = model_for(work), batch_for(work)
    seen: dict[nn.Module, torch.Tensor] = {}
    sums: list[torch.Tensor] = []

    def keep_input(module: nn.Module, args: tuple, _out: torch.Tensor) -> None:
        seen[module] = args[0].detach().double()

    def row_terms(module: nn.Module, _gin: tuple, gout: tuple) -> None:
        dy, x = gout[0].detach().double().abs().flatten(0, -2), seen[module].flatten(0, -2)   # (rows, out), (rows, in)
        if isinstance(module, nn.LayerNorm):
            x = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + module.eps).sqrt()
            sums.append((dy * x.abs()).sum(0))
        else:
            sums.append(dy.t() @ x.abs())
        sums.append(dy.sum(0))

    hooks = [h for m in model.modules() if isinstance(m, (nn.Linear, nn.LayerNorm))
             for h in (m.register_forward_hook(keep_input), m.register_full_backward_hook(row_terms))]
    obs = batch["obs"].clone().requires_grad_(True)      # so the embedding's backward hook sees an input gradient
    tokens = model.embed_tokens(obs, batch["actions"])                           # (B, T, H)
    tokens.retain_grad()
    x = tokens
    for block in model.blocks:
        x = block(x)
    ((model.predict(x) - batch["next_obs"]).pow(2).mean(dim=(1, 2)).mean()).backward()
    sums.append(tokens.grad.double().abs().sum(0))                               # positions: sum over trajectories
    for h in hooks:
        h.remove()
    return max(float(s.max()) for s in sums)


def gradient_tolerance(work: PipeWork, bound: float) -> float:
    """Allowed |pipeline - full batch| for any gradient entry: the B*T row terms summed in another order."""
    return reordered_sum_bound(work.batch_size * work.seq_len, bound)


def loss_tolerance(work: PipeWork, loss: float, microbatches: int) -> float:
    """Allowed |pipeline loss - full-batch loss|: B*T*O positive squared errors summed in another order.

    The loss is a mean (over trajectories) of means (over T*O entries) of
    squared errors. All terms are positive, so every partial sum, scaled as
    the loss is, stays below the loss, and two summation orders differ by at
    most reordered_sum_bound(B*T*O, loss). Each of the M microbatch shares
    adds a division and an addition, the references' last divisions two more.
    """
    terms = work.batch_size * work.seq_len * TransformerConfig().obs_dim
    return reordered_sum_bound(terms, abs(loss), extra_roundings=2 * microbatches + 2)

