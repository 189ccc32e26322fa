"""Frozen parameters (requires_grad=False, the fine-tuning case) and parameter dtypes in wmdist.yours.

A model with a frozen first layer trains with our data parallelism and ZeRO-1/2/3 on 2 real ranks, next to
torch's DDP, ZeroRedundancyOptimizer and FSDP2: every check of its Report passes (the parameters within the
measured tolerance of one process, frozen weights bit for bit as built), and every byte count equals its
formula with P the trainable elements, which is not the formula with every element.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from wmdist import costs
from wmdist.yours import Workload, data_parallel, tensor_parallel, zero
from wmdist.yours.workload import prepare

X = torch.randn(3, 8, 5, generator=torch.Generator().manual_seed(3))
Y = torch.randn(3, 8, 2, generator=torch.Generator().manual_seed(4))


def frozen_first() -> nn.Module:
    """A 5 -> 6 -> 4 -> 2 MLP whose first layer is frozen (a pretrained encoder kept fixed)."""
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    net[0].requires_grad_(False)
    return net


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean(dim=1)


def work(**options) -> Workload:
    return Workload(model=frozen_first, loss=mse, batch=lambda step: (X[step], Y[step]), **options)


FROZEN = 5 * 6 + 6
TRAINABLE = 6 * 4 + 4 + 4 * 2 + 2


def test_the_spec_counts_trainable_elements_only():
    spec = prepare(work(), 2)
    assert (spec.numel, spec.frozen_numel) == (TRAINABLE, FROZEN)
    assert spec.trainable == (False, False, True, True, True, True)



def _counts(report) -> list:
    return [c for c in report.exact]


def _assert_passes(report, *, frozen_checks: int) -> None:
    failed = [(c.name, c.error, c.tolerance) for c in report.checks if not c.passed]
    assert not failed, failed
    assert sum("frozen parameters unchanged" in c.name for c in report.checks) == frozen_checks
    wrong = [c for c in report.exact if not c.passed]
    assert not wrong, wrong


def test_data_parallel_trains_a_frozen_layer_like_ddp():
    report = data_parallel(work(optimizer="adam", lr=0.05), world_size=2)
    _assert_passes(report, frozen_checks=2)
    ring = [c for c in report.exact if c.quantity == "ring bytes sent"]
    assert ring and all(c.predicted == costs.ring_allreduce_bytes(TRAINABLE, 2, 0) for c in ring)
    # counted with the frozen elements, the formula would not be what the ranks sent: the count can fail
    assert costs.ring_allreduce_bytes(TRAINABLE + FROZEN, 2, 0) != ring[0].measured
    ddp = [c for c in report.exact if c.quantity == "DDP bucket payload bytes"]
    assert ddp and all(c.measured == 3 * 4 * TRAINABLE for c in ddp)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_trains_a_frozen_layer_like_torch(stage):
    report = zero(work(optimizer="sgd", momentum=0.9, lr=0.05), stage=stage, world_size=2)
    _assert_passes(report, frozen_checks=2)
    held = {c.case: c for c in report.exact if c.quantity == "held bytes" and c.rank == 0}
    assert held["frozen parameters (whole on every rank)"].measured == 4 * FROZEN
    every = costs.zero_step_bytes(TRAINABLE + FROZEN, 2, 0, stage)
    ring = [c for c in report.exact if c.quantity == "ring bytes sent" and c.rank == 0 and c.step == 0]
    assert ring and any(c.measured != every[c.phase] for c in ring)
