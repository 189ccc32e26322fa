"""wmdist.yours refuses bad input before any process starts: which argument, and what was expected.

Models that would make the ranks compute another function than one process (BatchNorm in training mode,
dropout, random numbers in the loss), losses of the wrong shape, batches the world size does not divide,
bad stages, sizes and layers; the no_processes guard fails a test the moment a rank would start. Each
refusal names what it found (issue 35 §7): a NaN or inf loss, a parameter the forward changes, a NaN in
a later batch, a model on the meta device are not reported as randomness; a loss that turns NaN only
after some steps is named with its step and rank by the ranks, and by the one-process reference.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from test_yours import GRUNet, conv_work, gru_batch, gru_loss, gru_work
from wmdist.yours import Workload, data_parallel, tensor_parallel, zero


class ShrinksItsWeight(nn.Module):
    """A forward that updates a parameter in place, outside autograd."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        with torch.no_grad():
            self.fc.weight.mul_(0.5)
        return self.fc(x)


def nan_at_step_2(step):
    x = batch8(step)
    if step == 2:
        x[3, 1] = float("nan")
    return x


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(3, 4), nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.fc(x)).sum(-1)


def batch8(step):
    return torch.randn(8, 3, generator=torch.Generator().manual_seed(step))


def per_row(model, x):
    return model(x).pow(2).reshape(x.shape[0], -1).mean(-1)


REFUSED = [
    (lambda: data_parallel(Workload(model=WithBatchNorm, loss=per_row, batch=batch8), world_size=2),
     ValueError, "mixes examples: norm is a BatchNorm1d"),
    (lambda: data_parallel(Workload(model=lambda: nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), loss=per_row,
                                    batch=batch8), world_size=2), ValueError, "Dropout"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), batch=batch8,
                                    loss=lambda m, x: (m(x) + torch.randn(x.shape[0], 2)).pow(2).mean(-1)),
                           world_size=2), ValueError, "random numbers"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), loss=lambda m, x: m(x).pow(2).mean(),
                                    batch=batch8), world_size=2), ValueError, r"shape \(8,\), got \(\)"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), loss=lambda m, x: m(x), batch=batch8),
                           world_size=2), ValueError, r"shape \(8,\), got \(8, 2\)"),
    (lambda: data_parallel(gru_work(), world_size=5), ValueError, "world_size 5 must divide it"),
    (lambda: data_parallel(conv_work(), world_size=16), ValueError, "world_size 16 must divide it"),
    (lambda: data_parallel(conv_work(), world_size=0), ValueError, "world_size must be an integer >= 1"),
    (lambda: data_parallel(conv_work(), world_size=True), ValueError, "world_size must be an integer >= 1"),
    (lambda: zero(conv_work(), stage=0, world_size=2), ValueError, r"stage must be one of \(1, 2, 3\)"),
    (lambda: zero(conv_work(), stage=4, world_size=2), ValueError, r"stage must be one of \(1, 2, 3\)"),
    (lambda: data_parallel(Workload(model=lambda: "net", loss=per_row, batch=batch8), world_size=2), TypeError,
     "must return an nn.Module"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), loss=per_row, batch=lambda s: [1, 2]),
                           world_size=2), TypeError, "must return a tensor"),
    (lambda: Workload(model=GRUNet, loss=gru_loss, batch=gru_batch, optimizer="rmsprop"), ValueError, "optimizer"),
    (lambda: Workload(model=GRUNet, loss=gru_loss, batch=gru_batch, lr=0), ValueError, "lr must be > 0"),
    (lambda: Workload(model=GRUNet(), loss=gru_loss, batch=gru_batch), TypeError, "model must build the module"),
    (lambda: Workload(model=GRUNet, loss="mse", batch=gru_batch), TypeError, "loss must be a callable"),
    (lambda: data_parallel(Workload(model=lambda: nn.ModuleDict({"a": nn.Linear(3, 1), "b": nn.Linear(3, 1)}),
                                    loss=lambda m, x: m["a"](x).squeeze(-1), batch=batch8), world_size=2),
     ValueError, "get no gradient"),
    (lambda: data_parallel(Workload(model=lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)),
                                    loss=lambda m, x: m[2](m[0](x)).pow(2).mean(-1), batch=batch8), world_size=2),
     ValueError, r"must reach the model only by calling it, model\(\.\.\.\).*TypeError: .* not subscriptable"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), loss=lambda m, x: m(x).mean(-1) * float("nan"),
                                    batch=batch8), world_size=2), FloatingPointError,
     r"the loss is NaN at step 0 \(in this process, before any rank starts\), for examples 0, 1, 2, 3, 4, 5, 6, 7 of"),
    (lambda: zero(Workload(model=lambda: nn.Linear(3, 2), loss=lambda m, x: m(x).pow(2).mean(-1) / (x[:, 0] > 0),
                           batch=batch8), stage=3, world_size=2), FloatingPointError, "the loss is inf at step 0"),
    (lambda: data_parallel(Workload(model=ShrinksItsWeight, loss=per_row, batch=batch8), world_size=2), ValueError,
     r"the forward changes parameter\(s\) \['fc.weight'\] in place"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2), loss=per_row, batch=nan_at_step_2), world_size=2),
     ValueError, r"batch\(2\) holds NaN"),
    (lambda: data_parallel(Workload(model=lambda: nn.Linear(3, 2, device="meta"), loss=per_row, batch=batch8),
                           world_size=2), ValueError, "must build its parameters on the CPU, with values: weight is on "
                                                      "the meta device"),
    (lambda: zero(Workload(model=lambda: nn.Linear(3, 2).to("meta"), loss=per_row, batch=batch8), stage=3,
                  world_size=2), ValueError, "weight is on the meta device"),
    (lambda: tensor_parallel(nn.Linear(5, 12), nn.Linear(10, 3), torch.randn(4, 5)), ValueError, "in_features"),
    (lambda: tensor_parallel(nn.Linear(5, 2), nn.Linear(2, 3), torch.randn(4, 5), world_size=3), ValueError,
     "more than first's 2 output features"),
    (lambda: tensor_parallel(nn.Linear(5, 12), nn.Linear(12, 3), torch.randn(4, 4)), ValueError, r"\(\.\.\., 5\)"),
    (lambda: tensor_parallel(nn.Conv1d(5, 12, 1), nn.Linear(12, 3), torch.randn(4, 5)), TypeError, "nn.Linear"),
]


@pytest.mark.parametrize("call,error,message", REFUSED, ids=[f"refused-{i}" for i in range(len(REFUSED))])
def test_bad_input_is_refused_before_any_process(no_processes, call, error, message):
    with pytest.raises(error, match=message):
        call()


RANDOM = "random numbers"


@pytest.mark.parametrize("index", [i for i, (_, _, m) in enumerate(REFUSED) if "loss is" in m or "changes param" in m
                                   or "meta" in m])
def test_what_is_not_randomness_is_not_called_randomness(no_processes, index):
    call, error, _ = REFUSED[index]
    with pytest.raises(error) as caught:
        call()
    assert RANDOM not in str(caught.value) and "dropout" not in str(caught.value).lower()


def test_randomness_is_still_called_randomness(no_processes):
    with pytest.raises(ValueError, match="with the parameters and buffers unchanged and every loss finite: the "
                                         "forward draws random numbers"):
        data_parallel(Workload(model=lambda: nn.Linear(3, 2), batch=batch8,
                               loss=lambda m, x: (m(x) + torch.rand(x.shape[0], 2)).pow(2).mean(-1)), world_size=2)


def diverging() -> Workload:
    """Finite at step 0, inf from step 1: lr 1e30 blows the weights up."""
    return Workload(model=lambda: nn.Linear(3, 2), loss=per_row, batch=batch8, lr=1e30)


def test_a_loss_that_diverges_later_is_named_by_the_reference(no_processes):
    from wmdist.yours.reference import one_process
    with pytest.raises(FloatingPointError, match=r"the loss is inf at step 1 \(the one-process reference\)"):
        one_process(diverging(), 2)


@pytest.mark.parametrize("stage", [0, 3])
def test_a_loss_that_diverges_later_is_named_by_the_rank(stage):
    from wmdist import RankFailure
    with pytest.raises(RankFailure, match=r"the loss is inf at step 1 \(rank [01], our (data parallelism|ZeRO-3)\)"):
        data_parallel(diverging(), world_size=2) if stage == 0 else zero(diverging(), stage=3, world_size=2)
