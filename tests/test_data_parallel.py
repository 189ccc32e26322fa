"""Chapter 01: data parallelism checked against one process and DDP; the pitfalls fail as the text says."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from wmdist import costs
from wmdist.comm import ring_all_reduce
from wmdist.course.compare import bound_ratio
from wmdist.data_parallel import pitfalls as dp_pitfalls, ring, training as dp, versus_ddp
from wmdist.registry.demos import registry
from wmdist.course.exercises import check
from wmdist.models.world import flat_grads, linear_term_sums, make_batch, make_model, set_flat_grads, shard_batch
from wmdist.course.report import differ_check
from wmdist.runtime import run


# --- pure parts, no processes ------------------------------------------------------

def test_spec_rejects_bad_input_with_the_argument_named():
    with pytest.raises(ValueError, match="weighting"):
        dp.TrainSpec(weighting="median")
    with pytest.raises(ValueError, match="optimizer"):
        dp.TrainSpec(optimizer="lamb")
    with pytest.raises(ValueError, match="add up to batch_size"):
        dp.TrainSpec(batch_size=16, sizes=(7, 5, 3))
    with pytest.raises(TypeError, match="sizes"):
        dp.TrainSpec(batch_size=16, sizes=[7, 5, 3, 1])
    with pytest.raises(ValueError, match="steps"):
        dp.TrainSpec(steps=0)
    with pytest.raises(ValueError, match="lr"):
        dp.TrainSpec(lr=0.0)
    with pytest.raises(ValueError, match="skew_momentum"):
        dp.TrainSpec(optimizer="adam", skew_momentum=True)
    with pytest.raises(ValueError, match="world_size is 2"):
        dp.TrainSpec(batch_size=16, sizes=(7, 5, 3, 1)).shard_sizes(2)


def test_demos_reject_bad_world_sizes_before_starting_processes():
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        dp_pitfalls.unequal_demo(1)
    with pytest.raises(ValueError, match="world_size"):
        dp_pitfalls.pitfalls_demo(0)
    with pytest.raises(ValueError, match="DDP"):
        versus_ddp.train_demo(2, spec=dp.TrainSpec(batchnorm=True))


def test_train_demo_refuses_more_ranks_than_examples_before_starting(no_processes):
    with pytest.raises(ValueError, match="world_size must be <= batch_size 16 .every rank needs an example., got 17"):
        versus_ddp.train_demo(17)
    with pytest.raises(ValueError, match="world_size"):
        versus_ddp.train_demo(0)


def test_uneven_split_is_weighted_by_examples():
    """N = 3 does not divide 16: our run weights by examples (the text's fix); the default spec's plain mean would be wrong."""
    assert versus_ddp.train_spec_for(4).weighting == "mean"
    assert versus_ddp.train_spec_for(3).weighting == "examples"
    assert versus_ddp.train_spec_for(3, spec=dp.TrainSpec(weighting="examples")).weighting == "examples"
    assert dp.TrainSpec().shard_sizes(3) == [6, 5, 5]


def test_shard_layouts():
    assert dp.descending_sizes(4) == (7, 5, 3, 1)
    assert all(sum(dp.descending_sizes(n)) == n * n for n in range(1, 9))
    assert dp.TrainSpec(batch_size=10).shard_sizes(4) == [3, 3, 2, 2]
    lengths = dp.valid_lengths(16, 6)
    assert lengths.tolist()[0] == 6 and lengths.min() >= 1 and (lengths.diff() <= 0).all()


def test_flat_grads_round_trip():
    model = make_model(seed=0)
    model.loss(make_batch(4)).backward()
    flat = flat_grads(model)
    assert flat.numel() == sum(p.numel() for p in model.parameters())
    set_flat_grads(model, flat * 2)
    assert torch.equal(flat_grads(model), flat * 2)


def _sum_of_shard_grads(spec: dp.TrainSpec, world_size: int) -> torch.Tensor:
    """What the all-reduce computes, in one process: the sum (or mean) of each shard's gradient."""
    batch, sizes = dp.step_batch(spec, 0), spec.shard_sizes(world_size)
    n_total = float(batch["lengths"].sum()) if spec.weighting == "tokens" else float(spec.batch_size)
    total = 0
    for r in range(world_size):
        model = make_model(seed=spec.seed)
        dp.shard_loss(model, shard_batch(batch, sizes, r), spec, n_total).backward()
        total = total + flat_grads(model).double()
    return total / world_size if spec.weighting in ("mean", "tokens-local") else total


@pytest.mark.parametrize("weighting,right", [("examples", True), ("mean", False), ("tokens", True),
                                             ("tokens-local", False)])
def test_loss_scaling_math_without_processes(weighting, right):
    """Unequal shards (7/5/3/1 examples, or unequal valid tokens): only the weighted sums are the full gradient."""
    if weighting.startswith("tokens"):
        spec = dp.TrainSpec(steps=1, batch_size=16, weighting=weighting)
    else:
        spec = dp.TrainSpec(steps=1, batch_size=16, sizes=(7, 5, 3, 1), weighting=weighting)
    ref = dp.single_process_train(spec)
    ratio = bound_ratio(_sum_of_shard_grads(spec, 4), ref.grad0, ref.grad_bounds[0])
    assert ratio <= 1.0 if right else ratio > dp_pitfalls.WRONG_BY


# --- tolerances, pinned from above: each derived independently or shown to catch a small error -----

def test_gradient_bound_is_the_reordering_bound_of_the_reward_heads_terms():
    """The reward head's weight gradient adds B*T terms h[b,t,i] * dy[b,t]; its bound, written out here
    without hooks, must be exactly what training.gradient_bound gives (a 10x looser one fails)."""
    spec = dp.TrainSpec()
    model, batch = make_model(seed=0), dp.step_batch(spec, 0)
    sums = linear_term_sums(model, lambda m: m.loss(batch))
    B, T = batch["reward"].shape
    with torch.no_grad():
        z = model.encoder(batch["obs"].reshape(B * T, -1)).reshape(B, T, -1)
        h, hs = torch.zeros(B, model.cfg.latent_dim), []
        for t in range(T):
            h = model.dynamics(h, z[:, t], batch["actions"][:, t])
            hs.append(h)
        hs = torch.stack(hs, 1).double()                                          # (B, T, Z)
        pred = model.reward(hs.float()).squeeze(-1).double()                      # (B, T)
        dy = 2 * (pred - batch["reward"].double()) / (B * T)                      # d loss / d pred
    expected = (dy.abs()[..., None] * hs.abs()).sum((0, 1))                      # (Z,)
    names = [n for n, _ in model.named_parameters()]
    sizes = [p.numel() for p in model.parameters()]
    start = sum(sizes[:names.index("reward.weight")])
    got = sums[start:start + model.cfg.latent_dim]
    assert torch.allclose(got, expected, rtol=1e-5, atol=0)
    bound = dp.gradient_bound(spec, sums)
    assert torch.equal(bound, (2 * (B * T - 1) + 3) * 2.0 ** -24 * sums)


def test_ring_bound_is_the_reordering_bound_of_the_ranks_vectors():
    for n in (1, 2, 5):
        total = sum(ring.rank_vector(r, 101).double().abs() for r in range(n))
        expected = 0 * total if n == 1 else (2 * (n - 1) + 1) * 2.0 ** -24 * total
        assert torch.equal(ring.sum_bound(n, 101), expected)


@pytest.mark.parametrize("optimizer,lr,eps", [("sgd", 0.05, 1e-4), ("adam", 0.01, 1e-3)])
def test_parameter_tolerance_catches_a_slightly_wrong_learning_rate(optimizer, lr, eps):
    """A run whose learning rate is off by eps (relative) misses the reference by more than the tolerance,
    and by less than ten tolerances: the tolerance is small enough to matter, and a 10x looser one would not be."""
    spec = dp.TrainSpec(optimizer=optimizer, lr=lr)
    ref = dp.single_process_train(spec)
    tol = dp.param_tolerance(spec, ref)
    moved = float((dp.single_process_train(replace(spec, lr=lr * (1 + eps))).params - ref.params).abs().max())
    assert tol < moved < 10 * tol


def test_ring_allreduce_inplace_writes_into_the_given_tensor():
    def rank_fn(ctx):
        x = torch.full((10,), float(ctx.rank + 1))
        out = ring_all_reduce(ctx, x, phase="sum", inplace=True)
        return out.data_ptr() == x.data_ptr(), x.clone()
    for same, x in run(rank_fn, 3):
        assert same and torch.equal(x, torch.full((10,), 6.0))


def test_registry_has_the_chapter_demos():
    names = set(registry())
    assert {"dp-train", "dp-unequal", "dp-pitfalls", "dp-buckets", "dp-drift", "dp-batch-lr"} <= names


# --- on real ranks -----------------------------------------------------------------

@pytest.fixture(scope="module")
def train4():
    return versus_ddp.train_demo(4)


def test_dp_matches_single_process_and_ddp(train4):
    assert train4.passed, train4.failures
    names = [c.name for c in train4.checks]
    assert any("DDP" in n for n in names) and any("single process" in n for n in names)
    for c in train4.checks:
        assert c.error <= c.tolerance
    assert train4.data.even and train4.data.weighting == "mean"


def test_three_ranks_weight_by_examples_and_show_ddps_plain_mean_wrong():
    report = versus_ddp.train_demo(3)
    assert report.passed, report.failures
    assert report.data.shard_sizes == (6, 5, 5) and report.data.weighting == "examples"
    wrong = [c for c in report.checks if c.must_differ]
    assert len(wrong) == 1 and "DDP" in wrong[0].name and wrong[0].error >= wrong[0].tolerance
    assert report.data.ddp_vs_single > 10 * report.check("final parameters == single process (rank 0)").tolerance


def test_dp_is_not_bitwise_equal_to_one_process(train4):
    # Four shards summed across ranks vs one pass over 16 examples: the float32 sums are
    # ordered differently, and for these seeds at least one of the 2,105 entries rounds differently.
    assert train4.data.ours_vs_single > 0
    assert not train4.data.bitwise_equal


def test_ring_bytes_per_step_exact(train4):
    numel = train4.params["numel"]
    assert numel == 2105
    rows = train4.counts(quantity="ring bytes sent")
    assert len(rows) == 3 * 4 and [len(train4.counts(quantity="ring bytes sent", step=s)) for s in range(3)] == [4] * 3
    for r in rows:
        assert r.measured == costs.ring_allreduce_bytes(numel, 4, r.rank)
    # The text's 2(N-1)G/N up to chunk rounding: 2 * 3 * 8420 / 4 = 12630.
    assert {r.measured for r in rows} == {12628, 12632}


def test_ddp_bucket_payload_counted(train4):
    assert train4.measured(quantity="DDP bucket payload bytes") == [3 * 2105 * 4] * 4


def test_adam_run_matches_too():
    report = versus_ddp.train_demo(4, spec=dp.TrainSpec(optimizer="adam", lr=0.01))
    assert report.passed, report.failures


def test_one_rank_is_bitwise_the_single_process():
    """With N = 1 the rank runs exactly the reference's operations: equality is bitwise here."""
    report = versus_ddp.train_demo(1, spec=dp.TrainSpec(steps=2))
    assert report.passed and report.data.bitwise_equal


def test_unequal_shards_naive_wrong_weighted_right():
    report = dp_pitfalls.unequal_demo(4)
    assert report.passed, report.failures
    assert report.data.shard_sizes == [7, 5, 3, 1]
    assert len(set(report.data.valid_tokens_per_rank)) == 4
    wrong = [c for c in report.checks if "WRONG" in c.name]
    assert len(wrong) == 2 and all(c.must_differ and c.error >= dp_pitfalls.WRONG_BY for c in wrong)


def test_pitfalls_fail_as_the_text_says():
    report = dp_pitfalls.pitfalls_demo(4)
    assert report.passed, report.failures
    by_name = {c.name.split(" (")[0]: c for c in report.checks}
    assert by_name["BatchNorm run: parameters still identical on every rank"].error == 0.0
    assert by_name["skewed momentum: step-0 gradients identical on every rank"].error == 0.0
    assert "local BatchNorm: DP gradient differs from the full-batch gradient" in by_name
    assert "BatchNorm running_mean differs between ranks after 3 steps" in by_name
    assert "skewed momentum: parameters differ between ranks after 3 steps" in by_name


def test_differ_check_fails_when_there_is_no_gap():
    same = differ_check("x", torch.ones(3), torch.ones(3), 1e-3, "r")
    small = differ_check("x", torch.ones(3), torch.ones(3) + 1e-6, 1e-3, "r")
    big = differ_check("x", torch.ones(3), torch.ones(3) + 1.0, 1e-3, "r")
    nan = differ_check("x", torch.ones(3), torch.full((3,), float("nan")), 1e-3, "r")
    assert not same.passed and not small.passed and big.passed and not nan.passed
    assert big.describe().startswith("ok   x: differs by 1 >= 0.001")
    assert small.describe().startswith("FAIL x: differs by 9.54e-07 < 0.001")   # float32 1 + 1e-6


def test_weighted_mean_exercise():
    assert check(dp_pitfalls.WEIGHTED_MEAN, dp_pitfalls.weighted_mean_solution).passed
    verdict = check(dp_pitfalls.WEIGHTED_MEAN, _plain_mean)
    assert not verdict.passed and "not yet" in verdict.message


def _plain_mean(ctx, grad, count):
    """The naive answer: ignores the counts."""
    from wmdist.comm import ring_all_reduce
    return ring_all_reduce(ctx, grad) / ctx.world_size
