"""Sharded checkpoints on disk with torch.distributed.checkpoint (DCP): save, commit atomically, load resharded.

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
moment of a save leaves the previous checkpoint as the latest one. What a
killed save left (its temporary directory, or, killed between the rename and
the pointer, a final-named directory that LATEST never named) is removed by
the next save of that step, which says so: a DroppedSaveWarning on rank 0
naming each directory, and the directories in the Commit it returns.
"""
from __future__ import annotations

import os
import shutil
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from wmdist.comm import Context, barrier, counted
from wmdist.memory.zero import ZeroRankState, ZeroConfig, init_state

POINTER = "LATEST"
SHARDED = ("params", "exp_avg", "exp_avg_sq")


class DroppedSaveWarning(UserWarning):
    """A save removed what an earlier, killed save of the same step left behind (it was never committed)."""


@dataclass(frozen=True)
class Commit:
    """What save_checkpoint did: the committed directory, and the uncommitted ones it removed first (rank 0's)."""
    path: Path
    dropped: tuple[Path, ...] = ()


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


def drop_uncommitted(root: str | os.PathLike, name: str) -> tuple[Path, ...]:
    """Remove what a killed save of `name` left under `root` (never committed: LATEST does not name it), warning
    with each directory's name; the directories removed. A committed `name` is refused: a step is saved once."""
    tmp, final = Path(root) / f".tmp-{name}", Path(root) / name
    if final.exists() and latest_checkpoint(root) == final:
        raise ValueError(f"{final} is already the committed checkpoint; a step is saved once")
    dropped = tuple(d for d in (tmp, final) if d.exists())
    for d in dropped:
        shutil.rmtree(d)
        warnings.warn(f"dropped {d}: an earlier save of {name} left it and was never committed (killed before "
                      f"{POINTER} named it); saving {name} again", DroppedSaveWarning, stacklevel=3)
    return dropped


def save_checkpoint(ctx: Context, root: str, state: ZeroRankState, *, die_on_rank: int | None = None) -> Commit:
    """Collective: save this rank's chunks as step `state.step`, then commit. Returns the committed path and
    (on rank 0) what an earlier killed save of this step had left, removed first (see drop_uncommitted)."""
    name = f"step{state.step:06d}"
    tmp, final = Path(root) / f".tmp-{name}", Path(root) / name
    dropped: tuple[Path, ...] = ()
    if ctx.rank == 0:
        dropped = drop_uncommitted(root, name)
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
    return Commit(final, dropped)


def load_checkpoint(ctx: Context, path: str | os.PathLike, cfg: ZeroConfig) -> ZeroRankState:
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


def load_latest(ctx: Context, root: str | os.PathLike, cfg: ZeroConfig) -> ZeroRankState | None:
    """Collective: the state of the last committed checkpoint under `root`, or None if there is none."""
    path = latest_checkpoint(root)
    return None if path is None else load_checkpoint(ctx, path, cfg)
