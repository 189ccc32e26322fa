"""Resumable sharded checkpoints, safe against a crash mid-save: training that saves and resumes, and its two demos.

The storage (wmdist.memory.dcp_store, re-exported here) saves each rank's
ZeRO chunks with torch.distributed.checkpoint under keys that carry their
global element range, commits a save by atomically replacing the pointer file
LATEST, and loads on any number of ranks by cutting the saved ranges to the
new ones. `train_resumable` is the rank function that resumes from LATEST (or
starts), trains and saves as it goes.

Two experiments, each several jobs in a row (`Experiment(jobs=...)`):
"checkpoint-resume" saves on N ranks and resumes on another number, and
"checkpoint-crash" kills a rank inside a save and resumes from the previous
checkpoint. The public wrappers are `resume_report` and `crash_report`.
"""
from __future__ import annotations

import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from wmdist.comm import Context
from wmdist.course.experiment import Experiment, Launch, Verdict
from wmdist.memory.dcp_store import (POINTER, SHARDED, Commit, DroppedSaveWarning, drop_uncommitted,
                                     latest_checkpoint, load_checkpoint, load_latest, overlaps, parse_key, range_key,
                                     save_checkpoint)
from wmdist.memory.zero import ZeroRankState, ZeroConfig, init_state, train_step, zero_rank
from wmdist.memory.zero_reference import adam_tolerance, reference_adam
from wmdist.costs.validate import require_int
from wmdist.course.report import Report, close_check, exact_check, fact_check
from wmdist.runtime import RankFailure

__all__ = ["POINTER", "SHARDED", "Commit", "DroppedSaveWarning", "drop_uncommitted", "latest_checkpoint",
           "load_checkpoint", "load_latest", "overlaps", "parse_key", "range_key", "save_checkpoint", "ResumableRun",
           "train_resumable", "assemble", "ResumeSpec", "resume_spec",
           "ResumeRuns", "resume_jobs", "compare_resume", "RESUME", "resume_report", "CrashSpec", "crash_spec",
           "CrashEvidence", "CrashRuns", "crash_jobs", "compare_crash", "CRASH", "crash_report", "DEMOS"]


@dataclass(kw_only=True, frozen=True)
class ResumableRun:
    """One rank's part of a resumable run: the step it resumed from, its chunks as loaded and at the end, and the
    uncommitted directories its saves removed (what killed saves left; only rank 0 removes, so only its is filled)."""
    resumed_from: int
    loaded: dict[str, torch.Tensor]         # by SHARDED name: this rank's chunk right after loading (or init)
    final: dict[str, torch.Tensor]          # the same chunks after training to `until`
    dropped: tuple[str, ...] = ()           # directories removed before a save, as paths
    warned: tuple[str, ...] = ()            # the DroppedSaveWarnings said, when recorded instead of shown


def train_resumable(ctx: Context, root: str, cfg: ZeroConfig, *, until: int, save_every: int,
                    die_at: int | None = None, die_on_rank: int = 0, record_warnings: bool = False) -> ResumableRun:
    """Rank function: resume from `root`'s latest checkpoint (or start), train to step `until`, saving as we go.

    With `die_at`, rank `die_on_rank` kills itself inside the save of that step. With `record_warnings`, a
    DroppedSaveWarning is kept in the result instead of shown (the crash demo, which causes one on purpose,
    checks it was said). Returns this rank's chunks and the step it resumed from.
    """
    state = load_latest(ctx, root, cfg) or init_state(ctx, cfg)
    resumed_from = state.step
    loaded = _own_chunks(state)
    dropped: list[str] = []
    warned: list[str] = []
    while state.step < until:
        train_step(ctx, state, cfg)
        if state.step % save_every == 0 or state.step == until:
            with warnings.catch_warnings(record=record_warnings) as caught:
                commit = save_checkpoint(ctx, root, state, die_on_rank=die_on_rank if state.step == die_at else None)
            warned += [str(w.message) for w in caught or [] if issubclass(w.category, DroppedSaveWarning)]
            dropped += [str(d) for d in commit.dropped]
    return ResumableRun(resumed_from=resumed_from, loaded=loaded, final=_own_chunks(state), dropped=tuple(dropped),
                        warned=tuple(warned))


def _own_chunks(state: ZeroRankState) -> dict[str, torch.Tensor]:
    own = slice(state.start, state.stop)
    return {"params": (state.params if state.stage == 3 else state.params[own]).clone(),
            "exp_avg": (state.exp_avg if state.stage > 0 else state.exp_avg[own]).clone(),
            "exp_avg_sq": (state.exp_avg_sq if state.stage > 0 else state.exp_avg_sq[own]).clone()}


def assemble(results: list[ResumableRun], which: Literal["loaded", "final"]) -> dict[str, torch.Tensor]:
    """Concatenate every rank's chunks ('loaded' or 'final') into full flat vectors, in rank order."""
    if which not in ("loaded", "final"):
        raise ValueError(f"which must be 'loaded' or 'final', got {which!r}")
    return {k: torch.cat([getattr(r, which)[k] for r in results]) for k in SHARDED}


def _other_size(world_size: int) -> int:
    return 2 if world_size != 2 else 3


# --- save on N ranks, resume on M ------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ResumeSpec:
    """Train to `save_at` on `world_size` ranks and save; resume on `resume_on` ranks and train to cfg.steps."""
    world_size: int
    resume_on: int
    save_at: int
    cfg: ZeroConfig              # its stage, and steps = the step the resumed run trains to


def resume_spec(world_size: int, *, resume_on: int | None = None, stage: int = 2, save_at: int = 2,
                until: int = 4) -> ResumeSpec:
    """The resume demo's spec; bad sizes, steps or stage are refused here (ValueError), before any process."""
    resume_on = _other_size(world_size) if resume_on is None else resume_on
    world_size, resume_on = require_int("world_size", world_size, 1), require_int("resume_on", resume_on, 1)
    until = require_int("until", until, 2)
    save_at = require_int("save_at", save_at, 1, high=until - 1)       # a step the first job reaches and saves
    return ResumeSpec(world_size=world_size, resume_on=resume_on, save_at=save_at,
                      cfg=ZeroConfig(stage=stage, steps=until))


@dataclass(frozen=True)
class ResumeRuns:
    """Each rank's part of the run that saved, and of the run that resumed; the uninterrupted run's weights (P,)."""
    saved: list[ResumableRun]
    resumed: list[ResumableRun]
    uninterrupted: torch.Tensor


def resume_jobs(spec: ResumeSpec, launch: Launch) -> ResumeRuns:
    """Three jobs: save on world_size ranks and resume on resume_on (in a temporary directory), then the same
    training uninterrupted on world_size ranks."""
    root, cfg, at = tempfile.mkdtemp(prefix="wmdist-ckpt-"), spec.cfg, spec.save_at
    try:
        saved = launch(train_resumable, spec.world_size, root, cfg, until=at, save_every=at)
        resumed = launch(train_resumable, spec.resume_on, root, cfg, until=cfg.steps, save_every=at)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    whole = torch.cat([o.chunk for o in launch(zero_rank, spec.world_size, cfg)])
    return ResumeRuns(saved, resumed, whole)


def compare_resume(spec: ResumeSpec, results: list[ResumeRuns]) -> Verdict:
    """The loaded state against the saved one (bitwise), the step resumed from, the final weights against the
    uninterrupted run and single-process Adam."""
    (runs,), cfg, n, m = results, spec.cfg, spec.world_size, spec.resume_on
    saved, loaded = assemble(runs.saved, "final"), assemble(runs.resumed, "loaded")
    final = assemble(runs.resumed, "final")["params"]
    tol, why = adam_tolerance(cfg, max(n, m))
    checks = [exact_check(f"{k} loaded on {m} ranks == saved on {n}", loaded[k], saved[k],
                          "a checkpoint stores bytes: bitwise equal") for k in SHARDED]
    checks += [fact_check("resumed from the saved step", holds=runs.resumed[0].resumed_from == spec.save_at,
                          reason="the step the checkpoint holds"),
               close_check("resumed run == uninterrupted run", final, runs.uninterrupted, 2 * tol,
                           "both within: " + why),
               close_check("resumed run == single-process Adam", final, reference_adam(cfg), tol, why)]
    return Verdict(checks=checks, params={"resume_on": m, "stage": cfg.stage, "save_at": spec.save_at,
                                          "until": cfg.steps})


RESUME = Experiment(name="checkpoint-resume", chapter="03", world_sizes=(3, 4),
                    title="Sharded DCP checkpoint saved on N ranks, resumed on another number",
                    spec=resume_spec, jobs=resume_jobs, compare=compare_resume)


def resume_report(world_size: int, *, resume_on: int | None = None, stage: int = 2, save_at: int = 2,
                  until: int = 4) -> Report:
    """Train to `save_at` on `world_size` ranks, save, resume on `resume_on` ranks and train to `until`.

    Checked: the state loaded on the new ranks is the saved state, bitwise;
    the final weights match an uninterrupted run and single-process Adam.
    """
    return RESUME.run_spec(resume_spec(world_size, resume_on=resume_on, stage=stage, save_at=save_at, until=until))


# --- a rank killed mid-save ------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CrashSpec:
    """Save step 2 on `world_size` ranks, kill the last rank inside the save of step 4, resume on `resume_on`."""
    world_size: int
    resume_on: int
    cfg: ZeroConfig              # its stage; steps = 4


def crash_spec(world_size: int, *, resume_on: int | None = None, stage: int = 2) -> CrashSpec:
    """The crash demo's spec; bad sizes or stage are refused here (ValueError), before any process."""
    resume_on = _other_size(world_size) if resume_on is None else resume_on
    world_size, resume_on = require_int("world_size", world_size, 1), require_int("resume_on", resume_on, 1)
    return CrashSpec(world_size=world_size, resume_on=resume_on, cfg=ZeroConfig(stage=stage, steps=4))


@dataclass(frozen=True)
class CrashEvidence:
    """What the crash left: the launcher's one-line failure, and every file in the uncommitted save's directory."""
    failure: str
    partial_files: list[str]


@dataclass(kw_only=True, frozen=True)
class CrashRuns:
    """What the crash jobs saw: the failure ('' if the save did not fail) and its leftovers, what LATEST named after
    the crash and after the resumed run (None: nothing), and each rank's part of the resumed run."""
    evidence: CrashEvidence
    failed: bool
    latest_after_crash: str | None
    resumed: list[ResumableRun]
    latest_after_resume: str | None


def crash_jobs(spec: CrashSpec, launch: Launch) -> CrashRuns:
    """Three jobs in one temporary directory: save step 2; die inside the save of step 4 (RankFailure, caught);
    read LATEST and the leftovers, then resume on resume_on ranks to step 4."""
    root, cfg, n = tempfile.mkdtemp(prefix="wmdist-ckpt-"), spec.cfg, spec.world_size
    failure: RankFailure | None = None
    try:
        launch(train_resumable, n, root, cfg, until=2, save_every=2)
        try:
            launch(train_resumable, n, root, cfg, until=4, save_every=2, die_at=4, die_on_rank=n - 1)
        except RankFailure as err:
            failure = err
        latest = latest_checkpoint(root)
        uncommitted = Path(root) / ".tmp-step000004"          # absent if the save never began
        partial = sorted(p.name for p in uncommitted.iterdir()) if uncommitted.is_dir() else []
        resumed = launch(train_resumable, spec.resume_on, root, cfg, until=4, save_every=2, record_warnings=True)
        committed = latest_checkpoint(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    name = lambda path: None if path is None else path.name   # noqa: E731 - what LATEST named, if anything
    return CrashRuns(evidence=CrashEvidence(str(failure).splitlines()[0] if failure else "", partial), failed=failure is not None,
                     latest_after_crash=name(latest), resumed=resumed, latest_after_resume=name(committed))


def compare_crash(spec: CrashSpec, results: list[CrashRuns]) -> Verdict:
    """The failure and its leftovers, LATEST before and after the resume, and the resumed weights against Adam."""
    (runs,), cfg = results, spec.cfg
    tol, why = adam_tolerance(cfg, max(spec.world_size, spec.resume_on))
    checks = [fact_check("the save of step 4 failed: the launcher raised RankFailure", holds=runs.failed,
                         reason="one rank kills itself inside dcp.save"),
              fact_check("the save was left uncommitted: the killed rank's data file there, no metadata",
                         holds=f"__{spec.world_size - 1}_0.distcp" in runs.evidence.partial_files
                         and ".metadata" not in runs.evidence.partial_files,
                         reason="the killed rank wrote its shard, then died before DCP's metadata was written"),
              fact_check("after the crash LATEST still names step000002", holds=runs.latest_after_crash == "step000002",
                         reason="the pointer moves only after every rank has written"),
              fact_check("resumed from step 2", holds=runs.resumed[0].resumed_from == 2,
                         reason="the step the checkpoint holds"),
              fact_check("the resumed run's save of step 4 dropped the uncommitted .tmp-step000004, and said so",
                         holds=[Path(d).name for d in runs.resumed[0].dropped] == [".tmp-step000004"]
                         and len(runs.resumed[0].warned) == 1 and ".tmp-step000004" in runs.resumed[0].warned[0],
                         reason="rank 0 removes what the killed save left before saving that step again, naming "
                                "it (a DroppedSaveWarning, and in its result)"),
              fact_check("the resumed run committed step000004", holds=runs.latest_after_resume == "step000004",
                         reason="the resumed job saved and moved the pointer"),
              close_check("resumed run == single-process Adam", assemble(runs.resumed, "final")["params"],
                          reference_adam(cfg), tol, why)]
    return Verdict(checks=checks, params={"resume_on": spec.resume_on, "stage": cfg.stage}, data=runs.evidence)


CRASH = Experiment(name="checkpoint-crash", chapter="03", world_sizes=(3,),
                   title="A rank killed mid-save leaves the last committed checkpoint intact",
                   spec=crash_spec, jobs=crash_jobs, compare=compare_crash)


def crash_report(world_size: int, *, resume_on: int | None = None, stage: int = 2) -> Report:
    """Kill one rank inside the save of step 4; the step-2 checkpoint must stay the latest and resume correctly."""
    return CRASH.run_spec(crash_spec(world_size, resume_on=resume_on, stage=stage))


DEMOS = [RESUME, CRASH]
