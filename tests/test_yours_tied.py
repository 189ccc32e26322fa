"""wmdist.yours on a model with tied weights: one weight used by two layers, as tied embeddings are.

A tied weight is one parameter: one slot of the flat vector, one gradient summed over both uses, one
FSDP2 unit (the root's, since a parameter can be sharded by one unit only). Before this was handled,
ZeRO failed inside the ranks: Module.to("meta") split the weight in two and backward met a meta tensor.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from test_yours import assert_exact_counts, names
from wmdist.memory.zero import flat_layout
from wmdist.models.world import on_meta
from wmdist.yours import Workload, data_parallel, zero
from wmdist.yours.workload import prepare_workload


class TiedNet(nn.Module):
    """in -> tanh(mid) -> out, where out's weight is in's (6 x 6, used twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 6, bias=False)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)
        self.out = nn.Linear(6, 6, bias=False)
        self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:               # (B, 6) -> (B, 6)
        h = torch.tanh(self.mid(self.inp(x)))
        return self.out(h) + self.head(h).sum(-1, keepdim=True)


def tied_loss(model, x):
    return (model(x) - x).pow(2).mean(-1)                              # (B,)


def tied_batch(step):
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(50 + step))


def tied_work() -> Workload:
    return Workload(model=TiedNet, loss=tied_loss, batch=tied_batch, optimizer="adam", lr=1e-2)


def test_a_tied_weight_stays_one_parameter_on_the_meta_device():
    model = TiedNet()
    layout, numel = flat_layout(model)
    assert [name for name, *_ in layout] == ["model.inp.weight", "model.mid.weight", "model.mid.bias",
                                             "model.head.weight", "model.head.bias"]
    assert numel == 36 + 36 + 6 + 18 + 3
    meta = on_meta(model)
    assert meta.out.weight is meta.inp.weight and meta.inp.weight.device.type == "meta"
    untied = TiedNet().to("meta")                                   # on_meta's reason: to() alone unties
    assert untied.out.weight is not untied.inp.weight


def test_fsdp2_units_leave_a_tied_weight_with_the_root(no_processes):
    spec = prepare_workload(tied_work(), 2, stage=3)
    assert spec.names == ("inp.weight", "mid.weight", "mid.bias", "head.weight", "head.bias")
    assert spec.units == (("mid", (1, 2)), ("head", (3, 4)), ("(root)", (0,)))   # inp and out share index 0


@pytest.mark.parametrize("stage", [0, 1, 3], ids=["dp", "zero-1", "zero-3"])
def test_a_tied_model_trains_as_one_process_and_as_torch(stage):
    report = data_parallel(tied_work(), world_size=2) if stage == 0 else zero(tied_work(), stage=stage, world_size=2)
    assert report.passed, report.failures
    assert_exact_counts(report, "ring bytes sent", "ring rounds")
    if stage == 3:
        assert "our ZeRO-3 == FSDP2 (reshard_after_forward=True)" in names(report)
        assert_exact_counts(report, "FSDP2 all-gathers", "FSDP2 payload bytes sent")
        assert report.measured(quantity="FSDP2 all-gathers")[0] == 3 * 2 * 3       # 3 steps, twice, 3 units
    assert report.params["numel"] == 99                                            # the tied 36 counted once
