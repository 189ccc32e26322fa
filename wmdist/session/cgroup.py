"""A cgroup v1 memory (and cpu) limit around a group of processes, as Binder puts one around a session.

Binder runs each session in a container whose memory cgroup is limited to 2 GiB (no swap) and
whose cpu cgroup gets one CPU of quota. `Limits.create` makes the same pair of cgroups, nested
inside the cgroups this process is in already (a parent's limit still applies, and whatever the
machine accounts to us stays accounted to us), so that a process started `inside` them, and every
process it starts, runs under those limits. `remove` ends what is left inside (every
process there was started in the session), hands back anything it cannot end to the parent
cgroup, and deletes the directories.
"""
from __future__ import annotations

import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


def _own_path(controller: str) -> str:
    """This process's cgroup path for a v1 controller ('memory', 'cpu'), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise OSError(f"this process is in no cgroup v1 {controller} hierarchy")


def _write(path: Path, value: int | str) -> None:
    path.write_text(f"{value}\n")


def _make(controller: str, name: str) -> Path:
    """A new cgroup `name` under this process's own cgroup of `controller`."""
    base = ROOT / controller
    if not (base / "tasks").exists():
        raise OSError(f"no cgroup v1 {controller} hierarchy at {base}")
    where = base / _own_path(controller).lstrip("/") / name
    where.mkdir()
    return where


def pids_in(cgroup: Path) -> list[int]:
    """Process ids (thread-group leaders) in a cgroup."""
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


@dataclass(frozen=True, kw_only=True)
class Counters:
    """What the memory cgroup itself counts: bytes charged now and at most, OOM kills, limit hits."""
    usage_bytes: int
    max_usage_bytes: int
    oom_kills: int
    failcnt: int


@dataclass(frozen=True, kw_only=True)
class Limits:
    """A memory cgroup (always) and a cpu cgroup (when a quota is set) made for one session."""
    memory: Path
    cpu: Path | None

    @classmethod
    def create(cls, *, memory_limit_mib: int | None, cpu_quota: float | None) -> Limits:
        """Make the cgroups; OSError (with what is missing) where cgroup v1 is absent or not writable.

        memory_limit_mib=None makes an unlimited memory cgroup: it still counts the session's
        processes and pages, which is how an uncapped run is measured.
        """
        name = f"wmdist-session-{os.getpid()}-{secrets.token_hex(3)}"
        memory = _make("memory", name)
        cpu = None
        try:
            if memory_limit_mib is not None:
                limit = memory_limit_mib * 2 ** 20
                _write(memory / "memory.limit_in_bytes", limit)
                if (memory / "memory.memsw.limit_in_bytes").exists():     # memory + swap: Binder has no swap
                    _write(memory / "memory.memsw.limit_in_bytes", limit)
            if (memory / "memory.swappiness").exists():
                _write(memory / "memory.swappiness", 0)
            if cpu_quota is not None:
                cpu = _make("cpu", name)
                _write(cpu / "cpu.cfs_period_us", CFS_PERIOD_US)
                _write(cpu / "cpu.cfs_quota_us", round(cpu_quota * CFS_PERIOD_US))
        except BaseException:
            cls(memory=memory, cpu=cpu).remove()
            raise
        return cls(memory=memory, cpu=cpu)

    def inside(self, argv: list[str]) -> list[str]:
        """`argv` prefixed so that it starts inside the cgroups: a shell joins them, then execs argv.

        The shell moves itself (v1: writing 0 moves the writer) before exec, so the program and
        everything it starts are born inside, before they allocate anything.
        """
        files = " ".join(shlex.quote(str(g / "cgroup.procs")) for g in (self.memory, self.cpu) if g is not None)
        return ["/bin/sh", "-c", f'for f in {files}; do echo 0 > "$f" || exit 97; done; exec "$@"', "sh", *argv]

    def counters(self) -> Counters:
        oom = dict(line.split() for line in (self.memory / "memory.oom_control").read_text().splitlines())
        read = lambda name: int((self.memory / name).read_text())   # noqa: E731
        return Counters(usage_bytes=read("memory.usage_in_bytes"), max_usage_bytes=read("memory.max_usage_in_bytes"),
                        oom_kills=int(oom.get("oom_kill", 0)), failcnt=read("memory.failcnt"))

    def throttled_s(self) -> float | None:
        """Seconds the cpu quota held the session back (cpu.stat's throttled_time), None without a quota."""
        if self.cpu is None:
            return None
        stat = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
        return int(stat.get("throttled_time", 0)) / 1e9

    def remove(self, *, grace_s: float = 5.0) -> list[int]:
        """End every process still inside, then delete the cgroups. Returns the pids that had to be ended.

        A process that survives SIGKILL past the grace (it cannot, short of being stuck in the
        kernel) is moved to the parent cgroup so the directory can still be deleted.
        """
        left = pids_in(self.memory)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids_in(self.memory):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while pids_in(self.memory) and time.monotonic() < deadline:
                time.sleep(0.05)
        for group in (self.memory, self.cpu):
            if group is None or not group.exists():
                continue
            for pid in pids_in(group):
                try:
                    _write(group.parent / "cgroup.procs", pid)
                except OSError:
                    pass
            for _ in range(100):      # the kernel frees a cgroup a moment after its last process leaves
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        return left
