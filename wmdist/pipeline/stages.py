"""The transformer world model cut into pipeline stages, and the single-device runs they are checked against.

Where the ends go: the first virtual stage also embeds the (frame, action)
tokens and adds positions; the last also applies the final LayerNorm, the
head and the loss. Every boundary between stages therefore carries one
microbatch of hidden states (b, T, H), whatever the cut.

A microbatch is a group of whole trajectories (rows of the batch): time steps
of one trajectory never go to different microbatches, so the causal attention
inside each trajectory sees exactly the context it sees in one process.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wmdist.compare import one_thread
from wmdist.costs.rounding import reordered_sum_bound
from wmdist.models import make_batch
from wmdist.pipeline.plan import PipeWork, microbatch_sizes, stage_blocks
from wmdist.transformer import TransformerConfig, TransformerWorldModel, make_transformer


class StageModule(nn.Module):
    """Virtual stage `stage` of `n_stages`: [embedding] + consecutive blocks + [final LayerNorm and head].

    Holds references to the full model's own submodules, so its parameters'
    names and values are the model's. First stage: (obs, actions) -> hidden;
    middle: hidden -> hidden; last: hidden -> predicted next frames.
    """

    def __init__(self, model: TransformerWorldModel, stage: int, n_stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.model_ref = [model]                                  # a list: not registered as a submodule
        self.blocks = nn.ModuleList(model.blocks[i] for i in stage_blocks(len(model.blocks), n_stages)[stage])

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        model = self.model_ref[0]
        x = model.embed_tokens(*inputs) if self.first else inputs[0]     # (b, T, H)
        for block in self.blocks:
            x = block(x)
        return model.predict(x) if self.last else x                      # (b, T, O) or (b, T, H)


def stage_modules(model: TransformerWorldModel, n_stages: int) -> list[StageModule]:
    """All P*v stages of `model`, in pipeline order."""
    return [StageModule(model, s, n_stages) for s in range(n_stages)]


def stage_parameter_names(model: TransformerWorldModel, n_stages: int) -> list[list[str]]:
    """The full model's parameter names that each virtual stage owns (embedding on the first, head on the last)."""
    where = {i: s for s, blocks in enumerate(stage_blocks(len(model.blocks), n_stages)) for i in blocks}
    names: list[list[str]] = [[] for _ in range(n_stages)]
    for name, _ in model.named_parameters():
        parts = name.split(".")
        stage = where[int(parts[1])] if parts[0] == "blocks" else 0 if parts[0] in ("embed", "pos") else n_stages - 1
        names[stage].append(name)
    return names


def model_for(work: PipeWork) -> TransformerWorldModel:
    """The model every rank (and the reference) builds: same seed, same weights."""
    return make_transformer(seed=work.seed, cfg=TransformerConfig(layers=work.layers))


def batch_for(work: PipeWork, *, step: int = 0) -> dict[str, torch.Tensor]:
    """The step's batch of B independent trajectories (obs, actions, next_obs: (B, T, .))."""
    return make_batch(work.batch_size, seq_len=work.seq_len, seed=work.seed * 1000 + step)


def split_microbatches(batch: dict[str, torch.Tensor], microbatches: int) -> list[dict[str, torch.Tensor]]:
    """Whole trajectories per microbatch, in batch order (tensor_split layout)."""
    sizes = microbatch_sizes(batch["obs"].shape[0], microbatches)
    return [dict(zip(batch, parts)) for parts in zip(*(torch.split(v, sizes) for v in batch.values()))]


def microbatch_loss(pred: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
    """This microbatch's share of the full-batch loss: its per-trajectory mean squared errors summed, / B.

    Summed over microbatches it is the single-device loss (mean over all B
    trajectories), whatever the microbatch sizes: no re-weighting needed.
    """
    return (pred - target).pow(2).mean(dim=(1, 2)).sum() / batch_size       # pred, target: (b, T, O)


@dataclass(frozen=True)
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
        return PipelineReference(output, loss.detach(), {}, [], 0.0)
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    per_mb = []
    for mb in split_microbatches(batch, microbatches):
        model.zero_grad()
        microbatch_loss(model(mb["obs"], mb["actions"]), mb["next_obs"], work.batch_size).backward()
        per_mb.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return PipelineReference(output, loss.detach(), grads, per_mb, gradient_bound(work))


def gradient_bound(work: PipeWork) -> float:
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

