"""Chapter 05 without timing: the split, the message plan, the executor on real ranks, the panel and the CLI."""
from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction

import pytest
import torch

from wmdist.costs import pipeline as pcosts
from wmdist.pipeline import bubble, demos, plan, stages
from wmdist.pipeline.cli import add_parser, main
from wmdist.pipeline.executor import StageRun, run_pipeline
from wmdist.pipeline.exercises import one_f_one_b_solution
from wmdist.pipeline.schedules import BACKWARD, FORWARD, Action, Schedule, make_schedule
from wmdist.pipeline.simulate import simulate

CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 2, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3),
         ("interleaved", 3, 3, 1), ("gpipe", 1, 3, 1)]


# --- pure: the split and the message plan -------------------------------------------------------

@pytest.mark.parametrize("layers, n", [(8, 1), (8, 3), (8, 8), (5, 2), (7, 4)])
def test_blocks_are_consecutive_cover_the_model_and_differ_by_at_most_one(layers, n):
    parts = plan.stage_blocks(layers, n)
    assert [i for r in parts for i in r] == list(range(layers))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1 and all(len(r) >= 1 for r in parts)


def test_parameters_split_exactly_embedding_first_head_last():
    model = stages.model_for(plan.PipeWork())
    names = stages.stage_parameter_names(model, 3)
    assert Counter(n for part in names for n in part) == Counter(n for n, _ in model.named_parameters())
    assert {"pos", "embed.weight"} <= set(names[0]) and {"head.weight", "ln_f.bias"} <= set(names[-1])
    assert "blocks.3.mlp.fc1.weight" in names[1]                 # 8 blocks over 3 stages: 0-2, 3-5, 6-7


def test_stage_chain_is_the_model_bitwise():
    work = plan.PipeWork()
    model, batch = stages.model_for(work), stages.batch_for(work)
    x = (batch["obs"], batch["actions"])
    for module in stages.stage_modules(model, 4):
        x = (module(*x),)
    assert torch.equal(x[0], model(batch["obs"], batch["actions"]))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}-P{}-M{}-v{}".format(*c))
def test_message_plan_matches_the_formulas(case):
    name, p, m, v = case
    schedule = make_schedule(name, p, m, chunks=v)
    counts = [plan.transfer_counts(schedule, r) for r in range(p)]
    for kind in ("activation", "gradient"):
        sends = sum(c[f"{kind} sends"] for c in counts)
        assert sends == sum(c[f"{kind} receives"] for c in counts) == pcosts.boundary_transfers(p, m, chunks=v)
    for r in range(p):                      # each receiver's posting order is its sender's sending order
        for src, expected in plan.incoming(schedule, r).items():
            assert expected == [msg for dst, msg in plan.outgoing(schedule, src) if dst == r]
        assert plan.peak_held(schedule, r) == pcosts.peak_activations_in_flight(name, p, m, chunks=v, rank=r)
    assert sum(plan.transfer_counts(schedule, r, forward_only=True)["gradient sends"] for r in range(p)) == 0


def test_microbatches_are_whole_trajectories_in_order():
    batch = stages.batch_for(plan.PipeWork(batch_size=7))
    parts = stages.split_microbatches(batch, 3)
    assert [mb["obs"].shape[0] for mb in parts] == plan.microbatch_sizes(7, 3) == [3, 2, 2]
    assert all(mb["obs"].shape[1] == batch["obs"].shape[1] for mb in parts)      # every time step kept
    assert torch.equal(torch.cat([mb["obs"] for mb in parts]), batch["obs"])


@pytest.mark.parametrize("call, message", [
    (lambda: demos.forward_demo(9), "8 blocks"),                                       # P larger than the blocks
    (lambda: demos.schedules_train_demo(4, plans=[("1f1b", 0, 1)]), "microbatches must be an integer >= 1"),
    (lambda: demos.schedules_train_demo(2, plans=[("interleaved", 3, 2)]), "microbatches=3, stages=2"),
    (lambda: demos.schedules_train_demo(4, plans=[("interleaved", 8, 3)]),
     "12 .*stages but the model has only 8 blocks"),
    (lambda: run_pipeline(3, make_schedule("gpipe", 4, 8), plan.PipeWork()), r"world_size \(3\) must equal .* P \(4\)"),
    (lambda: run_pipeline(2, make_schedule("gpipe", 2, 9), plan.PipeWork()), r"microbatches \(9\) must not exceed"),
    (lambda: demos.forward_demo(2, work=plan.PipeWork()), "forward_only=True"),
    (lambda: plan.PipeWork(slot_seconds=-1), "slot_seconds must be a finite number"),
    (lambda: plan.PipeWork(stage_work=(1.0, 0.0)), r"stage_work\[1\] must be > 0"),
    (lambda: plan.PipeWork(stage_work=(1.0,)).check(make_schedule("gpipe", 2, 2)), "stage_work has 1 entries"),
    (lambda: bubble.BubbleConfig(schedule="interleaved", microbatches=6), "microbatches=6, stages=4"),
    (lambda: bubble.BubbleConfig(chunks=2), "chunks must be 1 for the gpipe schedule"),
])
def test_bad_inputs_are_one_clear_line_before_any_process(no_processes, call, message):
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


# --- the executor on real ranks -----------------------------------------------------------------

def test_forward_pipeline_equals_one_process_and_counts_m_p_minus_1_transfers():
    report = demos.forward_demo(4)
    assert report.passed, report.failures
    assert report.data.transfers == pcosts.boundary_transfers(4, 8) == 24
    assert report.data.bytes == pcosts.boundary_bytes(4, 8, 2 * 6 * 32 * 4) == 24 * 1536   # b=2, T=6, H=32 fp32
    assert report.measured(quantity="activation sends") == [8, 8, 8, 0]
    assert report.measured(quantity="activation receives") == [0, 8, 8, 8]


def test_training_under_three_schedules_equals_one_process():
    report = demos.schedules_train_demo(2)
    assert report.passed, report.failures
    assert [d.schedule for d in report.data] == ["gpipe", "1f1b", "interleaved"]
    for d in report.data:
        assert 0 < d.grad_error <= d.grad_tolerance            # not bitwise: M groups of rows, not one sum
    assert report.measured(quantity="activation sets held (peak)", case="gpipe") == [4, 4]
    assert report.measured(quantity="activation sets held (peak)", case="1f1b") == [2, 1]
    assert report.measured(quantity="gradient sends", case="interleaved") == [4, 8]   # stage 2 -> 1 crosses too


def test_any_schedule_runs_even_when_ranks_disagree_on_backward_order():
    # Rank 0 runs its backwards newest first, rank 1 oldest first: rank 1 sends gradients 0, 1, 2 while rank 0
    # needs 2 first. Receives are posted in the sender's order, so each gradient still lands in its own buffer.
    order0 = [Action(FORWARD, m, 0) for m in range(3)] + [Action(BACKWARD, m, 0) for m in (2, 1, 0)]
    order1 = [Action(k, m, 1) for m in range(3) for k in (FORWARD, BACKWARD)]
    schedule = Schedule(name="custom", stages=2, microbatches=3, chunks=1, ranks=(tuple(order0), tuple(order1)))
    simulate(schedule)                                               # it can finish
    work = plan.PipeWork(batch_size=6)
    runs = run_pipeline(2, schedule, work)
    ref = stages.reference(work, 3)
    want = ref.accumulated(demos.backward_orders(schedule), stages.model_for(work))
    grads = {k: v for r in runs for k, v in r.grads.items()}
    assert all(torch.equal(grads[k], want[k]) for k in want)        # bitwise: same operations, same order
    assert [r.order for r in runs] == [tuple(schedule.token(a) for a in order0), tuple(schedule.token(a) for a in order1)]
    assert runs[0].order[:2] == ("F0", "F1")                      # v = 1: no stage prefix, as in the JSON



# --- the gradient tolerance: gradient_bound pinned by hand, and the check built on it tight --------

U32 = 2.0 ** -24


def test_gradient_bound_is_the_largest_sum_over_rows_of_one_rows_term():
    """The docstring's formula, computed another way: with T = 1 every row is its own trajectory (nothing
    crosses rows), so one row's term in any gradient is the gradient of that row's share of the loss alone,
    and the bound is the largest entry of sum_b |grad of share b| over every parameter."""
    work = plan.PipeWork(batch_size=4, seq_len=1, layers=2, seed=1)
    model, batch = stages.model_for(work), stages.batch_for(work)
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    full = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    for b in range(work.batch_size):
        model.zero_grad()
        rows = slice(b, b + 1)
        share = (model(batch["obs"][rows], batch["actions"][rows]) - batch["next_obs"][rows]).pow(2).mean() / 4
        share.backward()
        for n, p in model.named_parameters():
            sums[n] += p.grad.double().abs()
            full[n] += p.grad.double()
    by_hand = max(float(s.max()) for s in sums.values())
    assert stages.stage_gradient_bound(work) == pytest.approx(by_hand, rel=1e-5)     # float32 terms vs float64 sums
    # at this seed the rows' terms have mixed signs where the bound peaks: |terms| summed, not |their sum|
    assert by_hand > 1.1 * max(float(g.abs().max()) for g in full.values())


def _fabricated_train_results(plans: demos.Plans, grads: dict[str, torch.Tensor],
                              loss: torch.Tensor) -> list[demos.StageRuns]:
    """What the ranks of a one-case Plans would return if their gradients were `grads` (ledger counts zero)."""
    (schedule, work), = plans.cases
    names = stages.stage_parameter_names(stages.model_for(work), schedule.virtual_stages)
    transfers = {f"{k} {d}": 0 for k in ("activation", "gradient") for d in ("sends", "receives")}
    nbytes = {f"{k} bytes {d}": 0 for k in ("activation", "gradient") for d in ("sent", "received")}
    last = (schedule.virtual_stages - 1) % schedule.stages
    return [demos.StageRuns((StageRun(rank=r, order=(), spans=(), loss=loss if r == last else None, outputs=None,
                                      grads={n: grads[n] for s in range(r, schedule.virtual_stages, schedule.stages)
                                             for n in names[s]},
                                      peak_held=0, transfers=transfers, bytes=nbytes),))
            for r in range(schedule.stages)]


def test_the_gradient_check_compares_at_the_reordered_sum_bound():
    """compare_train's full-batch gradient check, fed the full-batch gradients with one entry on rank 0 moved
    by 0.4x and 3x the tolerance 2(BT-1) u gradient_bound: the first passes, the second fails."""
    plans = demos.train_spec(2, plans=[("gpipe", 2, 1)])
    (_, work), = plans.cases
    ref = stages.reference(work, 2)
    assert ref.bound == stages.stage_gradient_bound(work)
    tol = 2 * (work.batch_size * work.seq_len - 1) * U32 * ref.bound
    name, where = "blocks.0.mlp.fc1.weight", (3, 5)                 # block 0 lives on stage 0, rank 0
    for times, passes in ((0.4, True), (3.0, False)):
        grads = {n: g.clone() for n, g in ref.grads.items()}
        grads[name][where] += times * tol
        verdict = demos.compare_train(plans, _fabricated_train_results(plans, grads, ref.loss))
        check, = [c for c in verdict.checks if c.name == "gpipe: every gradient == single device, whole batch"]
        assert check.tolerance == tol and check.passed is passes
        loss_check, = [c for c in verdict.checks if c.name == "gpipe: loss == single device, whole batch"]
        assert loss_check.passed and loss_check.error == 0.0

# --- the panel's model, the panel, the CLI, the exercise ------------------------------------------

def test_both_conventions_and_the_conversion():
    view = bubble.bubble_view(bubble.BubbleConfig(stages=4, microbatches=8))
    assert view.formula_idle == pytest.approx(3 / 11) and view.formula_over_ideal == 3 / 8
    assert view.idle == pytest.approx(3 / 11) and view.over_ideal == pytest.approx(3 / 8)
    r = view.formula_over_ideal
    assert r / (1 + r) == pytest.approx(view.formula_idle)
    inter = bubble.bubble_view(bubble.BubbleConfig(schedule="interleaved", stages=4, microbatches=8, chunks=2))
    assert inter.over_ideal == pytest.approx(3 / 16) and inter.peak == (11, 9, 7, 5)
    assert view.transfers == 24 and inter.transfers == 56


def test_unequal_stages_level_off_above_zero():
    cfg = bubble.BubbleConfig(schedule="gpipe", stages=4, microbatches=8, unequal=True)
    view = bubble.bubble_view(cfg)
    assert view.curve.limit == pytest.approx(1 - 5 / 8)          # work (1, 2, 1, 1): 1 - mean/max
    assert all(f > view.curve.limit for f in view.curve.idle)     # approaches from above, never reaches 0
    forward = [Fraction(w) for w in cfg.stage_work]               # the closed form the curve uses is exact
    for m, f in zip(view.curve.microbatches, view.curve.idle):
        sim = simulate(make_schedule("gpipe", 4, m), forward=forward, backward=[2 * x for x in forward])
        assert f == pytest.approx(float(sim.idle_fraction), abs=1e-12)


def test_panel_slider_recomputes_and_a_bad_combination_clears_the_figure():
    from wmdist.pipeline.panel import BubblePanel
    panel = BubblePanel()
    panel.controls["microbatches"].value = 16                     # its speed: `wmdist bench panels`, not a test
    assert panel.result.config.microbatches == 16 and "3/(16+3)" in panel.summary.value
    panel.controls["schedule"].value = "interleaved"
    panel.controls["microbatches"].value = 6                      # not a multiple of P = 4
    assert panel.shown is None and "multiple of stages" in panel.error and "cannot compute" in panel.status.value
    panel.controls["microbatches"].value = 8
    assert panel.shown is not None and panel.result.schedule.name == "interleaved"


def test_panel_run_refuses_too_many_stages_without_starting_processes():
    from wmdist.pipeline.panel import BubblePanel
    panel = BubblePanel(bubble.BubbleConfig(schedule="interleaved", stages=4, microbatches=8, chunks=4))
    assert panel.run() is None and "16 (virtual) stages but the model has only 8 blocks" in panel.status.value


def _cli(capsys, *argv):
    import argparse
    parser = argparse.ArgumentParser(prog="wmdist")
    add_parser(parser.add_subparsers(dest="command"))
    code = main(parser.parse_args(["schedule", *argv]))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_each_rank_json_and_gantt(capsys):
    code, out, _ = _cli(capsys, "1f1b", "-P", "4", "-M", "8")
    assert code == 0 and out.splitlines()[3] == "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    code, out, _ = _cli(capsys, "interleaved", "-P", "2", "-M", "4", "-v", "2", "--json")
    data = json.loads(out)
    assert data["schedule"] == "interleaved" and data["ranks"][1][:3] == ["s1F0", "s1F1", "s3F0"]
    code, out, _ = _cli(capsys, "gpipe", "-P", "2", "-M", "2", "--gantt")
    assert "rank 0 | F0 F1 .. .. .. B0 -- B1 --" in out and "idle fraction of the schedule: 1/3" in out


@pytest.mark.parametrize("argv, message", [
    (["interleaved", "-P", "2", "-M", "3"], "-M: microbatches must be a multiple of stages"),
    (["gpipe", "-P", "0"], "-P: stages must be an integer >= 1"),
    (["gpipe", "-v", "2"], "-v: chunks must be 1 for the gpipe schedule"),
    (["zigzag"], "invalid choice: 'zigzag'"),
    (["gpipe", "-M", "x"], "expected an integer, got 'x'"),
])
def test_cli_usage_errors_are_one_line_and_exit_2(capsys, argv, message):
    try:
        code, _, err = _cli(capsys, *argv)
    except SystemExit as stop:
        code, err = stop.code, capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err and err.startswith("wmdist schedule: error: ")


def test_exercise_solution_is_the_schedule_functions_1f1b():
    for p in range(1, 6):
        for m in range(1, 9):
            assert [one_f_one_b_solution(p, m, r) for r in range(p)] == [list(t) for t in
                                                                         make_schedule("1f1b", p, m).tokens()]
