"""Resumable sharded checkpoints with torch.distributed.checkpoint (DCP), safe against a crash mid-save.

Each rank saves only what it owns: its element range of the flat parameters
and of both Adam moments (the ZeRO layout of wmdist.memory.zero), under keys that
carry the global range, e.g. "exp_avg/000000702-000001404". DCP writes one
file per rank plus a metadata file. A later job with a different number of
ranks reads the metadata, loads the saved ranges that overlap its new range
and cuts them to size: resharding is interval intersection (`overlaps`).
(DTensor would reshard for us, but it splits uneven lengths like
torch.chunk, not like the tensor_split layout the ZeRO chunks use.)

Committing: ranks save into a temporary directory; after everyone has
finished (a barrier), rank 0 renames it to its final name and then replaces
the pointer file LATEST atomically (write a temporary file, fsync,
os.replace). `latest_checkpoint` follows only LATEST, so a job killed at any
moment of a save leaves the previous checkpoint as the latest one.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from wmdist.comm import Context, barrier, counted
from wmdist.memory.zero import RankState, ZeroConfig, init_state, train_step, zero_rank
from wmdist.memory.zero_reference import adam_tolerance, reference_adam
from wmdist.report import Check, Demo, Report, close_check, exact_check
from wmdist.runtime import RankFailure, run

POINTER = "LATEST"
SHARDED = ("params", "exp_avg", "exp_avg_sq")


def range_key(name: str, start: int, stop: int) -> str:
    """The DCP key of elements [start, stop) of the flat tensor `name`."""
    return f"{name}/{start:09d}-{stop:09d}"


def parse_key(key: str) -> tuple[str, int, int]:
    """Inverse of range_key: 'exp_avg/000000000-000000702' -> ('exp_avg', 0, 702)."""
    name, _, span = key.rpartition("/")
    start, stop = span.split("-")
    return name, int(start), int(stop)


def overlaps(saved: list[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int, int, int]]:
    """Which saved ranges a new rank needs: (saved_start, saved_stop, from, to) for [from, to) of [start, stop).

    Pure interval arithmetic; the pieces cover [start, stop) exactly when the
    saved ranges cover it.
    """
    out = []
    for a, b in sorted(saved):
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out.append((a, b, lo, hi))
    if sum(hi - lo for _, _, lo, hi in out) != stop - start:
        raise ValueError(f"saved ranges {sorted(saved)} do not cover [{start}, {stop})")
    return out


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The last committed checkpoint under `root` (what LATEST names), or None."""
    pointer = Path(root) / POINTER
    if not pointer.exists():
        return None
    return Path(root) / pointer.read_text().strip()


class _DyingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter whose rank SIGKILLs itself right after writing its data (for the crash demo)."""

    def write_data(self, plan, planner):   # noqa: ANN001 - DCP's own signature
        result = super().write_data(plan, planner)
        result.wait()
        os.kill(os.getpid(), signal.SIGKILL)
        return result


def save_checkpoint(ctx: Context, root: str, state: RankState, die_on_rank: int | None = None) -> Path:
    """Collective: save this rank's chunks as step `state.step`, then commit. Returns the committed path."""
    name = f"step{state.step:06d}"
    tmp, final = Path(root) / f".tmp-{name}", Path(root) / name
    if ctx.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)             # leftovers of an earlier crashed save
        tmp.mkdir(parents=True)
    barrier(ctx, phase="checkpoint: prepare")
    own = state.params if state.stage == 3 else state.params[state.start:state.stop]
    moments = (state.exp_avg, state.exp_avg_sq) if state.stage > 0 else \
        (state.exp_avg[state.start:state.stop], state.exp_avg_sq[state.start:state.stop])
    to_save = {range_key(k, state.start, state.stop): t.clone() for k, t in zip(SHARDED, (own, *moments))}
    to_save.update(step=state.step, numel=state.numel)
    writer = _DyingWriter(tmp) if die_on_rank == ctx.rank else dcp.FileSystemWriter(tmp)
    with counted(ctx, f"dcp.save to {tmp.name} (plans only: the data goes to disk)", "checkpoint: save"):
        dcp.save(to_save, storage_writer=writer)
    barrier(ctx, phase="checkpoint: all written")
    if ctx.rank == 0:
        tmp.rename(final)
        pointer_tmp = Path(root) / f".{POINTER}.tmp"
        with open(pointer_tmp, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer_tmp, Path(root) / POINTER)
    barrier(ctx, phase="checkpoint: committed")
    return final


def load_checkpoint(ctx: Context, path: str | os.PathLike, cfg: ZeroConfig) -> RankState:
    """Collective: rebuild this rank's state (any world size) from a checkpoint saved on any world size."""
    state = init_state(ctx, cfg)
    saved = [parse_key(k) for k in dcp.FileSystemReader(path).read_metadata().state_dict_metadata
             if k.startswith(SHARDED)]
    want = {"params": (0, state.numel) if cfg.stage < 3 else (state.start, state.stop),
            "exp_avg": (0, state.numel) if cfg.stage == 0 else (state.start, state.stop)}
    want["exp_avg_sq"] = want["exp_avg"]
    plan = {k: overlaps([(a, b) for n, a, b in saved if n == k], *want[k]) for k in SHARDED}
    buffers = {range_key(k, a, b): torch.empty(b - a) for k in SHARDED for a, b, _, _ in plan[k]}
    to_load = {**buffers, "step": 0, "numel": 0}
    with counted(ctx, f"dcp.load from {Path(path).name} (plans only: the data comes from disk)", "checkpoint: load"):
        dcp.load(to_load, checkpoint_id=path)
    if to_load["numel"] != state.numel:
        raise ValueError(f"checkpoint holds {to_load['numel']} parameters, this model has {state.numel}")
    targets = {"params": state.params, "exp_avg": state.exp_avg, "exp_avg_sq": state.exp_avg_sq}
    for k in SHARDED:
        offset = want[k][0]
        for a, b, lo, hi in plan[k]:
            targets[k][lo - offset:hi - offset] = buffers[range_key(k, a, b)][lo - a:hi - a]
    state.step = to_load["step"]
    return state


def load_latest(ctx: Context, root: str | os.PathLike, cfg: ZeroConfig) -> RankState | None:
    """Collective: the state of the last committed checkpoint under `root`, or None if there is none."""
    path = latest_checkpoint(root)
    return None if path is None else load_checkpoint(ctx, path, cfg)


@dataclass(frozen=True)
class ResumableRun:
    """One rank's part of a resumable run: the step it resumed from, its chunks as loaded and at the end."""
    resumed_from: int
    loaded: dict[str, torch.Tensor]         # by SHARDED name: this rank's chunk right after loading (or init)
    final: dict[str, torch.Tensor]          # the same chunks after training to `until`
    range: tuple[int, int]                  # this rank's element range [start, stop)


def train_resumable(ctx: Context, root: str, cfg: ZeroConfig, until: int, save_every: int,
                    die_at: int | None = None, die_on_rank: int = 0) -> ResumableRun:
    """Rank function: resume from `root`'s latest checkpoint (or start), train to step `until`, saving as we go.

    With `die_at`, rank `die_on_rank` kills itself inside the save of that step.
    Returns this rank's chunks and the step it resumed from.
    """
    state = load_latest(ctx, root, cfg) or init_state(ctx, cfg)
    resumed_from = state.step
    loaded = _own_chunks(state)
    while state.step < until:
        train_step(ctx, state, cfg)
        if state.step % save_every == 0 or state.step == until:
            save_checkpoint(ctx, root, state, die_on_rank if state.step == die_at else None)
    return ResumableRun(resumed_from, loaded, _own_chunks(state), (state.start, state.stop))


def _own_chunks(state: RankState) -> dict[str, torch.Tensor]:
    own = slice(state.start, state.stop)
    return {"params": (state.params if state.stage == 3 else state.params[own]).clone(),
            "exp_avg": (state.exp_avg if state.stage > 0 else state.exp_avg[own]).clone(),
            "exp_avg_sq": (state.exp_avg_sq if state.stage > 0 else state.exp_avg_sq[own]).clone()}


def assemble(results: list[ResumableRun], which: str) -> dict[str, torch.Tensor]:
    """Concatenate every rank's chunks ('loaded' or 'final') into full flat vectors, in rank order."""
    return {k: torch.cat([getattr(r, which)[k] for r in results]) for k in SHARDED}


def _require_sizes(**sizes: int) -> None:
    """Each world size a positive integer (a ValueError naming the first that is not), before any process starts."""
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")


def _other_size(world_size: int) -> int:
    return 2 if world_size != 2 else 3


def resume_report(world_size: int, resume_on: int | None = None, stage: int = 2, save_at: int = 2,
                  until: int = 4) -> Report:
    """Train to `save_at` on `world_size` ranks, save, resume on `resume_on` ranks and train to `until`.

    Checked: the state loaded on the new ranks is the saved state, bitwise;
    the final weights match an uninterrupted run and single-process Adam.
    """
    resume_on = _other_size(world_size) if resume_on is None else resume_on
    _require_sizes(world_size=world_size, resume_on=resume_on)
    if not 1 <= save_at < until:
        raise ValueError(f"need 1 <= save_at < until, got save_at={save_at!r}, until={until!r}")
    cfg = ZeroConfig(stage=stage, steps=until)
    root = tempfile.mkdtemp(prefix="wmdist-ckpt-")
    start = time.perf_counter()
    try:
        first = run(train_resumable, world_size, root, cfg, save_at, save_at)
        second = run(train_resumable, resume_on, root, cfg, until, save_at)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    whole = torch.cat([o.chunk for o in run(zero_rank, world_size, cfg)])
    seconds = time.perf_counter() - start
    saved, loaded, final = assemble(first, "final"), assemble(second, "loaded"), assemble(second, "final")["params"]
    tol, why = adam_tolerance(cfg, max(world_size, resume_on))
    checks = [exact_check(f"{k} loaded on {resume_on} ranks == saved on {world_size}", loaded[k], saved[k],
                          "a checkpoint stores bytes: bitwise equal") for k in SHARDED]
    checks += [exact_check("resumed from the saved step", second[0].resumed_from, save_at, "an integer"),
               close_check("resumed run == uninterrupted run", final, whole, 2 * tol, "both within: " + why),
               close_check("resumed run == single-process Adam", final, reference_adam(cfg), tol, why)]
    return Report("checkpoint-resume", world_size, checks, [], seconds,
                  {"resume_on": resume_on, "stage": stage, "save_at": save_at, "until": until})


@dataclass(frozen=True)
class CrashEvidence:
    """What the crash left: the launcher's one-line failure, and the half-written data files."""
    failure: str
    partial_files: list[str]


def crash_report(world_size: int, resume_on: int | None = None, stage: int = 2) -> Report:
    """Kill one rank inside the save of step 4; the step-2 checkpoint must stay the latest and resume correctly."""
    resume_on = _other_size(world_size) if resume_on is None else resume_on
    _require_sizes(world_size=world_size, resume_on=resume_on)
    cfg = ZeroConfig(stage=stage, steps=4)
    root = tempfile.mkdtemp(prefix="wmdist-ckpt-")
    start = time.perf_counter()
    failure: RankFailure | None = None
    try:
        run(train_resumable, world_size, root, cfg, 2, 2)
        try:
            run(train_resumable, world_size, root, cfg, 4, 2, die_at=4, die_on_rank=world_size - 1)
        except RankFailure as err:
            failure = err
        latest = latest_checkpoint(root)
        partial = sorted(p.name for p in (Path(root) / ".tmp-step000004").glob("*.distcp"))
        resumed = run(train_resumable, resume_on, root, cfg, 4, 2)
        committed = latest_checkpoint(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.perf_counter() - start
    tol, why = adam_tolerance(cfg, max(world_size, resume_on))
    checks = [Check("the save of step 4 failed: a rank was killed inside dcp.save", 0.0 if failure else 1.0, 0.0,
                    "the launcher raises RankFailure"),
              Check("its data files were left half-written in the temporary directory", 0.0 if partial else 1.0,
                    0.0, "the killed rank wrote its shard before dying"),
              Check("after the crash LATEST still names step000002",
                    0.0 if latest is not None and latest.name == "step000002" else 1.0, 0.0, "names must match"),
              exact_check("resumed from step 2", resumed[0].resumed_from, 2, "an integer"),
              Check("the resumed run committed step000004",
                    0.0 if committed is not None and committed.name == "step000004" else 1.0, 0.0, "names must match"),
              close_check("resumed run == single-process Adam", assemble(resumed, "final")["params"],
                          reference_adam(cfg), tol, why)]
    return Report("checkpoint-crash", world_size, checks, [], seconds, {"resume_on": resume_on, "stage": stage},
                  CrashEvidence(str(failure).splitlines()[0] if failure else "", partial))


DEMOS = [Demo("checkpoint-resume", "Sharded DCP checkpoint saved on N ranks, resumed on another number",
              resume_report, world_sizes=(3, 4), chapter="03"),
         Demo("checkpoint-crash", "A rank killed mid-save leaves the last committed checkpoint intact",
              crash_report, world_sizes=(3,), chapter="03")]
