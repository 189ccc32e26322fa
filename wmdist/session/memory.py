"""What a Binder session of many chapters costs in memory: every chapter opened in its own kernel, all kept.

JupyterLab keeps a notebook's kernel running after its tab is closed, so a learner who opens the
chapters one after another ends up with one kernel per chapter, each with its own warm pool of
ranks, inside one container limited to 2 GiB and one CPU. `run_session` replays that: it makes
the cgroups (cgroup.py), starts the learner (chapters.py) inside them, so every kernel, forkserver,
rank and anything a kernel launcher starts is born inside, and reads back one row per chapter.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import nbformat

from wmdist.base.on_progress import OnProgress
from wmdist.session.cgroup import Limits

CHAPTERS_SCRIPT = Path(__file__).with_name("chapters.py")
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"       # in a checkout (an editable install)
IPYKERNEL_ARGV = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
WMDIST_KERNEL_ARGV = [sys.executable, "-m", "wmdist.kernel", "-f", "{connection_file}"]
RETURN_TO = (1, "train_demo(4)")   # the learner goes back to chapter 01 and re-runs its first training demo


def default_kernel_argv() -> list[str]:
    """The course's kernel launcher where this wmdist has one (wmdist/kernel.py), else plain ipykernel."""
    return list(WMDIST_KERNEL_ARGV if importlib.util.find_spec("wmdist.kernel") else IPYKERNEL_ARGV)


def course_session(*, root: Path = NOTEBOOKS) -> tuple[list[Path], tuple[int, int]]:
    """The course's chapters in order, and (position, code cell) of the cell RETURN_TO names."""
    notebooks = sorted(root.glob("[0-9][0-9]_*.ipynb"))
    if len(notebooks) <= RETURN_TO[0]:
        raise FileNotFoundError(f"no course notebooks under {root} (they ship with a checkout, not the wheel)")
    cells = [c for c in nbformat.read(notebooks[RETURN_TO[0]], as_version=4).cells if c.cell_type == "code"]
    matches = [i for i, c in enumerate(cells) if RETURN_TO[1] in c.source]
    if not matches:
        raise ValueError(f"{notebooks[RETURN_TO[0]].name} has no code cell with {RETURN_TO[1]!r} to return to")
    return notebooks, (RETURN_TO[0], matches[0])


@dataclass(frozen=True, kw_only=True)
class KernelMemory:
    """One kernel's process tree after a chapter, in MiB: PSS and USS of the kernel, its forkserver, its ranks."""
    chapter: str
    pid: int | None
    alive: bool
    n_ranks: int
    kernel_pss_mib: float
    kernel_uss_mib: float
    forkserver_pss_mib: float
    forkserver_uss_mib: float
    ranks_pss_mib: float
    ranks_uss_mib: float
    other_pss_mib: float
    other_uss_mib: float


@dataclass(frozen=True, kw_only=True)
class ChapterMemory:
    """The session after one more chapter: PSS summed over every process in the cgroup, and the cgroup's counters.

    `pss_mib` includes the harness (a stand-in for Binder's Jupyter server, which shares the container);
    `kernels_pss_mib` is the kernels' trees alone. `usage_mib` is what the cgroup charges (page cache
    included), which is what its limit and OOM killer act on.
    """
    chapter: str
    seconds: float
    errors: tuple[str, ...]
    kernels_alive: int
    processes: int
    pss_mib: float
    pss_anon_mib: float
    kernels_pss_mib: float
    outside_kernels_pss_mib: float
    usage_mib: float
    max_usage_mib: float
    oom_kills: int
    failcnt: int
    kernels: tuple[KernelMemory, ...]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChapterMemory:
        return cls(**{**d, "errors": tuple(d["errors"]), "kernels": tuple(KernelMemory(**k) for k in d["kernels"])})


@dataclass(frozen=True, kw_only=True)
class SessionMemory:
    """A whole session: its settings, a row per chapter, the return to an earlier chapter, and the totals.

    `skipped` is the reason nothing was measured (no writable cgroup v1 memory hierarchy), else None.
    """
    memory_limit_mib: int | None
    cpu_quota: float | None
    kernel_argv: tuple[str, ...]
    chapters: tuple[ChapterMemory, ...] = ()
    revisit: str | None = None
    revisit_ok: bool | None = None
    revisit_errors: tuple[str, ...] = ()
    alive_at_end: tuple[bool, ...] = ()
    oom_kills: int = 0
    peak_pss_mib: float = 0.0
    max_usage_mib: float = 0.0
    seconds: float = 0.0
    cpu_throttled_s: float | None = None
    skipped: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def all_alive(self) -> bool:
        return bool(self.alive_at_end) and all(self.alive_at_end) and len(self.alive_at_end) == len(self.chapters)

    @property
    def errors(self) -> dict[str, tuple[str, ...]]:
        return {c.chapter: c.errors for c in self.chapters if c.errors}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """Per chapter: seconds, PSS of everything in the cgroup, the cgroup's charge, kernels alive, OOM kills."""
        lines = [f"{'chapter':<34} {'s':>6} {'PSS MiB':>8} {'kernels':>8} {'cgroup':>7} {'peak':>7} "
                 f"{'alive':>6} {'OOM':>4} {'errors':>6}"]
        for c in self.chapters:
            lines.append(f"{c.chapter:<34} {c.seconds:6.1f} {c.pss_mib:8.0f} {c.kernels_pss_mib:8.0f} "
                         f"{c.usage_mib:7.0f} {c.max_usage_mib:7.0f} {c.kernels_alive:>3}/{len(c.kernels):<2} "
                         f"{c.oom_kills:4d} {len(c.errors):6d}")
        return "\n".join(lines)

    def breakdown(self) -> str:
        """After each chapter, each kernel's PSS / USS in MiB: the kernel process, its forkserver, its ranks."""
        lines = [f"{'after':<30} {'kernel of':<30} {'alive':>5} {'kernel':>11} {'forkserver':>11} "
                 f"{'ranks (n)':>16} {'other':>11}"]
        pair = lambda p, u: f"{p:5.0f}/{u:<5.0f}"     # noqa: E731
        for c in self.chapters:
            for k in c.kernels:
                lines.append(f"{c.chapter:<30} {k.chapter:<30} {'yes' if k.alive else 'no':>5} "
                             f"{pair(k.kernel_pss_mib, k.kernel_uss_mib)} "
                             f"{pair(k.forkserver_pss_mib, k.forkserver_uss_mib)} "
                             f"{pair(k.ranks_pss_mib, k.ranks_uss_mib)} ({k.n_ranks:2d}) "
                             f"{pair(k.other_pss_mib, k.other_uss_mib)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        if self.skipped:
            return f"session not measured: {self.skipped}"
        limit = f"{self.memory_limit_mib} MiB" if self.memory_limit_mib else "no memory limit"
        held = f" ({self.cpu_throttled_s:.1f} s of it held back by the quota)" if self.cpu_throttled_s else ""
        head = (f"{len(self.chapters)} chapters, every kernel kept; {limit}, cpu quota {self.cpu_quota}; "
                f"{self.seconds:.0f} s{held}; kernel: {' '.join(self.kernel_argv[1:3])}")
        tail = (f"peak PSS {self.peak_pss_mib:.0f} MiB, cgroup peak {self.max_usage_mib:.0f} MiB, "
                f"OOM kills {self.oom_kills}, all kernels alive: {self.all_alive}; "
                f"back to {self.revisit}: {'ok' if self.revisit_ok else self.revisit_errors}")
        errors = [f"{chapter}: {error}" for chapter, found in self.errors.items() for error in found]
        return "\n".join([head, self.table(), tail, *errors, *self.notes])


def _check(notebooks: list[Path], memory_limit_mib: int | None, cpu_quota: float | None,
           revisit: tuple[int, int] | None, kernel_argv: list[str]) -> None:
    """Clear errors before anything starts."""
    if not notebooks:
        raise ValueError("notebooks: expected at least one .ipynb path, got none")
    missing = [str(p) for p in notebooks if not Path(p).is_file() or Path(p).suffix != ".ipynb"]
    if missing:
        raise ValueError(f"notebooks: expected existing .ipynb files, got {missing}")
    if memory_limit_mib is not None and (not isinstance(memory_limit_mib, int) or memory_limit_mib < 64):
        raise ValueError(f"memory_limit_mib: expected an int of at least 64 (MiB) or None, got {memory_limit_mib!r}")
    if cpu_quota is not None and not 0.01 <= cpu_quota <= (os.cpu_count() or 1):
        raise ValueError(f"cpu_quota: expected CPUs between 0.01 and {os.cpu_count()} or None, got {cpu_quota!r}")
    if revisit is not None and not -len(notebooks) <= revisit[0] < len(notebooks):
        raise ValueError(f"revisit: expected (chapter position < {len(notebooks)}, code cell), got {revisit!r}")
    if revisit is not None:
        cells = sum(c.cell_type == "code" for c in nbformat.read(notebooks[revisit[0]], as_version=4).cells)
        if not -cells <= revisit[1] < cells:
            raise ValueError(f"revisit: {notebooks[revisit[0]].name} has {cells} code cells, got cell {revisit[1]}")
    if "{connection_file}" not in kernel_argv:
        raise ValueError(f"kernel_argv: expected an argv holding '{{connection_file}}', got {kernel_argv!r}")


def follow(messages: Iterable[str], *, total: int, start: float, on_chapter: Callable[[ChapterMemory], None] | None,
           progress: OnProgress | None, clock: Callable[[], float] = time.perf_counter,
           ) -> tuple[list[ChapterMemory], dict[str, Any]]:
    """Read chapters.py's JSON lines as they come: the rows, the "end" message, and progress on the way.

    progress(k - 1, total, "NAME: started, E s in") as chapter k starts, progress(k, total, "NAME: done in
    S s, PSS P MiB, E s in") as it ends, and once more before the return to an earlier chapter; E is the
    time since `start` on `clock`. A session of ten chapters takes minutes, and says where it is.
    """
    rows: list[ChapterMemory] = []
    end: dict[str, Any] = {}
    tell = progress or (lambda done, of, text: None)
    for line in messages:
        message = json.loads(line)
        elapsed = clock() - start
        if "start" in message:
            tell(len(rows), total, f"{message['start']}: started, {elapsed:.0f} s in")
        elif "revisit" in message:
            tell(len(rows), total, f"going back: re-running {message['revisit']}, {elapsed:.0f} s in")
        elif "chapter" in message:
            rows.append(ChapterMemory.from_dict(message["chapter"]))
            row = rows[-1]
            tell(len(rows), total, f"{row.chapter}: done in {row.seconds:.0f} s, PSS {row.pss_mib:.0f} MiB, "
                                   f"{elapsed:.0f} s in")
            if on_chapter is not None:
                on_chapter(row)
        else:
            end = message["end"]
    return rows, end


def run_session(notebooks: list[Path], *, kernel_argv: list[str] | None = None, memory_limit_mib: int | None = 2048,
                cpu_quota: float | None = 1.0, revisit: tuple[int, int] | None = (1, -1), cell_timeout: int = 600,
                on_chapter: Callable[[ChapterMemory], None] | None = None,
                progress: OnProgress | None = None) -> SessionMemory:
    """Open each notebook in its own kernel, in order, keeping every kernel; measure after each chapter.

    kernel_argv: the kernel spec's argv (default: plain ipykernel, as Binder's `python3` kernel).
    memory_limit_mib / cpu_quota: the container's limits (None: no limit, still measured in a cgroup).
    revisit: (position in `notebooks`, code cell index, negative from the end) re-run at the end in that
    chapter's kernel, as a learner going back would. on_chapter: called with each row as it comes.
    progress: told as each chapter starts and ends (see `follow`).
    """
    notebooks = [Path(p).resolve() for p in notebooks]
    argv = list(kernel_argv or IPYKERNEL_ARGV)
    _check(notebooks, memory_limit_mib, cpu_quota, revisit, argv)
    base = SessionMemory(memory_limit_mib=memory_limit_mib, cpu_quota=cpu_quota, kernel_argv=tuple(argv))
    if not sys.platform.startswith("linux"):
        return replace(base, skipped=f"cgroups are Linux's; this is {sys.platform}")
    try:
        limits = Limits.create(memory_limit_mib=memory_limit_mib, cpu_quota=cpu_quota)
    except OSError as e:
        return replace(base, skipped=f"no writable cgroup v1 memory hierarchy here ({e})")
    start = time.perf_counter()
    rows: list[ChapterMemory] = []
    end: dict[str, Any] = {}
    notes = []
    try:
        with tempfile.TemporaryDirectory(prefix="wmdist-session-") as tmp, open(Path(tmp) / "log", "w+") as log:
            config = {"notebooks": [str(p) for p in notebooks], "kernel_argv": argv, "memory": str(limits.memory),
                      "revisit": revisit, "cell_timeout": cell_timeout}
            env = {**os.environ, "JUPYTER_RUNTIME_DIR": f"{tmp}/runtime", "IPYTHONDIR": f"{tmp}/ipython"}
            read, write = os.pipe()
            command = limits.inside([sys.executable, str(CHAPTERS_SCRIPT), json.dumps(config), str(write)])
            proc = subprocess.Popen(command, pass_fds=(write,), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
            os.close(write)
            with os.fdopen(read) as results:
                rows, end = follow(results, total=len(notebooks), start=start, on_chapter=on_chapter, progress=progress)
            code = proc.wait()
            counters, throttled = limits.counters(), limits.throttled_s()
            if code != 0 or not end:
                log.seek(0)
                notes.append(f"the harness exited with {code} after {len(rows)} chapters: {log.read()[-2000:]}")
    finally:
        ended = limits.remove()
    if ended:
        notes.append(f"{len(ended)} processes were still in the cgroup after the kernels shut down, and were ended")
    return replace(base, chapters=tuple(rows), revisit=end.get("revisit"), revisit_ok=end.get("ok"),
                   revisit_errors=tuple(end.get("errors", ())), alive_at_end=tuple(end.get("alive", ())),
                   oom_kills=counters.oom_kills, peak_pss_mib=max((r.pss_mib for r in rows), default=0.0),
                   max_usage_mib=counters.max_usage_bytes / 2 ** 20, seconds=time.perf_counter() - start,
                   cpu_throttled_s=throttled, notes=tuple(notes))

