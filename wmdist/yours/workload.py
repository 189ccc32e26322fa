"""Your own model as a workload: what to build, what loss, which batches; checked before any process starts.

`Workload` names three functions of yours and the optimizer:

    model()             -> nn.Module      built after torch.manual_seed(seed), so every rank and the
                                          one-process reference start from the same weights
    loss(model, batch)  -> (B,) tensor    one loss per example, unreduced (reduction="none")
    batch(step)         -> the global batch of that step: a tensor, a tuple/list or a dict of tensors,
                                          examples along dim 0 of each

`prepare_workload(work, world_size, stage=...)` builds the model once in this process and runs the loss on the
step-0 batch, so everything that would make the ranks compute another function than one process is
refused here, with a ValueError or TypeError naming what was found (refusals.py): a model off the CPU
(the meta device, a GPU), a BatchNorm in training mode (it mixes the examples of a batch), dropout or
any other randomness (each shard would draw other numbers), a forward that changes a parameter or a
buffer, a NaN or inf in a batch or a step-0 loss, a trainable parameter that gets no gradient, a
parameter that is neither float32 nor float64, or a mix (refusals.require_float_dtype says why), a loss of the
wrong shape, a batch world_size does not divide, and for data_parallel a loss that reaches into the
model (model.enc(x)) instead of calling it (DDP sees only the call). Tied parameters (one weight in two layers) are one
parameter everywhere: one flat-vector slot, one FSDP2 unit (the root's). A model that mixes examples
some other way (x - x.mean(0)) is not caught here: its Report fails, which is the finding.

Frozen parameters (requires_grad=False, as in fine-tuning) are kept whole and unchanged on every rank:
never all-reduced, reduce-scattered or stepped, so P (spec.numel, the flat vector, every byte formula)
counts the trainable elements only; at least one must train. float64 models run in float64 throughout:
bytes are 8 an element and the tolerances use float64's unit roundoff.

Functions defined in a notebook cell or a test are shipped to the ranks by value (cloudpickle), their
module included, since a rank cannot import it.
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args

import cloudpickle
import torch
from torch import nn

from wmdist import costs
from wmdist.yours import refusals
from wmdist.models import seeded

Optimizer = Literal["sgd", "adam"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
Batch = Union[torch.Tensor, tuple, list, dict]     # a tensor, or a tuple/list/dict of tensors; examples on dim 0


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Your model, per-example loss and batches, trained `steps` steps by SGD (with momentum) or Adam (torch's
    default betas and eps)."""
    model: Callable[[], nn.Module]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    batch: Callable[[int], Any]
    steps: int = 3
    optimizer: Optimizer = "sgd"
    lr: float = 0.01
    momentum: float = 0.0        # SGD's momentum (0: plain SGD, no optimizer state); Adam ignores it
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.model, nn.Module):
            raise TypeError("model must build the module (model=MyNet, or lambda: MyNet(...)), not be one: every "
                            "rank and the reference build their own from the seed")
        for name in ("model", "loss", "batch"):
            if not callable(getattr(self, name)):
                raise TypeError(f"{name} must be a callable, got {type(getattr(self, name)).__name__}")
        costs.require_int("steps", self.steps, 1)
        costs.require_choice("optimizer", self.optimizer, OPTIMIZERS)
        costs.require_positive("lr", self.lr)
        costs.require_real("momentum", self.momentum, high=0.999)
        costs.require_int("seed", self.seed, 0)


def build_model(work: Workload) -> nn.Module:
    """work.model() after torch.manual_seed(work.seed); the caller's random state is left as it was."""
    return seeded(work.model, work.seed)


def tensors_of(batch: Any, *, where: str) -> list[torch.Tensor]:
    """The tensors of a batch (a tensor, a tuple/list or a dict of tensors); TypeError naming `where` otherwise."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (tuple, list)) \
        else None
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise TypeError(f"{where} must return a tensor, or a non-empty tuple, list or dict of tensors, "
                        f"got {type(batch).__name__}")
    return items


def batch_size(batch: Any, *, where: str) -> int:
    """B: the examples along dim 0, the same for every tensor of the batch (ValueError naming `where` otherwise)."""
    sizes = {t.shape[0] if t.dim() else None for t in tensors_of(batch, where=where)}
    if None in sizes or len(sizes) != 1:
        raise ValueError(f"{where}: every tensor needs the examples along dim 0, the same number in each; "
                         f"got dim-0 sizes {sorted(str(s) for s in sizes)}")
    return int(sizes.pop())


def rows(batch: Any, start: int, stop: int) -> Any:
    """Examples [start, stop) of a batch, in the batch's own structure."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: v[start:stop] for k, v in batch.items()}
    return type(batch)(t[start:stop] for t in batch)


def shard(batch: Any, world_size: int, rank: int) -> Any:
    """Rank `rank`'s B/N consecutive examples (N divides B: prepare checked it)."""
    each = batch_size(batch, where="batch(step)") // world_size
    return rows(batch, rank * each, (rank + 1) * each)


def ship_by_value(fn: Any) -> None:
    """Let cloudpickle send fn's module by value when a rank cannot import it (a test file, a script's helper).

    A notebook's functions live in __main__, which cloudpickle already sends by value.
    """
    fn = getattr(fn, "func", fn)                                       # a functools.partial
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__ == "__main__":
        return
    top = module.__name__.split(".")[0]
    if top in ("wmdist", "torch", "numpy", "builtins") or top in sys.stdlib_module_names:
        return
    try:
        cloudpickle.register_pickle_by_value(module)
    except ValueError:
        pass                                                           # not a module cloudpickle can send


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """A checked workload on `world_size` ranks: stage 0 is replicated data parallelism, 1-3 the ZeRO stages."""
    world_size: int
    work: Workload
    stage: int
    batch_sizes: tuple[int, ...]                               # B of each step
    names: tuple[str, ...]                                     # parameter names, in parameter order
    shapes: tuple[tuple[int, ...], ...]                        # their shapes
    trainable: tuple[bool, ...]                                # requires_grad of each parameter
    units: tuple[tuple[str, tuple[int, ...]], ...]            # FSDP2 units: (module name, its params' indices)
    dtype: torch.dtype = torch.float32                         # the parameters' dtype: float32 or float64

    @property
    def element_bytes(self) -> int:
        """Bytes of one parameter element: 4 (float32) or 8 (float64), what every byte formula counts."""
        return torch.finfo(self.dtype).bits // 8

    @property
    def numel(self) -> int:
        """P: the elements of the trainable parameters, the flat vector every formula counts."""
        return sum(_prod(s) for s, t in zip(self.shapes, self.trainable) if t)

    @property
    def frozen_numel(self) -> int:
        """The elements of the frozen parameters (requires_grad=False): whole and unchanged on every rank."""
        return sum(_prod(s) for s, t in zip(self.shapes, self.trainable) if not t)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that train (requires_grad), in parameter order: the only ones reduced, sharded, stepped."""
    return [p for p in model.parameters() if p.requires_grad]


def frozen(model: nn.Module) -> list[nn.Parameter]:
    """The frozen parameters (requires_grad=False), in parameter order: replicated, never sent, never stepped."""
    return [p for p in model.parameters() if not p.requires_grad]


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened in order into one detached buffer (empty if there are none)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def trainable_grads(model: nn.Module) -> torch.Tensor:
    """The trainable parameters' gradients in order, as one (P,) buffer."""
    return flat([p.grad for p in trainable(model)])


def set_trainable_grads(model: nn.Module, buffer: torch.Tensor) -> None:
    """Write a (P,) buffer into the .grad of each trainable parameter."""
    params = trainable(model)
    for p, piece in zip(params, torch.split(buffer, [p.numel() for p in params])):
        p.grad.copy_(piece.view_as(p))


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def prepare_workload(work: Workload, world_size: int, *, stage: int = 0) -> WorkloadSpec:
    """Check `work` on `world_size` ranks (before any process starts) and decide the sizes; see the module doc."""
    if not isinstance(work, Workload):
        raise TypeError(f"work must be a Workload, got {type(work).__name__}")
    n = costs.require_int("world_size", world_size, 1)
    costs.require_choice("stage", stage, (0, 1, 2, 3))
    sizes = []
    for step in range(work.steps):
        batch = work.batch(step)
        b = batch_size(batch, where=f"batch({step})")
        refusals.require_finite_batch(batch, tensors_of(batch, where=f"batch({step})"), step=step)
        if b < n or b % n:
            raise ValueError(f"batch({step}) has {b} examples: world_size {n} must divide it, so that every rank "
                             f"gets B/N >= 1 of them (torch's DDP averages equal shards)")
        sizes.append(b)
    model = build_model(work)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model() must return an nn.Module, got {type(model).__name__}")
    refusals.refuse_off_cpu(model)
    refusals.refuse_mixing_or_randomness(model)
    params = list(model.named_parameters())
    if not params:
        raise ValueError("model() has no parameters: there is nothing to train")
    dtype = refusals.require_float_dtype(params)
    if not any(p.requires_grad for _, p in params):
        raise ValueError("every parameter of model() is frozen (requires_grad=False): there is nothing to train")
    refusals.check_loss(model, work.loss, work.batch(0), sizes[0])
    if stage == 0:
        refusals.check_loss_calls_the_model(model, work.loss, work.batch(0))
    numel = sum(p.numel() for _, p in params if p.requires_grad)
    if stage and numel < n:
        raise ValueError(f"the model has {numel} trainable parameter elements, fewer than world_size {n}: a ZeRO "
                         "rank would own none")
    for fn in (work.model, work.loss, work.batch):
        ship_by_value(fn)
    return WorkloadSpec(world_size=n, work=work, stage=stage, batch_sizes=tuple(sizes),
                        names=tuple(name for name, _ in params), shapes=tuple(tuple(p.shape) for _, p in params),
                        trainable=tuple(p.requires_grad for _, p in params), units=_units(model), dtype=dtype)


def _units(model: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """FSDP2's units as versus_torch shards them: each direct child with parameters, then the root's own.

    A parameter is sharded by one unit only, so a child that shares a parameter with another child or with
    the root (tied weights) is not a unit of its own: its parameters stay with the root, as torch advises.
    """
    index = {id(p): i for i, p in enumerate(model.parameters())}           # a tied parameter has one index
    children = [(name, tuple(index[id(p)] for p in child.parameters())) for name, child in model.named_children()]
    own = tuple(index[id(p)] for p in model.parameters(recurse=False))
    seen = Counter(i for _, idx in children for i in idx) + Counter(own)
    units = [(name, idx) for name, idx in children if idx and all(seen[i] == 1 for i in idx)]
    in_units = {i for _, idx in units for i in idx}
    rest = tuple(i for i in range(len(index)) if i not in in_units)
    return tuple(units + ([("(root)", rest)] if rest else []))

