"""Pipeline schedules as data: invariants, ideal-time measurements against the closed forms, torch's orders."""
from __future__ import annotations

import json
import re
from collections import Counter
from fractions import Fraction
from itertools import pairwise

import pytest

from wmdist import costs
from wmdist.costs import pipeline as pcosts
from wmdist.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    Action,
    Schedule,
    check_size,
    format_token,
    from_json,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    parse_token,
    schedule_to_json,
)
from wmdist.pipeline.simulate import ScheduleDeadlock, gantt_text, simulate, spans

PLAIN = [(name, p, m, 1) for name in ("gpipe", "1f1b") for p in (1, 2, 3, 4, 5) for m in (1, 2, 3, 4, 7, 8)]
INTERLEAVED = [("interleaved", p, k * p, v) for p in (1, 2, 3, 4) for v in (1, 2, 3) for k in (1, 2, 3)]
CASES = PLAIN + INTERLEAVED
DURATIONS = [(1, 1), (1, 2), (2, 3), (Fraction(1, 3), Fraction(1, 2))]   # (forward, backward) slot times


def _ids(case):
    return "{}-P{}-M{}-v{}".format(*case)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_stage_runs_every_microbatch_once_forward_before_backward(case):
    name, p, m, v = case
    schedule = make_schedule(name, p, m, chunks=v)
    assert len(schedule.ranks) == p
    for rank, actions in enumerate(schedule.ranks):
        assert len(actions) == 2 * m * v
        assert Counter(a.kind for a in actions) == {FORWARD: m * v, BACKWARD: m * v}
        assert {a.stage for a in actions} == set(range(rank, p * v, p))       # stage s lives on rank s % P
        where = {(a.kind, a.stage, a.microbatch): i for i, a in enumerate(actions)}
        assert len(where) == len(actions)                                       # no action twice
        for s in range(rank, p * v, p):
            for mb in range(m):
                assert where[(FORWARD, s, mb)] < where[(BACKWARD, s, mb)]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_simulation_finishes_and_peak_activations_match_the_formula(case):
    name, p, m, v = case
    result = simulate(make_schedule(name, p, m, chunks=v))
    assert result.peak_in_flight == tuple(pcosts.peak_activations_in_flight(name, p, m, chunks=v, rank=r)
                                          for r in range(p))
    if name == "gpipe":
        assert result.peak_in_flight[0] == m
    elif name == "1f1b":
        assert result.peak_in_flight[0] == min(p, m)
    for rank, steps in enumerate(result.in_flight):
        assert steps[-1] == (result.timings[rank][-1].end, 0)          # every backward released its forward
        assert all(t1 < t2 for (t1, _), (t2, _) in pairwise(steps))
        assert min(count for _, count in steps) == 0 and max(count for _, count in steps) == result.peak_in_flight[rank]


def test_activations_are_held_from_forward_start_to_backward_end():
    # gpipe(2, 2), forward 1, backward 2: rank 0 runs F0 [0,1), F1 [1,2), B0 [5,7), B1 [7,9).
    result = simulate(gpipe(2, 2))
    assert result.in_flight[0] == ((0, 1), (1, 2), (7, 1), (9, 0))
    # rank 1 runs F0 [1,2), F1 [2,3), B0 [3,5), B1 [5,7): nothing held before its first forward.
    assert result.in_flight[1] == ((0, 0), (1, 1), (2, 2), (5, 1), (7, 0))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("forward, backward", DURATIONS)
def test_balanced_idle_fraction_is_exactly_the_formula(name, forward, backward):
    for p in (1, 2, 3, 4, 6):
        for m in (1, 2, 3, 5, 8, 16):
            result = simulate(make_schedule(name, p, m), forward=forward, backward=backward)
            assert result.makespan == (m + p - 1) * (forward + backward)
            assert result.idle_fraction == Fraction(p - 1, m + p - 1)
            assert float(result.idle_fraction) == costs.bubble_fraction(p, m)   # both correctly rounded
            r = result.bubble_over_ideal
            assert r == Fraction(p - 1, m) and float(r) == pcosts.bubble_over_ideal(p, m)
            assert result.idle_fraction == r / (1 + r)                           # the conversion, exactly


def test_conversion_between_conventions_in_floats():
    # r = (P-1)/M, 1 + r and r/(1 + r) are three float64 roundings, each off by at most u = 2**-53
    # relative; r's error reaches r/(1+r) scaled by 1/(1+r) <= 1, so 4u bounds the whole.
    u = 2.0 ** -53
    for p in range(1, 9):
        for m in range(1, 33):
            f = pcosts.fraction_from_ratio(pcosts.bubble_over_ideal(p, m))
            assert f == pytest.approx(costs.bubble_fraction(p, m), rel=4 * u, abs=0)
            assert pcosts.ratio_from_fraction(costs.bubble_fraction(p, m)) == pytest.approx((p - 1) / m, rel=4 * u,
                                                                                                abs=0)


@pytest.mark.parametrize("forward, backward", DURATIONS)
def test_interleaving_divides_the_bubble_over_ideal_by_v(forward, backward):
    # Equal times per virtual stage: the simulator gives bubble/ideal = (P-1)/(v*M) exactly (Megatron's
    # figure), i.e. a whole-schedule idle fraction (P-1)/(v*M + P-1), and exactly 1/v of plain 1F1B's.
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 16, 2), (3, 9, 3), (4, 4, 2), (2, 2, 3), (1, 3, 2)]:
        inter = simulate(interleaved_one_f_one_b(p, m, v), forward=forward, backward=backward)
        plain = simulate(one_f_one_b(p, m), forward=forward, backward=backward)
        assert inter.bubble_over_ideal == Fraction(p - 1, v * m)
        assert float(inter.bubble_over_ideal) == pcosts.bubble_over_ideal(p, m, chunks=v)
        assert inter.idle_fraction == Fraction(p - 1, v * m + p - 1)
        assert inter.bubble_over_ideal * v == plain.bubble_over_ideal
        assert inter.peak_in_flight[0] == min((v + 1) * p - 1, m * v) >= plain.peak_in_flight[0]


def test_interleaved_with_one_chunk_is_1f1b_with_a_deeper_warmup():
    plain, deep = simulate(one_f_one_b(4, 8)), simulate(interleaved_one_f_one_b(4, 8, 1))
    assert deep.makespan == plain.makespan
    assert deep.peak_in_flight == (7, 5, 3, 1) and plain.peak_in_flight == (4, 3, 2, 1)


def test_imbalance_makes_the_slowest_stage_set_the_pace():
    forward, backward = [1, 3, 1, 2], [2, 5, 2, 3]                      # stage 1 is the slow one
    for m in (1, 4, 8):
        result = simulate(gpipe(4, m), forward=forward, backward=backward)
        expected = pcosts.fill_drain_time(forward, m) + pcosts.fill_drain_time(backward, m)
        assert result.makespan == expected                               # integers: the float sum is exact
        assert result.busy == tuple(m * (f + b) for f, b in zip(forward, backward))
        # one microbatch runs the stages one after another whatever their times: idle 3/4 either way
        plain = simulate(one_f_one_b(4, m), forward=forward, backward=backward)
        for idle in (result.idle_fraction, plain.idle_fraction):
            assert idle == Fraction(3, 4) if m == 1 else idle > Fraction(3, m + 3)
    assert pcosts.fill_drain_time([2, 2, 2], 5) == (5 + 3 - 1) * 2       # balanced: (M+P-1) t


def test_an_order_that_cannot_finish_is_named():
    good = one_f_one_b(2, 2)
    # rank 0 waits at its first backward for stage 1's backward of microbatch 0, while rank 1 wants
    # microbatch 1 first, whose input rank 0 only sends after that backward: a cycle across ranks.
    swapped = (good.ranks[0][:1] + (Action(BACKWARD, 0, 0), Action(FORWARD, 1, 0), Action(BACKWARD, 1, 0)),
               (Action(FORWARD, 1, 1), Action(BACKWARD, 1, 1), Action(FORWARD, 0, 1), Action(BACKWARD, 0, 1)))
    with pytest.raises(ScheduleDeadlock, match=r"rank 0 waits at s0B0 .* for s1B0.*rank 1 waits at s1F1 .* for s0F1"):
        simulate(Schedule(name="broken", stages=2, microbatches=2, chunks=1, ranks=swapped))
    backward_first = ((Action(BACKWARD, 0, 0), Action(FORWARD, 0, 0)),)
    with pytest.raises(ScheduleDeadlock, match=r"rank 0 waits at s0B0 \(action 0 .* for s0F0"):
        simulate(Schedule(name="self", stages=1, microbatches=1, chunks=1, ranks=backward_first))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_tokens_and_json_round_trip(case):
    schedule = make_schedule(*case[:3], chunks=case[3])
    for rank, actions in enumerate(schedule.ranks):
        for a in actions:
            assert parse_token(format_token(a, with_stage=True)) == a
            assert parse_token(format_token(a), stage=rank if case[3] == 1 else a.stage) == a
    data = json.loads(json.dumps(schedule_to_json(schedule)))
    assert data["schedule"] == case[0] and (data["stages"], data["microbatches"], data["chunks"]) == case[1:]
    assert from_json(data) == schedule
    assert all(t[0] == ("s" if case[3] > 1 else t[0]) for tokens in data["ranks"] for t in tokens)


def test_torch_orders_recorded_literally():
    # Derived by reading torch 2.13's ScheduleGPipe / Schedule1F1B._step_microbatches and
    # ScheduleInterleaved1F1B._calculate_single_rank_operations (compute actions only), and
    # confirmed by running those torch schedules on CPU gloo ranks and logging each forward and backward.
    assert make_schedule("1f1b", 4, 8).tokens() == tuple(tuple(line.split()) for line in (
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"))
    assert make_schedule("gpipe", 2, 4).tokens() == (("F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"),) * 2
    assert make_schedule("1f1b", 2, 4).tokens() == (("F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"),
                                                    ("F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"))
    assert make_schedule("interleaved", 2, 4, chunks=2).tokens() == tuple(tuple(line.split()) for line in (
        "s0F0 s0F1 s2F0 s2F1 s0F2 s2B0 s0F3 s2B1 s2F2 s0B0 s2F3 s0B1 s2B2 s2B3 s0B2 s0B3",
        "s1F0 s1F1 s3F0 s3B0 s3F1 s3B1 s1F2 s1B0 s1F3 s1B1 s3F2 s3B2 s3F3 s3B3 s1B2 s1B3"))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_boundary_transfers_counted_from_the_schedule(case):
    name, p, m, v = case
    schedule = make_schedule(name, p, m, chunks=v)
    crossing = Counter(a.kind for actions in schedule.ranks for a in actions
                       if (a.kind == FORWARD and a.stage > 0 and (a.stage - 1) % p != a.stage % p)
                       or (a.kind == BACKWARD and a.stage < p * v - 1 and (a.stage + 1) % p != a.stage % p))
    assert crossing[FORWARD] == crossing[BACKWARD] == pcosts.boundary_transfers(p, m, chunks=v)
    assert pcosts.boundary_bytes(p, m, 2048, chunks=v) == crossing[FORWARD] * 2048


def test_gantt_text_and_spans():
    schedule = gpipe(2, 2)
    result = simulate(schedule)
    # By hand: rank 1 receives F0 after one slot; the last stage's backwards take two slots each.
    assert gantt_text(schedule, result) == ("rank 0 | F0 F1 .. .. .. B0 -- B1 --\n"
                                            "rank 1 | .. F0 F1 B0 -- B1 -- .. ..")
    for case in CASES[::5]:
        schedule = make_schedule(*case[:3], chunks=case[3])
        result = simulate(schedule)
        lines = gantt_text(schedule, result).splitlines()
        assert len(lines) == case[1]
        for rank, line in enumerate(lines):
            cells = line.split(" | ")[1].split()                                 # cells never blank
            assert len(cells) == result.makespan                                  # slot = 1 with durations 1, 2
            assert sum(c.startswith(".") for c in cells) == result.makespan - result.busy[rank]
            assert [c for c in cells if c[0] not in ".-"] == list(schedule.tokens()[rank])
        rows = spans(schedule, result)
        assert len(rows) == 2 * case[1] * case[2] * case[3]
        assert sum(s.duration for s in rows if s.row == 0) == result.busy[0]
    with pytest.raises(ValueError, match="max_cells"):
        gantt_text(schedule, simulate(schedule, forward=Fraction(1, 1000)), max_cells=240)


@pytest.mark.parametrize("call, message", [
    (lambda: make_schedule("zigzag", 2, 4), "name must be one of"),
    (lambda: make_schedule("gpipe", 0, 4), "stages must be an integer >= 1"),
    (lambda: make_schedule("1f1b", 2, 0), "microbatches must be an integer >= 1"),
    (lambda: make_schedule("interleaved", 2, 4, chunks=0), "chunks must be an integer >= 1"),
    (lambda: make_schedule("1f1b", 2, True), "microbatches must be an integer"),
    (lambda: make_schedule("gpipe", 2, 4, chunks=2), "chunks must be 1 for the gpipe schedule"),
    (lambda: make_schedule("interleaved", 2, 3, chunks=2), "microbatches=3, stages=2"),
    (lambda: interleaved_one_f_one_b(4, 2, 2), "microbatches=2, stages=4"),
    (lambda: parse_token("X3"), "token must look like"),
    (lambda: parse_token("s1F"), "token must look like"),
    (lambda: parse_token("F-1", stage=0), "token must look like"),
    (lambda: parse_token("F3"), "names no stage"),
    (lambda: Action("W", 0, 0), "kind must be one of"),
    (lambda: Action("F", -1, 0), "microbatch must be an integer >= 0"),
    (lambda: Schedule(name="x", stages=1, microbatches=1, chunks=1, ranks=((Action("F", 0, 0),),)), r"lacks s0B0"),
    (lambda: Schedule(name="x", stages=1, microbatches=1, chunks=1, ranks=((Action("F", 0, 0), Action("B", 0, 0), Action("B", 0, 0)),)), "2 times"),
    (lambda: Schedule(name="x", stages=2, microbatches=1, chunks=1, ranks=((Action("F", 0, 1),), ())), r"ranks\[0\]\[0\] = s1F0"),
    (lambda: Schedule(name="x", stages=2, microbatches=1, chunks=1, ranks=((),)), "one action list per rank"),
    (lambda: Schedule(name="", stages=1, microbatches=1, chunks=1, ranks=((),)), "name must be a non-empty string"),
    (lambda: from_json({"schedule": "gpipe"}), "lacks"),
    (lambda: simulate(gpipe(2, 2), forward=0), r"forward\[0\] must be > 0"),
    (lambda: simulate(gpipe(2, 2), backward=[1, 2, 3]), "backward must be a number or one number per virtual"),
    (lambda: pcosts.peak_activations_in_flight("gpipe", 2, 4, rank=2), "rank must be an integer from 0 to 1"),
    (lambda: pcosts.peak_activations_in_flight("1f1b", 2, 4, chunks=2), "chunks must be 1"),
    (lambda: pcosts.peak_activations_in_flight("interleaved", 2, 3, chunks=2), "microbatches=3, stages=2"),
    (lambda: pcosts.bubble_over_ideal(2, 4, chunks=0), "chunks must be an integer >= 1"),
    (lambda: pcosts.ratio_from_fraction(1.0), "fraction must be below 1"),
    (lambda: pcosts.fraction_from_ratio(-0.5), "ratio must be a finite number >= 0"),
    (lambda: pcosts.boundary_bytes(2, 4, -1), "tensor_bytes must be an integer >= 0"),
    (lambda: pcosts.fill_drain_time([], 3), "stage_times must hold at least one"),
    (lambda: pcosts.fill_drain_time([1, 0], 3), r"stage_times\[1\] must be > 0"),
])
def test_bad_inputs_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: parse_token(3), "token must be a string"),
    (lambda: Schedule(name="x", stages=1, microbatches=1, chunks=1, ranks=(("F0", "B0"),)), r"ranks\[0\]\[0\] must be an Action"),
    (lambda: from_json([["F0", "B0"]]), "data must be a dict"),
    (lambda: from_json({"schedule": "x", "stages": 1, "microbatches": 1, "chunks": 1, "ranks": "F0 B0"}),
     "ranks must be a list of token lists"),
])
def test_wrong_types_are_type_errors(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def _wmdist(capsys, *argv):
    """`wmdist ...` in this process, through the console script's own main()."""
    from wmdist.app.cli import main
    try:
        code = main(list(argv))
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_the_bubble_in_both_conventions_without_gantt(capsys):
    code, out, _ = _wmdist(capsys, "schedule", "1f1b", "-P", "4", "-M", "8")
    lines = out.splitlines()
    assert code == 0 and lines[3].startswith("rank 3: F0 B0") and lines[4] == ""
    assert lines[5].startswith("idle fraction of the schedule: 3/11 = 0.273   f = (P-1)/(M+P-1)")
    assert lines[6].startswith("bubble over ideal time:        3/8 = 0.375   r = (P-1)/M,")
    code, out, _ = _wmdist(capsys, "schedule", "interleaved", "-P", "4", "-M", "8", "-v", "2")
    assert "3/19 = 0.158   f = (P-1)/(vM+P-1)" in out and "3/16 = 0.188   r = (P-1)/vM" in out
    code, out, _ = _wmdist(capsys, "schedule", "interleaved", "-P", "4", "-M", "8", "-v", "2", "--json")
    data = json.loads(out)
    assert data["idle_fraction"] == 3 / 19 and data["bubble_over_ideal"] == 3 / 16 and "gantt" not in data


def test_the_measured_bubble_is_the_closed_form_the_cli_prints_beside_it():
    for name, p, m, v in [(n, p, m, 1) for n in ("gpipe", "1f1b") for p in range(1, 7) for m in range(1, 11)] + \
                         [("interleaved", p, k * p, v) for p in range(1, 5) for k in (1, 2, 3) for v in (2, 3, 4)]:
        result = simulate(make_schedule(name, p, m, chunks=v))
        assert (result.idle_fraction, result.bubble_over_ideal) == (Fraction(p - 1, v * m + p - 1),
                                                                    Fraction(p - 1, v * m)), (name, p, m, v)


def test_cli_help_states_the_limits_and_shows_a_single_percent(capsys):
    code, out, _ = _wmdist(capsys, "schedule", "--help")
    text = " ".join(out.split())
    assert code == 0 and "%%" not in out and "lives on rank 2 % P" in text
    assert all(f"1 to {n}" in text for n in (256, 1024, 16)) and "P*M*v at most 16384" in text
    assert "(P-1)/(M+P-1)" in text and "(P-1)/M" in text


@pytest.mark.parametrize("argv, message", [
    (["gpipe", "-P", "1000000", "-M", "8"], "-P: stages must be an integer from 1 to 256, got 1000000"),
    (["gpipe", "-P", "4", "-M", "1000000"], "-M: microbatches must be an integer from 1 to 1024, got 1000000"),
    (["interleaved", "-v", "1000000"], "-v: chunks must be an integer from 1 to 16, got 1000000"),
    (["1f1b", "-P", "1000000", "-M", "1000000"], "-P: stages must be an integer from 1 to 256, got 1000000"),
    (["1f1b", "-P", "1e6", "-M", "1e6"], "argument -P/--stages: expected an integer, got '1e6'"),
    (["1f1b", "-P", "256", "-M", "128"], "-P*-M*-v: stages*microbatches*chunks must be at most 16384 (the schedule "
                                         "lists 2*P*M*v actions), got 256*128*1 = 32768"),
    (["gpipe", "-P", "64", "-M", "64", "--gantt"], "--gantt: the diagram would be 381 slots wide, more than the 240 "
                                                   "it draws; drop --gantt or use fewer stages or microbatches"),
])
def test_cli_refuses_sizes_beyond_its_stated_limits_in_one_line(capsys, argv, message):
    code, out, err = _wmdist(capsys, "schedule", *argv)
    assert code == 2 and out == "" and err == f"wmdist schedule: error: {message}\n"


def test_make_schedule_accepts_its_limits_and_refuses_one_past_them():
    assert check_size(256, 64, chunks=1) == (256, 64, 1) and check_size(1, 1024, chunks=16) == (1, 1024, 16)
    for args, message in [((257, 1, 1), "stages must be an integer from 1 to 256, got 257"),
                          ((1, 1025, 1), "microbatches must be an integer from 1 to 1024, got 1025"),
                          ((1, 1, 17), "chunks must be an integer from 1 to 16, got 17"),
                          ((256, 65, 1), "at most 16384"), ((0, 1, 1), "stages must be an integer >= 1, got 0"),
                          ((True, 1, 1), "stages must be an integer >= 1, got True")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            make_schedule("gpipe", *args[:2], chunks=args[2])
