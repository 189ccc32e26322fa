"""A demo as one typed object: what it needs decided, what each rank does, how the results are judged.

An `Experiment[S, R]` is its name (written once) and three functions:

  spec(world_size) -> S           everything decided before any process starts (sizes, inputs,
                                  schedules), validated. It is the one place a world size or an
                                  input is refused (ValueError), so `refuses(n)` is "spec(n)
                                  raises", and anything that goes wrong after it is a demo bug;
  ranks(ctx, spec) -> R           what every rank does; R is a frozen dataclass of what the rank
                                  computed and measured;
  compare(spec, results) -> Verdict   the single-device reference, the tolerances with their
                                  reasons, the exact counts against their formulas, and the typed
                                  data that figures and text read.

`ranks` is the usual middle part. Two kinds of demo do not fit "one job of `world_size` ranks",
and say so with another field in its place (exactly one of the three is given):

  local(spec) -> R                the demo runs in this process and starts none (one-process
                                  baselines: a checkpointed unroll, scans on one core); results
                                  is [R];
  jobs(spec, launch) -> R         the demo is several jobs in a row, perhaps on different world
                                  sizes, one of them meant to fail (a checkpoint saved on 3 ranks
                                  and resumed on 2, a rank killed mid-save).
                                  `launch(rank_fn, world_size, *args, **kwargs)` is `runtime.run`
                                  under the experiment's timeout; results is [R].

One runner (`Experiment.run`, `Experiment.run_spec`) does what every demo used to write out by
hand: build the spec, time `runtime.run(ranks, spec.world_size, spec)`, compare, and make the
Report under the experiment's name. A chapter keeps its public demo functions
(`bubble_demo(world_size, microbatches=...)`) as small wrappers that build a spec with their options
and call `run_spec`.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from wmdist.comm import Context
from wmdist.costs.validate import require_int
from wmdist.course.report import Check, Count, Report
from wmdist.runtime import run
from wmdist.base.on_progress import OnProgress



class Spec(Protocol):
    """What a spec must say: how many ranks it runs on (the runner starts exactly that many)."""

    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class RankSpec:
    """The field a demo's spec dataclass starts from: the ranks it runs on, an integer >= 1, refused here once.

    A subclass adds its own fields (keyword-only, so their order is free) and, in its `__post_init__`,
    calls this one first.
    """
    world_size: int

    def __post_init__(self) -> None:
        require_int("world_size", self.world_size, 1)


S = TypeVar("S", bound=Spec)
R = TypeVar("R")
Launch = Callable[..., list[Any]]       # launch(rank_fn, world_size, *args, **kwargs) -> one result per rank


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What `compare` concludes: float checks (with tolerances and reasons), exact counts, inputs, typed data.

    `params` names the inputs the Report shows; `data` is the experiment's own frozen dataclass of
    results (timelines, per-axis traffic) that figures read instead of calling a runner.
    """
    checks: Sequence[Check]
    exact: Sequence[Count] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    data: Any = None


@dataclass(frozen=True, kw_only=True)
class Experiment(Generic[S, R]):
    """A registered demo: `spec` refuses or builds, `ranks` runs on every rank, `compare` judges.

    `world_sizes` are the sizes `wmdist verify` runs by default; each must be one `spec` accepts
    (checked here, so a registry cannot list a size its own demo refuses). `timeout` bounds the
    ranks' call, in seconds.
    """
    name: str
    title: str
    chapter: str
    world_sizes: tuple[int, ...]
    spec: Callable[[int], S]
    compare: Callable[[S, list[R]], Verdict]
    ranks: Callable[[Context, S], R] | None = None
    local: Callable[[S], R] | None = None
    jobs: Callable[[S, Launch], R] | None = None
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if not self.name or not self.world_sizes:
            raise ValueError(f"experiment {self.name!r}: a name and at least one world size are required")
        given = [k for k in ("ranks", "local", "jobs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"experiment {self.name!r}: give exactly one of ranks, local, jobs; got {given or 'none'}")
        refused = []
        for n in self.world_sizes:          # each spec built once: refused, or checked for its size
            try:
                spec = self.spec(n)
            except ValueError as err:
                refused.append(f"{self.name}: {err}")
                continue
            self._sized(spec, n)
        if refused:
            raise ValueError(f"experiment {self.name!r} lists world sizes its spec refuses: {'; '.join(refused)}")

    def _sized(self, spec: S, world_size: int) -> S:
        """`spec`, once it is seen to run on the `world_size` ranks it was built for (a demo bug otherwise)."""
        if spec.world_size != world_size:
            raise ValueError(f"experiment {self.name!r}: its spec for {world_size} rank(s) runs on {spec.world_size}")
        return spec

    def refuses(self, world_size: int) -> str | None:
        """Why this experiment cannot run on `world_size` ranks (its spec's ValueError, named), or None.

        Pure: building a spec starts no process, so `wmdist verify` asks this of every demo first.
        """
        try:
            self.spec(world_size)
        except ValueError as err:
            return f"{self.name}: {err}"
        return None

    def run(self, world_size: int, *, progress: OnProgress | None = None) -> Report:
        """The registered run on `world_size` ranks: `spec(world_size)` (refused here, before any process), then
        `run_spec`."""
        return self.run_spec(self._sized(self.spec(world_size), world_size), progress=progress)

    def run_spec(self, spec: S, *, progress: OnProgress | None = None) -> Report:
        """Run `ranks` on `spec.world_size` ranks (or `local`, or `jobs`), compare, and return the Report.

        `seconds` is the wall time of the runs (starting or reusing the pool included), not of the
        comparison. `progress(done, total, text)` hears about the two parts and the verdict.
        """
        say = progress or (lambda done, total, text: None)
        n = spec.world_size
        say(0, 2, f"{self.name} on {n} rank(s): {self.title}")
        start = time.perf_counter()
        results = self._results(spec)
        seconds = time.perf_counter() - start
        say(1, 2, f"{self.name}: against the reference and the formulas")
        verdict = self.compare(spec, results)
        report = Report(name=self.name, world_size=n, checks=list(verdict.checks), exact=list(verdict.exact), seconds=seconds, params=dict(verdict.params),
                        data=verdict.data)
        say(2, 2, f"{self.name}: {'PASS' if report.passed else 'FAIL'}, ranks {seconds:.2f} s")
        return report

    def _results(self, spec: S) -> list[R]:
        """What `compare` judges: one result per rank of one job, or the one result of `local` or `jobs`."""
        if self.local is not None:
            return [self.local(spec)]
        if self.jobs is not None:
            def launch(fn: Callable[..., Any], world_size: int, *args: Any, **kwargs: Any) -> list[Any]:
                kwargs.setdefault("timeout", self.timeout)      # a job may give its own (a run meant to die)
                return run(fn, world_size, *args, **kwargs)
            return [self.jobs(spec, launch)]
        assert self.ranks is not None
        return run(self.ranks, spec.world_size, spec, timeout=self.timeout)

    def renamed(self, name: str) -> Experiment[S, R]:
        """The same experiment under another name (a variant a notebook or panel runs, e.g. "mesh (widget)")."""
        return dataclasses.replace(self, name=name)
