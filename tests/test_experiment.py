"""The typed demo shape: the spec is the one place a size or input is refused, the runner names and times the
Report, and a failure after the spec accepted is a FAIL row, never a usage error."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

import wmdist.registry.demos as registry_module
from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report


@dataclass(frozen=True)
class Pairs:
    """A toy spec: `world_size` ranks, each returns rank * scale; only even sizes from 2 are accepted."""
    world_size: int
    scale: float = 1.0


def pairs_spec(world_size: int) -> Pairs:
    if world_size < 2 or world_size % 2:
        raise ValueError(f"world_size must be an even number >= 2, got {world_size}")
    return Pairs(world_size)


@dataclass(frozen=True)
class Got:
    rank: int
    world_size: int
    value: float


def pairs_rank(ctx: Context, spec: Pairs) -> Got:
    return Got(ctx.rank, ctx.world_size, ctx.rank * spec.scale)


def pairs_compare(spec: Pairs, results: list[Got]) -> Verdict:
    want = [r * spec.scale for r in range(spec.world_size)]
    return Verdict(checks=[Check(name="value == rank * scale", error=max(abs(g.value - w) for g, w in zip(results, want)), tolerance=0.0,
                                 reason="one multiplication, exact")],
                   exact=[Count(quantity="world size seen", rank=g.rank, measured=g.world_size, predicted=spec.world_size) for g in results],
                   params={"scale": spec.scale}, data=tuple(g.value for g in results))


def pairs(**changes) -> Experiment[Pairs, Got]:
    fields = dict(name="toy-pairs", title="toy: rank * scale", chapter="99", world_sizes=(2,), spec=pairs_spec,
                  ranks=pairs_rank, compare=pairs_compare)
    return Experiment(**{**fields, **changes})


def test_a_size_is_refused_by_the_spec_alone_and_named(no_processes):
    toy = pairs()
    assert [n for n in range(1, 9) if toy.refuses(n)] == [1, 3, 5, 7]
    assert toy.refuses(3) == "toy-pairs: world_size must be an even number >= 2, got 3"
    with pytest.raises(ValueError, match="even number"):
        toy.run(3)


def test_world_sizes_the_spec_refuses_cannot_be_registered(no_processes):
    with pytest.raises(ValueError, match="toy-pairs.*lists world sizes its spec refuses.*got 3"):
        pairs(world_sizes=(2, 3))
    with pytest.raises(ValueError, match="a name and at least one world size"):
        pairs(world_sizes=())
    with pytest.raises(ValueError, match="toy-pairs.*its spec for 2 rank.*runs on 4"):
        pairs(spec=lambda n: Pairs(2 * n))                            # the runner would start the wrong number


def test_the_runner_runs_the_specs_size_and_names_the_report_once(one_thread):
    seen = []
    report = pairs().run(4, progress=lambda done, total, text: seen.append((done, total, text)))
    assert isinstance(report, Report) and report.passed, report.failures
    assert (report.name, report.world_size, report.params, report.data) == ("toy-pairs", 4, {"scale": 1.0},
                                                                             (0.0, 1.0, 2.0, 3.0))
    assert report.measured(quantity="world size seen") == [4, 4, 4, 4] and report.seconds > 0
    assert [(d, t) for d, t, _ in seen] == [(0, 2), (1, 2), (2, 2)] and "PASS" in seen[-1][2]
    wrong = pairs().run_spec(Pairs(2, scale=math.nan))               # a NaN result never passes
    assert not wrong.passed and not wrong.checks[0].finite
    assert pairs().renamed("toy (variant)").run(2).name == "toy (variant)"


def _broken_rank(ctx: Context, spec: Pairs) -> Got:
    raise ValueError("a bug after the spec accepted the size")


def test_verify_tells_a_refused_size_from_a_demo_that_breaks(monkeypatch, one_thread):
    broken = pairs(name="toy-broken", ranks=_broken_rank)
    nan = pairs(name="toy-nan", compare=lambda spec, results: Verdict(checks=[Check(name="x", error=math.nan, tolerance=1.0, reason="why")]))
    odd = pairs(name="toy-odd", spec=lambda n: Pairs(n), world_sizes=(3,))
    demos = {d.name: d for d in (pairs(), broken, nan, odd)}
    monkeypatch.setattr(registry_module, "registry", lambda: demos)
    with pytest.raises(ValueError, match="toy-pairs: world_size must be an even number"):
        registry_module.verify(["toy-pairs"], world_size=3)            # a usage error, before any process
    runs, left_out = registry_module.plan(None, world_size=3)
    assert runs == [("toy-odd", 3)] and set(left_out) == {"toy-pairs", "toy-broken", "toy-nan"}
    # each breaks in its own row; verify goes on
    reports = registry_module.verify(None, world_size=2)
    by_name = {r.name: r for r in reports}
    assert [r.name for r in reports] == list(demos) and by_name["toy-pairs"].passed and by_name["toy-odd"].passed
    assert not by_name["toy-broken"].passed and "a bug after the spec accepted" in by_name["toy-broken"].error
    assert not by_name["toy-nan"].passed and by_name["toy-nan"].error is None


def test_every_chapter_registers_only_experiments(no_processes):
    """The ten chapters' demos are all the one typed shape (docs/architecture.md); Experiment itself refuses a
    demo without exactly one way to run, or a size its spec refuses (the tests above)."""
    demos = registry_module.registry().values()
    assert all(isinstance(d, Experiment) for d in demos)
    assert {d.chapter for d in demos} == {"01", "02", "03", "04", "05", "06", "07", "08", "09", "10"}


def test_an_experiment_runs_one_way_only(no_processes):
    with pytest.raises(ValueError, match="exactly one of ranks, local, jobs; got none"):
        pairs(ranks=None)
    with pytest.raises(ValueError, match=r"exactly one of ranks, local, jobs; got \['ranks', 'local'\]"):
        pairs(local=lambda spec: 0)


def test_verify_from_the_command_line_builds_the_registry_and_each_spec_once(monkeypatch, one_thread, capsys):
    from types import SimpleNamespace

    from wmdist.registry import catalog
    from wmdist.app.cli import main
    calls, built = [], []

    def counted(n: int) -> Pairs:
        calls.append(n)
        return pairs_spec(n)

    toy = pairs(spec=counted)
    calls.clear()                                        # Experiment checked its declared size once, at definition
    monkeypatch.setattr(registry_module, "registry", lambda: built.append(1) or {toy.name: toy})
    monkeypatch.setattr(catalog, "DEMOS", [SimpleNamespace(name=toy.name)])
    assert main(["verify", toy.name, "-n", "2"]) == 0
    assert calls == [2] and built == [1]
    assert "toy-pairs" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not both"):
        registry_module.verify([toy.name], prepared=registry_module.prepare([toy.name]))
