"""dp-compression: torch's DDP comm hooks counted in our ledger, bytes == formula, errors measured.

The formula is checked against numbers worked out by hand from the model's shapes (not by calling
itself), the demo's Counts against the formula on every rank at N = 2 and 4, and the comparison is
shown to fail for a wrong formula and for a NaN in one rank's result.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist

from wmdist.costs import compression as formula
from wmdist.data_parallel import compression_demo as demo
from wmdist.data_parallel.compression import HOOK_MODULES, compression_runs, counting_hook_all_reduce
from wmdist.models.world import make_model
from wmdist.runtime import run

SHAPES = [tuple(p.shape) for p in make_model().parameters()]
# By hand: weights (24,16), (24,52), (16,24) are compressed at r = 1, 2, 4 (2 (n+m) r < n m);
# (1,24) and the biases (k entries viewed as k x 1) are not: 24 + 24 + 16 + 1 + 24 = 89 entries.
PLAIN = 89
P_FACTOR, Q_FACTOR = 24 + 24 + 16, 16 + 52 + 24     # rows and columns of the compressed weights


def test_formula_by_hand() -> None:
    assert formula.numel(SHAPES) == 2105
    assert formula.hook_bytes("none", SHAPES) == 4 * 2105
    assert formula.hook_bytes("fp16", SHAPES) == formula.hook_bytes("bf16", SHAPES) == 2 * 2105
    for r in (1, 2, 4):
        assert formula.powersgd_layout(SHAPES, r) == (PLAIN, P_FACTOR * r, Q_FACTOR * r)
        assert formula.hook_bytes("powersgd", SHAPES, rank=r, step=2, start_iter=2) == 4 * (PLAIN + 156 * r)
        assert formula.hook_bytes("powersgd", SHAPES, rank=r, step=1, start_iter=2) == 4 * 2105   # vanilla phase
    assert formula.powersgd_layout([(24, 16)], 8) == (384, 0, 0)          # (24+16) 8 2 = 640 >= 384: sent whole
    assert formula.hook_calls("powersgd", step=2, start_iter=2) == 3 and formula.hook_calls("fp16") == 1


@pytest.mark.parametrize("call, arg", [
    (lambda: formula.hook_bytes("int8", SHAPES), "kind"),
    (lambda: formula.powersgd_layout(SHAPES, 0), "rank"),
    (lambda: formula.numel([]), "shapes"),
    (lambda: formula.numel([(3, 0)]), "shapes"),
    (lambda: formula.hook_bound_terms("fp16", 0), "world_size"),
])
def test_formula_refuses(call, arg) -> None:
    with pytest.raises(ValueError, match=arg):
        call()


def test_half_bound_is_more_than_one_rounding() -> None:
    rel, _ = formula.hook_bound_terms("fp16", 2)
    assert 3 * 2.0 ** -11 < rel < 3.01 * 2.0 ** -11 + 3 * 2.0 ** -24      # gamma(3, u16) + gamma(2, u32)


@pytest.mark.parametrize("kwargs, arg", [({"world_size": 1}, "world_size"), ({"world_size": 3}, "world_size"),
                                         ({"world_size": 2, "steps": 2}, "steps"),
                                         ({"world_size": 2, "ranks": ()}, "ranks")])
def test_sizes_refused_before_any_process(monkeypatch, kwargs, arg) -> None:
    def no_processes(*args, **kw):
        raise AssertionError("a process was started for a refused spec")
    monkeypatch.setattr("wmdist.course.experiment.run", no_processes)
    with pytest.raises(ValueError, match=arg):
        demo.compression_spec(**kwargs)
    if set(kwargs) == {"world_size"}:
        assert demo.COMPRESSION_DEMO.refuses(kwargs["world_size"])
        with pytest.raises(ValueError, match="world_size"):
            demo.COMPRESSION_DEMO.run(kwargs["world_size"])


def test_hook_modules_get_torch_distributed_back_on_error() -> None:
    with pytest.raises(RuntimeError):
        with counting_hook_all_reduce(None, "x"):                      # type: ignore[arg-type]
            assert all(m.dist is not dist for m in HOOK_MODULES)
            assert HOOK_MODULES[0].dist.ReduceOp is dist.ReduceOp      # everything else forwarded
            raise RuntimeError("backward failed")
    assert all(m.dist is dist for m in HOOK_MODULES)


@pytest.fixture(scope="module", params=[2, 4])
def ran(request):
    spec = demo.compression_spec(request.param)
    return spec, run(compression_runs, spec.world_size, spec, timeout=120)


def test_bytes_equal_formula_on_every_rank(ran) -> None:
    spec, results = ran
    verdict = demo.compare_compression(spec, results)
    assert all(c.passed for c in verdict.checks), [c.describe() for c in verdict.checks if not c.passed]
    byte_counts = [c for c in verdict.exact if c.quantity == "hook all_reduce bytes sent"]
    assert len(byte_counts) == len(spec.methods) * spec.train.steps * spec.world_size
    assert all(c.measured == c.predicted for c in verdict.exact)
    by_hand = {"none": 8420, "fp16": 4210, "bf16": 4210, "powersgd r=1": 980, "powersgd r=2 no-EF": 1604,
               "powersgd r=4": 2852}
    for label, want in by_hand.items():
        seen = {c.measured for c in byte_counts if c.case == label and c.step == spec.train.steps - 1}
        assert seen == {want}, label
    assert {c.measured for c in byte_counts if c.case == "powersgd r=1" and c.step < spec.start_iter} == {8420}


def test_measured_table_is_sane(ran) -> None:
    spec, results = ran
    data = demo.compare_compression(spec, results).data
    row = data.row
    assert row("fp16").first_error < row("bf16").first_error < row("powersgd r=4").first_error   # measured
    assert all(math.isfinite(r.final_loss) for r in data.rows)
    assert len(demo.table_lines(data)) == len(spec.methods) + 1


def test_wrong_formula_fails(ran, monkeypatch) -> None:
    spec, results = ran
    monkeypatch.setattr(formula, "HALF_BYTES", 4)                      # counting a float16 as 4 bytes
    verdict = demo.compare_compression(spec, results)
    wrong = [c for c in verdict.exact if c.measured != c.predicted]
    assert wrong and {c.case for c in wrong} == {"fp16", "bf16"}


@pytest.mark.parametrize("field", ["applied", "losses"])
def test_nan_in_one_rank_fails(ran, field) -> None:
    spec, results = ran
    last = results[-1]
    run0 = last.runs[1]                                                  # fp16
    bad = (run0.applied.clone().index_fill_(1, torch.tensor([7]), math.nan) if field == "applied"
           else (math.nan,) + run0.losses[1:])
    broken = dataclasses.replace(last, runs=(last.runs[0], dataclasses.replace(run0, **{field: bad}), *last.runs[2:]))
    verdict = demo.compare_compression(spec, [*results[:-1], broken])
    assert not all(c.passed for c in verdict.checks)
