"""ZeRO stages 1, 2 and 3 on real ranks, checked byte for byte and against Adam on one process.

All parameters are flattened into one fp32 vector of P elements, as in the
ZeRO paper, and rank r owns the element range of chunk r of
torch.tensor_split (costs.ring_chunk_sizes): a layer may straddle two ranks.
What a rank keeps between steps, by stage:

    stage 0 (replicated DP): parameters P, gradients P, Adam moments 2P
    stage 1: parameters P, gradients P, Adam moments of its chunk only
    stage 2: parameters P, gradient chunk, Adam moments of its chunk
    stage 3: parameter chunk, gradient chunk, Adam moments of its chunk

The step: gradients are reduce-scattered (each rank receives the summed
gradient of its own chunk), each rank updates its chunk with Adam, and the
updated chunks are all-gathered. Stage 3 keeps no full copy at rest: it
all-gathers the parameters before forward, frees them, all-gathers them again
before backward (as FSDP does, by resizing the storage to zero and back) and
does not gather after the update. The tiny model is one unit here; real
systems gather layer by layer to bound the transient full copy.

Bytes held are steady state between steps. Within a step, stage 2 builds the
full local gradient before reduce-scattering it, and stage 3 holds the full
parameters (gathered) and the full gradient after backward: `zero_step`
reads what the rank holds at three points of the step (PROBE_POINTS) so the
demo can show that transient peak next to the steady state
(wmdist.memory.transient predicts both). Gradients are not re-allocated each
step: stages 0 and 1 let backward accumulate into the kept full buffer,
stages 2 and 3 copy the reduced chunk into the kept shard buffer.

`zero_step` is the stage's schedule on any loss module and elementwise optimizer: chapter 03's
`train_step` runs it with Adam on the course's model, and wmdist.yours with your model and torch's
SGD or Adam.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.validate import require_bool, require_choice, require_int, require_real
from wmdist.costs.zero import ZERO_STAGES
from wmdist.comm import Context, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from wmdist.models.world import flat_params, make_batch, make_model, on_meta, shard_batch

HELD_KINDS = ("parameters", "gradients", "optimizer_state")


@dataclass(frozen=True, kw_only=True)
class ZeroConfig:
    """One ZeRO training run: stage, steps, data and Adam hyperparameters."""
    stage: int = 1
    steps: int = 3              # optimizer steps; step k trains on make_batch(seed=seed + k)
    batch_size: int = 12        # global batch, split over ranks by rows (any size >= world size)
    seq_len: int = 6            # T of each trajectory
    seed: int = 0
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    keep_gathered: bool = False  # a broken stage 3 that never frees its gathered parameters (a pitfall)

    def __post_init__(self) -> None:
        require_choice("stage", self.stage, ZERO_STAGES)
        require_bool("keep_gathered", self.keep_gathered)
        if self.keep_gathered and self.stage != 3:
            raise ValueError(f"keep_gathered needs stage 3 (only stage 3 gathers parameters), got stage {self.stage}")
        require_int("steps", self.steps, 0)
        require_int("batch_size", self.batch_size, 1)
        require_int("seq_len", self.seq_len, 1)
        require_real("lr", self.lr)


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the flat elements rank `rank` owns (tensor_split layout)."""
    sizes = ring_chunk_sizes(numel, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def adam_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: int, cfg: ZeroConfig) -> None:
    """One Adam step in place, elementwise, with the same operations as torch.optim.Adam on CPU.

    Elementwise means a chunk of the flat vector can be updated on its own:
    the reason optimizer state shards with no communication at all.
    """
    beta1, beta2 = cfg.betas
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = cfg.lr / (1 - beta1 ** step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(cfg.eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class _PerExampleLoss(nn.Module):
    """Wraps the model so torch.func.functional_call can compute its per-example loss."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.per_example_loss(batch)


@dataclass(kw_only=True)
class ZeroRankState:
    """What one rank keeps between steps. The module is on the meta device: code and shapes, no numbers.

    `loss_module(batch)` returns per-example losses; its parameters are named by `layout` (a "model." prefix).
    Chapter 03 keeps Adam's two moments; yours' ZeRO keeps whatever its optimizer needs (wmdist.yours).
    """
    stage: int
    numel: int                       # P
    start: int                       # this rank's chunk is [start, stop)
    stop: int
    params: torch.Tensor             # (P,) for stages 0-2, (stop - start,) for stage 3
    grads: torch.Tensor              # (P,) for stages 0-1, (stop - start,) for 2-3
    moments: list[torch.Tensor]      # optimizer state, each (P,) for stage 0, else (stop - start,)
    step: int
    loss_module: nn.Module
    layout: list[tuple[str, torch.Size, int, int]]   # (name, shape, start, stop) in the flat vector
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)   # the module's buffers, whole on every rank

    @property
    def exp_avg(self) -> torch.Tensor:
        """Adam's first moment (chapter 03's optimizer)."""
        return self.moments[0]

    @property
    def exp_avg_sq(self) -> torch.Tensor:
        """Adam's second moment."""
        return self.moments[1]

    @property
    def chunk(self) -> torch.Tensor:
        """This rank's own chunk of the flat parameters (a view)."""
        return self.params if self.stage == 3 else self.params[self.start:self.stop]

    def held_bytes(self, *, params: tuple[torch.Tensor, ...] = (), grads: tuple[torch.Tensor | None, ...] = ()
                   ) -> dict[str, int]:
        """Bytes of storage this rank holds, by kind, read from its tensors (plus transient ones given).

        Each storage counts once, under the first kind that holds it (a leaf
        sharing the parameters' storage is not counted twice); a freed storage
        (resized to 0) counts 0.
        """
        seen: set[int] = set()

        def size(*tensors: torch.Tensor | None) -> int:
            total = 0
            for t in tensors:
                store = None if t is None else t.untyped_storage()
                if store is not None and store.nbytes() and store.data_ptr() not in seen:
                    seen.add(store.data_ptr())
                    total += store.nbytes()
            return total
        return {"parameters": size(self.params, *params), "gradients": size(self.grads, *grads),
                "optimizer_state": size(*self.moments)}


def flat_layout(model: nn.Module) -> tuple[list[tuple[str, torch.Size, int, int]], int]:
    """Where each parameter sits in the flat vector: (name, shape, start, stop) per parameter, and P.

    Names carry a "model." prefix: the module is called wrapped, as the `model` attribute of a loss module.
    """
    layout, offset = [], 0
    for name, p in model.named_parameters():
        layout.append((f"model.{name}", p.shape, offset, offset + p.numel()))
        offset += p.numel()
    return layout, offset


def init_state(ctx: Context, cfg: ZeroConfig) -> ZeroRankState:
    """Build the model from cfg.seed, flatten it, keep what this rank's stage keeps."""
    model = make_model(seed=cfg.seed)
    layout, offset = flat_layout(model)
    flat = flat_params(model)                                                  # (P,)
    start, stop = shard_range(offset, ctx.world_size, ctx.rank)
    params = flat[start:stop].clone() if cfg.stage == 3 else flat
    n_state = offset if cfg.stage == 0 else stop - start
    n_grad = offset if cfg.stage <= 1 else stop - start
    return ZeroRankState(stage=cfg.stage, numel=offset, start=start, stop=stop, params=params,
                         grads=torch.zeros(n_grad), moments=[torch.zeros(n_state), torch.zeros(n_state)], step=0,
                         loss_module=_PerExampleLoss(on_meta(model)), layout=layout)


def _summed_loss(state: ZeroRankState, flat: torch.Tensor, batch: Any, global_batch: int) -> torch.Tensor:
    """Sum of this rank's per-example losses / global batch: summed over ranks, the global mean."""
    views = {name: flat[a:b].view(shape) for name, shape, a, b in state.layout}
    per_example = torch.func.functional_call(state.loss_module, {**views, **state.buffers}, (batch,))   # (B_r,)
    return per_example.sum() / global_batch


PROBE_POINTS = ("between forward and backward", "after backward", "after the gradient reduction")
Probe = Callable[[str, dict[str, int]], None]


Update = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], int], None]   # (param, grad, moments, step)


def train_step(ctx: Context, state: ZeroRankState, cfg: ZeroConfig, *, probe: Probe | None = None) -> None:
    """One chapter-03 step: Adam on this rank's rows of the course's batch number state.step."""
    batch = make_batch(cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed + state.step)
    mine = shard_batch(batch, ring_chunk_sizes(cfg.batch_size, ctx.world_size), ctx.rank)
    zero_step(ctx, state, mine, cfg.batch_size, lambda p, g, m, step: adam_update(p, g, m[0], m[1], step, cfg),
              keep_gathered=cfg.keep_gathered, probe=probe)


def zero_step(ctx: Context, state: ZeroRankState, mine: Any, global_batch: int, update: Update, *,
              keep_gathered: bool = False, probe: Probe | None = None) -> torch.Tensor:
    """One ZeRO step on this rank's examples `mine` of a batch of `global_batch`, in the stage's schedule.

    `update(param, grad, moments, step)` is the elementwise optimizer step, applied to this rank's chunk
    (all of it at stage 0). `probe(point, held_bytes)` is called at each of PROBE_POINTS with what the rank
    holds right then, transient tensors included. Returns this rank's chunk of the summed gradient (a view).
    """
    sizes = ring_chunk_sizes(state.numel, ctx.world_size)
    look = probe or (lambda point, held: None)
    if state.stage == 3:
        leaf = ring_all_gather(ctx, state.params, sizes, phase="forward all-gather").requires_grad_()   # (P,)
    else:
        leaf = state.params.detach().requires_grad_()                        # (P,), shares storage
    loss = _summed_loss(state, leaf, mine, global_batch)
    free = state.stage == 3 and not keep_gathered
    if free:
        leaf.untyped_storage().resize_(0)                   # free the full copy; saved views now point at nothing
    look(PROBE_POINTS[0], state.held_bytes(params=(leaf,)))
    if state.stage == 3:
        again = ring_all_gather(ctx, state.params, sizes, phase="backward all-gather")
        if free:
            leaf.untyped_storage().resize_(state.numel * leaf.element_size())
        leaf.data.copy_(again)                              # .data: autograd must not see this write
        del again
    if state.stage <= 1:
        leaf.grad = state.grads.zero_()                     # backward accumulates into the kept full buffer
    loss.backward()
    full, state.step = leaf.grad, state.step + 1            # (P,) local gradient
    look(PROBE_POINTS[1], state.held_bytes(params=(leaf,), grads=(full,)))
    if free:
        leaf.untyped_storage().resize_(0)                   # reshard after backward, as FSDP does
    if state.stage == 0:
        ring_all_reduce(ctx, state.grads, phase="gradient all-reduce", inplace=True)
        look(PROBE_POINTS[2], state.held_bytes(params=(leaf,)))
        update(state.params, state.grads, state.moments, state.step)
        return state.grads[state.start:state.stop]
    reduced = ring_reduce_scatter(ctx, full, phase="gradient reduce-scatter")     # (stop - start,) owns its memory
    grad_chunk = state.grads[state.start:state.stop] if state.stage == 1 else state.grads
    grad_chunk.copy_(reduced)
    del reduced
    look(PROBE_POINTS[2], state.held_bytes(params=(leaf,), grads=(full,)))
    del full, leaf, loss
    update(state.chunk, grad_chunk, state.moments, state.step)
    if state.stage in (1, 2):
        state.params.copy_(ring_all_gather(ctx, state.chunk.clone(), sizes, phase="parameter all-gather"))
    return grad_chunk


@dataclass(kw_only=True, frozen=True)
class ZeroRun:
    """What one rank ends a ZeRO run with: its own chunk of the weights, what it held, what its last step sent."""
    chunk: torch.Tensor                            # this rank's element range of the final flat parameters
    held: dict[str, int]                           # bytes by HELD_KINDS kind, between steps
    during: dict[str, dict[str, int]]              # probe point of the last step -> bytes by kind
    phases: dict[str, dict[str, int]]              # ledger totals of the last step, by phase
    rounds: int                                    # ledger rounds of the last step


def zero_rank(ctx: Context, cfg: ZeroConfig) -> ZeroRun:
    """Rank function: train cfg.steps steps; return own chunk, held bytes (steady and within the last step),
    ledger totals of the last step."""
    state, during = init_state(ctx, cfg), {}
    for _ in range(cfg.steps):
        ctx.ledger.reset()                        # keep only the last step's communication
        during = {}
        train_step(ctx, state, cfg, probe=lambda point, held: during.__setitem__(point, held))
    return ZeroRun(chunk=state.chunk.clone(), held=state.held_bytes(), during=during, phases=ctx.ledger.by_phase(),
                   rounds=ctx.ledger.totals()["rounds"])
