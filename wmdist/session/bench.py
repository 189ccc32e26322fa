"""`wmdist bench session-memory`: a Binder session of every chapter, as one benchmark record.

run_session (memory.py) measures; this turns its SessionMemory into a BenchResult whose headline is the
peak over chapters of the summed PSS over the memory limit. wmdist/bench/suite.py registers it and reads the
load average around it.
"""
from __future__ import annotations

from wmdist.base.bench_result import BenchResult
from wmdist.base.on_progress import OnProgress
from wmdist.session import memory


def session_memory(*, memory_limit_mib: int = 2048, cpu_quota: float | None = 1.0,
                   progress: OnProgress | None = None) -> BenchResult:
    """The course's chapters opened one after another, every kernel kept, under Binder's limits.

    progress: told as each chapter starts and ends (memory.follow), since the whole takes minutes.
    """
    notebooks, revisit = memory.course_session()
    s = memory.run_session(notebooks, kernel_argv=memory.default_kernel_argv(), memory_limit_mib=memory_limit_mib,
                           cpu_quota=cpu_quota, revisit=revisit, progress=progress)
    inputs = {"chapters": len(notebooks), "memory_limit_MiB": memory_limit_mib, "cpu_quota": cpu_quota,
              "kernel": " ".join(s.kernel_argv[1:3]), "kernels": "one per chapter, all kept"}
    if s.skipped:
        return BenchResult(name="session-memory", inputs=inputs, measured={}, value=float("nan"), unit="x",
                           target="< 1.0", met=False, notes=[s.skipped])
    ratio = s.peak_pss_mib / memory_limit_mib
    measured = {"peak_pss_MiB": round(s.peak_pss_mib, 1), "cgroup_peak_MiB": round(s.max_usage_mib, 1),
                "oom_kills": s.oom_kills, "all_kernels_alive": s.all_alive, "return_ok": s.revisit_ok,
                "notebooks_with_errors": sorted(s.errors), "seconds": round(s.seconds, 1)}
    return BenchResult(name="session-memory", inputs=inputs, measured=measured, value=ratio, unit="x",
                       target="< 1.0 (peak summed PSS / limit), no OOM kill, every kernel alive, the return re-runs",
                       met=ratio < 1.0 and s.oom_kills == 0 and s.all_alive and bool(s.revisit_ok),
                       notes=[*s.table().splitlines(),
                              f"back to {s.revisit}: {'ok' if s.revisit_ok else s.revisit_errors}", *s.notes])
