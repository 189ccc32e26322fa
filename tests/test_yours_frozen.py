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
from wmdist.yours.dp_check import OursThenTorch, compare_dp
from wmdist.yours.reference import one_process
from wmdist.yours.refusals import digest
from wmdist.yours.training import ReplicaResult, workload_optimizer
from wmdist.yours.versus_torch import TorchResult
from wmdist.yours.workload import build_model, flat, trainable_grads, prepare_workload, trainable

GRAD = "step-0 gradient == one process (in units of its rounding bound)"

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
    spec = prepare_workload(work(), 2)
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


def frozen_inside() -> nn.Module:
    """Frozen weights gradients flow through: the middle layer's weight (its bias trains: one FSDP2 unit with
    both kinds) and the last layer's bias."""
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    net[2].weight.requires_grad_(False)
    net[4].bias.requires_grad_(False)
    return net


@pytest.mark.parametrize("stage", [0, 3])
def test_frozen_weights_inside_the_model(stage):
    inside = Workload(model=frozen_inside, loss=mse, batch=lambda step: (X[step], Y[step]), optimizer="adam",
                      lr=0.05)
    assert prepare_workload(inside, 2).numel == 5 * 6 + 6 + 4 + 4 * 2
    report = data_parallel(inside, world_size=2) if stage == 0 else zero(inside, stage=3, world_size=2)
    _assert_passes(report, frozen_checks=2)
    if stage:
        scatter = [c for c in report.exact if c.phase == "fsdp2/reduce-scatter" and "bytes" in c.quantity]
        assert scatter and all(c.measured == 3 * 4 * (5 * 6 + 6 + 4 + 4 * 2) for c in scatter)  # padded: N | rows


# --- dtypes ----------------------------------------------------------------------------------

X64, Y64 = X.double(), Y.double()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))


def work_in(dtype: torch.dtype, **options) -> Workload:
    xs, ys = X.to(dtype), Y.to(dtype)
    return Workload(model=lambda: mlp().to(dtype), loss=mse, batch=lambda step: (xs[step], ys[step]), **options)


def _tolerances(report) -> dict[str, float]:
    return {c.name: c.tolerance for c in report.checks}


def test_float64_passes_with_8_byte_counts_and_tighter_tolerances():
    ours64 = data_parallel(work_in(torch.float64, optimizer="adam", lr=0.05), world_size=2)
    _assert_passes(ours64, frozen_checks=0)
    numel = 5 * 6 + 6 + TRAINABLE
    ring = [c for c in ours64.exact if c.quantity == "ring bytes sent"]
    assert ring and all(c.measured == costs.ring_allreduce_bytes(numel, 2, c.rank, elem_size=8) for c in ring)
    ours32 = data_parallel(work_in(torch.float32, optimizer="adam", lr=0.05), world_size=2)
    name = "final parameters == one process (rank 0)"
    t64, t32 = _tolerances(ours64)[name], _tolerances(ours32)[name]
    assert 0 < t64 < t32 * 1e-6                  # float64's u is 2^-29 of float32's: the derived bound follows it
    assert ours64.data.ours_vs_one_process <= t64


def test_float64_zero3_passes():
    _assert_passes(zero(work_in(torch.float64, optimizer="adam", lr=0.05), stage=3, world_size=2), frozen_checks=0)


def _summed_not_averaged(work: Workload) -> ReplicaResult:
    """Rank 0 of 2 with a planted bug, simulated in this process: the gradient summed over ranks and not
    averaged (twice the whole batch's mean-loss gradient), applied every step."""
    model = build_model(work)
    opt = workload_optimizer(model, work)
    for step in range(work.steps):
        x, y = work.batch(step)
        opt.zero_grad()
        (mse(model, (x, y)).mean() * 2).backward()
        if step == 0:
            grad0 = trainable_grads(model)
        opt.step()
    final = flat(trainable(model))
    return ReplicaResult(grad0=grad0, params=final, digest=digest(final), bytes_per_step=(0,) * work.steps,
                         rounds_per_step=(0,) * work.steps)


def test_float64_still_catches_a_planted_bug(no_processes):
    spec = prepare_workload(work_in(torch.float64, optimizer="adam", lr=0.05), 2)
    ref = one_process(spec.work, 2)
    bugged = _summed_not_averaged(spec.work)
    ddp = TorchResult(params=(ref.params,), grad0=ref.grad0, sent={"ddp/grads": 0}, calls={})
    checks = {c.name: c for c in compare_dp(spec, [OursThenTorch(bugged, ddp)] * 2).checks}
    grad, params = checks[GRAD], checks["final parameters == one process (rank 0)"]
    assert not grad.passed and grad.error > 10, grad
    assert not params.passed and params.error > 10 * params.tolerance, params


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_refused_with_the_reason(dtype):
    with pytest.raises(ValueError, match="master weights.*mixed precision"):
        prepare_workload(work_in(dtype), 2)


def test_mixed_dtypes_are_refused():
    def half_double():
        net = mlp()
        net[4].double()
        return net
    with pytest.raises(ValueError, match="mix dtypes"):
        prepare_workload(Workload(model=half_double, loss=mse, batch=lambda step: (X[step], Y[step])), 2)


def test_an_all_frozen_model_is_refused():
    def still():
        return mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of model\\(\\) is frozen"):
        prepare_workload(Workload(model=still, loss=mse, batch=lambda step: (X[step], Y[step])), 2)


# --- tensor parallelism: what it splits, and where the course teaches it ------------------------

@pytest.mark.parametrize("first,second", [(nn.Conv1d(5, 12, 1), nn.Linear(12, 3)),
                                          (nn.Linear(5, 12), nn.Embedding(12, 3)),
                                          (nn.Linear(5, 12).double(), nn.Linear(12, 3))])
def test_tensor_parallel_names_the_pairs_it_splits_and_the_chapter(no_processes, first, second):
    with pytest.raises(TypeError) as err:
        tensor_parallel(first, second, torch.randn(4, 5))
    text = str(err.value)
    assert "nn.Linear split column-wise" in text and "nn.Linear split row-wise" in text
    assert "elementwise activation" in text
    assert "chapter 04" in text and "notebooks/04_tensor_parallel.ipynb" in text and "Megatron-LM's pairing" in text


def test_the_chapter_04_section_the_error_names_exists():
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "04_tensor_parallel.ipynb").read_text())
    assert any("Megatron-LM's pairing" in "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
