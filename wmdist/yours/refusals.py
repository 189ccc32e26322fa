"""What `workload.prepare_workload` refuses about your model and loss, before any process starts, and what it says.

Each refusal names what was found, not a guess at it: a model off the CPU (the meta device, a GPU),
BatchNorm in training mode or dropout (they make a shard compute another function than the whole batch),
a NaN or inf in a batch or in the step-0 losses, a forward that changes a parameter or a buffer, losses
that differ between two calls on the same batch with the parameters untouched and finite (randomness),
a parameter without a gradient, and a loss that reaches into the model instead of calling it.
`require_finite` is also what the ranks and the one-process reference call on each step's losses, so a
run that diverges later says at which step and where, not only that its checks failed.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Loss = Callable[[nn.Module, Any], torch.Tensor]


def refuse_off_cpu(model: nn.Module) -> None:
    """Every parameter and buffer on the CPU (the ranks are CPU processes on gloo); a meta tensor is named as such."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.device.type == "meta":
            raise ValueError(f"model() must build its parameters on the CPU, with values: {name} is on the meta "
                             "device (a shape and no numbers, so there is nothing to train or to compare). Build it "
                             "without device='meta' or a torch.device('meta') context, or give it values in model() "
                             "(model.to_empty(device='cpu'), then initialise or load its weights)")
        if t.device.type != "cpu":
            raise ValueError(f"model() must build its parameters on the CPU: {name} is on {t.device} (the ranks run "
                             "on the CPU over gloo; drop the .to(device) from model())")


def refuse_mixing_or_randomness(model: nn.Module) -> None:
    """BatchNorm in training mode (statistics over a shard) and active dropout (masks drawn per shard)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            raise ValueError(f"model mixes examples: {name or 'the model'} is a {type(m).__name__} in training mode, "
                             "whose statistics are taken over the examples of a shard, so N ranks would compute "
                             "another function than one process. Use GroupNorm or LayerNorm, or .eval() it in "
                             "model()")
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0:
            raise ValueError(f"{name} is a {type(m).__name__}(p={m.p}) in training mode: each shard would draw "
                             "other masks than one process. Use p=0 or .eval() it in model()")


def _nonfinite(t: torch.Tensor) -> str | None:
    """'NaN', 'inf' or None: what a float tensor holds that is not a finite number."""
    if not t.is_floating_point() or bool(torch.isfinite(t).all()):
        return None
    return "NaN" if bool(torch.isnan(t).any()) else "inf"


def require_finite(losses: torch.Tensor, *, step: int, where: str) -> None:
    """FloatingPointError naming the step, where (a rank, the one-process reference) and the first examples."""
    what = _nonfinite(losses.detach())
    if what is None:
        return
    examples = (~torch.isfinite(losses.detach())).reshape(-1).nonzero().reshape(-1).tolist()
    shown = ", ".join(str(i) for i in examples[:8]) + (", ..." if len(examples) > 8 else "")
    raise FloatingPointError(f"the loss is {what} at step {step} ({where}), for examples {shown} of that batch: "
                             "training diverged (a smaller lr?) or the loss takes log(0), 0/0 or sqrt of a negative "
                             "number; nothing can be compared after it")


def require_finite_batch(batch: Any, tensors: list[torch.Tensor], *, step: int) -> None:
    """ValueError when a float tensor of batch(step) holds NaN or inf (named by its position)."""
    for i, t in enumerate(tensors):
        what = _nonfinite(t)
        if what is not None:
            part = f"tensor {i} of" if len(tensors) > 1 else "the tensor of"
            raise ValueError(f"batch({step}) holds {what}: {part} its {type(batch).__name__} is not finite, so every "
                             "loss after it would be too")


def digest(t: torch.Tensor) -> str:
    """A digest of a CPU tensor's bytes: equal exactly when the bytes are (up to a 128-bit hash collision). What a
    rank sends instead of a second copy of its parameters when only their equality is checked."""
    return hashlib.blake2b(t.detach().contiguous().numpy().tobytes(), digest_size=16).hexdigest()


def _digests(model: nn.Module) -> dict[str, str]:
    """A digest of each parameter's bytes (one parameter copied at a time, not the model)."""
    return {name: digest(p) for name, p in model.named_parameters()}


def check_loss(model: nn.Module, loss: Loss, batch: Any, b: int) -> None:
    """The step-0 loss: its shape; parameters and buffers left alone; finite; the same twice; a gradient for all."""
    params_before = _digests(model)
    buffers_before = {name: t.clone() for name, t in model.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        first = loss(model, batch)
        if not isinstance(first, torch.Tensor) or tuple(first.shape) != (b,) or not first.dtype.is_floating_point:
            got = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
            raise ValueError(f"loss(model, batch) must return one float loss per example, shape ({b},), got {got}: "
                             "return the losses unreduced (e.g. reduction='none', then .mean over the other dims)")
        after = _digests(model)
        changed = [name for name in params_before if after[name] != params_before[name]]
        if changed:
            raise ValueError(f"the forward changes parameter(s) {changed} in place (a no_grad update, .data or "
                             "copy_ inside forward or the loss): each rank would change its copy by its own shard, "
                             "one process by the whole batch. Leave the parameters to the optimizer")
        for name, t in model.named_buffers():
            if not torch.equal(t, buffers_before[name]):
                raise ValueError(f"the forward changes buffer {name}: state computed from the batch differs "
                                 "between a shard and the whole batch")
        require_finite(first, step=0, where="in this process, before any rank starts")
        again = loss(model, batch)
    if not torch.equal(first.detach(), again.detach()):
        raise ValueError("loss(model, batch) gives other numbers on the same batch twice, with the parameters and "
                         "buffers unchanged and every loss finite: the forward draws random numbers (dropout, "
                         "torch.rand*), which the shards would draw differently")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(first.sum(), [p for _, p in named], allow_unused=True)
    unused = [name for (name, _), g in zip(named, grads) if g is None]
    if unused:
        raise ValueError(f"parameters {unused} get no gradient from the loss: DDP and the flat gradient buffer "
                         "need every trainable parameter used (drop them from the model, or freeze them with "
                         "requires_grad_(False))")


def require_float_dtype(params: list[tuple[str, nn.Parameter]]) -> torch.dtype:
    """The parameters' one dtype, float32 or float64: the byte formulas count its element size and the
    tolerances its unit roundoff (float64's 2^-53 makes them about 2^29 times tighter).

    bfloat16 and float16 are refused: training in them keeps float32 master weights and steps those in
    float32 (mixed precision), a training loop of its own that neither this package's runs nor their torch
    counterparts here implement, with other rounding bounds. A model mixing dtypes is refused too (one flat
    vector, one element size).
    """
    dtypes = {p.dtype for _, p in params}
    for name, p in params:
        if p.dtype in (torch.float32, torch.float64):
            continue
        if p.dtype in (torch.bfloat16, torch.float16):
            why = (f"{p.dtype} training keeps float32 master weights and steps them in float32 (mixed "
                   "precision), which wmdist.yours does not implement")
        else:
            why = "the runs and their rounding bounds are for floating-point parameters"
        raise ValueError(f"parameter {name} is {p.dtype}; wmdist.yours trains float32 or float64 parameters "
                         f"only: {why}. Build the model in float32 (model().float())")
    if len(dtypes) > 1:
        raise ValueError(f"the parameters mix dtypes {sorted(str(d) for d in dtypes)}: wmdist.yours trains one "
                         "flat vector of one dtype (float32 or float64); build the model in one")
    return dtypes.pop()


class _LikeDDP(nn.Module):
    """What torch's DDP hands your loss as `model`: a wrapper whose forward is yours, and nothing else of yours."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.module = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def check_loss_calls_the_model(model: nn.Module, loss: Loss, batch: Any) -> None:
    """data_parallel also runs your loss under DDP, which sees (and syncs gradients for) only model(...) calls.

    The loss has just run on the model itself (check_loss), so whatever fails here fails on the wrapper.
    """
    try:
        loss(_LikeDDP(model), batch)
    except Exception as err:
        raise ValueError(f"loss(model, batch) must reach the model only by calling it, model(...): data_parallel "
                         f"also trains it under torch's DDP, which hands your loss its wrapper, and DDP syncs the "
                         f"gradients of a forward only when it goes through that call (on a wrapper like DDP's, "
                         f"the loss raised {type(err).__name__}: {err}). "
                         f"Return what the loss needs from the model's forward") from None
