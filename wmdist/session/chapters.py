"""The learner's side of a Binder session: one kernel per notebook, each kept running, measured after each chapter.

`memory.run_session` starts this file as a script inside the session's cgroups:

    python wmdist/session/chapters.py CONFIG_JSON RESULT_FD

It never imports the wmdist package (whose import loads torch, which would put a torch-sized harness
in the measured cgroup); its one sibling, cgroup.py, imports nothing from wmdist either and is found
because a script's folder is first on sys.path. For each notebook in turn it starts a kernel from
`kernel_argv` (as JupyterLab would: a kernel spec), runs every code cell with nbclient (errors are
recorded, not raised), leaves the kernel running, and writes one JSON line to RESULT_FD as it starts
(its name, for the progress lines) and one as it ends: seconds,
errors, which kernels are alive, the PSS of every process in the memory cgroup (by kernel: the kernel
process, its forkserver, the ranks forked from it) and the cgroup's own counters. Then it re-runs one
cell of an earlier chapter in that chapter's kernel (the learner going back), writes an "end" line,
and shuts every kernel down.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from cgroup import Limits, pids_in     # the sibling module (see above)

MIB = 2 ** 20
KERNEL_NAME = "wmdist-session"
RAISES = "NBVAL_RAISES_EXCEPTION"      # a cell the course means to raise (docs/notebooks.md): not an error
PID_EXPRESSION = "__import__('os').getpid()"


def smaps(pid: int) -> dict[str, int]:
    """PSS, anonymous PSS and USS of one process, in bytes (zeros once it is gone), from smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {"pss": 0, "pss_anon": 0, "uss": 0}
    kb = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        kb[key] = int(rest.split()[0]) * 1024
    return {"pss": kb.get("Pss", 0), "pss_anon": kb.get("Pss_Anon", 0),
            "uss": kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)}


def _summed(pids: list[int], key: str) -> float:
    return sum(smaps(p)[key] for p in pids) / MIB


def kernel_parts(pid: int | None) -> dict[str, Any]:
    """A kernel's process tree split into the kernel itself, its forkserver(s), the ranks they forked, the rest.

    A rank is forked from the forkserver without exec, so it is known by its parent, not its command line.
    """
    empty = {"pids": [], "kernel": [], "forkserver": [], "ranks": [], "other": []}
    if pid is None:                       # dead, or its pid never came back
        return empty
    try:
        root = psutil.Process(pid)
        tree = root.children(recursive=True)
        servers = [p for p in root.children() if "forkserver" in " ".join(p.cmdline())]
        ranks = [q.pid for s in servers for q in s.children(recursive=True)]
    except psutil.Error:
        return empty
    parts = {"kernel": [pid], "forkserver": [s.pid for s in servers], "ranks": ranks}
    taken = {p for group in parts.values() for p in group}
    return {"pids": [pid, *(p.pid for p in tree)], **parts, "other": [p.pid for p in tree if p.pid not in taken]}


def chapter_row(name: str, seconds: float, errors: list[str], kernels: list[dict[str, Any]],
                limits: Limits) -> dict[str, Any]:
    """Everything measured after one chapter, as plain JSON (memory.ChapterMemory reads it)."""
    everyone = pids_in(limits.memory)
    counters = limits.counters()
    rows, in_kernels = [], set()
    for k in kernels:
        parts = kernel_parts(k["pid"] if k["alive"] else None)
        in_kernels |= set(parts["pids"])
        rows.append({"chapter": k["chapter"], "pid": k["pid"], "alive": k["alive"], "n_ranks": len(parts["ranks"]),
                     **{f"{part}_{key}_mib": _summed(parts[part], key)
                        for part in ("kernel", "forkserver", "ranks", "other") for key in ("pss", "uss")}})
    return {"chapter": name, "seconds": seconds, "errors": errors, "kernels_alive": sum(k["alive"] for k in kernels),
            "processes": len(everyone), "pss_mib": _summed(everyone, "pss"),
            "pss_anon_mib": _summed(everyone, "pss_anon"),
            "kernels_pss_mib": _summed(sorted(in_kernels), "pss"),
            "outside_kernels_pss_mib": _summed([p for p in everyone if p not in in_kernels], "pss"),
            "usage_mib": counters.usage_bytes / MIB, "max_usage_mib": counters.max_usage_bytes / MIB,
            "oom_kills": counters.oom_kills, "failcnt": counters.failcnt, "kernels": rows}


def cell_errors(nb: Any) -> list[str]:
    """'cell I: Name: message' for each code cell whose output holds an error it was not meant to raise."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and RAISES not in cell.source:
            out += [f"cell {i}: {o.ename}: {o.evalue}"[:300]
                    for o in cell.get("outputs", []) if o.output_type == "error"]
    return out


async def kernel_pid(client: NotebookClient) -> int | None:
    """The kernel's own process id, asked of the kernel (a launcher may have forked it from elsewhere)."""
    msg_id = client.kc.execute("", silent=True, user_expressions={"pid": PID_EXPRESSION})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = await client.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            value = reply["content"].get("user_expressions", {}).get("pid", {})
            return int(value["data"]["text/plain"]) if value.get("status") == "ok" else None
    return None


class Session:
    """The open chapters: a kernel manager and a notebook client per chapter, in the order they were opened."""

    def __init__(self, spec_dir: str, cell_timeout: int):
        self.specs = KernelSpecManager(kernel_dirs=[spec_dir])
        self.cell_timeout = cell_timeout
        self.open: list[dict[str, Any]] = []

    async def run_chapter(self, path: Path) -> tuple[float, list[str]]:
        """Open `path` in a new kernel and run all its cells; (seconds, errors). The kernel is left running."""
        km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=self.specs)
        nb = nbformat.read(path, as_version=4)
        # store_widget_state: as tools/refresh_notebook.py, since panels draw into Output widgets.
        client = NotebookClient(nb, km=km, timeout=self.cell_timeout, allow_errors=True, store_widget_state=True,
                                resources={"metadata": {"path": str(path.parent)}})
        chapter = {"chapter": path.stem, "km": km, "client": client, "pid": None, "alive": True}
        self.open.append(chapter)
        start = time.perf_counter()
        failures = []
        try:
            await km.start_kernel(cwd=str(path.parent))
            await client.async_start_new_kernel_client()
            chapter["pid"] = await kernel_pid(client)
            await client.async_execute()
        except Exception as e:    # a dead kernel, a timeout: recorded with the chapter, and the session goes on
            failures.append(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300])
        return time.perf_counter() - start, cell_errors(nb) + failures

    async def alive(self) -> list[dict[str, Any]]:
        for chapter in self.open:
            chapter["alive"] = bool(await chapter["km"].is_alive())
        return self.open

    async def revisit(self, chapter: int, code_cell: int) -> dict[str, Any]:
        """Run code cell `code_cell` of the `chapter`-th opened notebook again, in its own kernel."""
        opened = self.open[chapter]
        client = opened["client"]
        cells = [(i, c) for i, c in enumerate(client.nb.cells) if c.cell_type == "code"]
        index, cell = cells[code_cell]
        where = f"{opened['chapter']} cell {index}"
        if not await opened["km"].is_alive():
            return {"revisit": where, "ok": False, "errors": ["the kernel is dead"]}
        cell.outputs = []
        try:
            await client.async_execute_cell(cell, index)
        except Exception as e:
            return {"revisit": where, "ok": False, "errors": [f"{type(e).__name__}: {e}"[:300]]}
        errors = [f"{o.ename}: {o.evalue}"[:300] for o in cell.outputs if o.output_type == "error"]
        return {"revisit": where, "ok": not errors, "errors": errors}

    async def close(self) -> None:
        async def one(chapter: dict[str, Any]) -> None:
            try:
                if chapter["client"].kc is not None:
                    chapter["client"].kc.stop_channels()
                if await chapter["km"].is_alive():
                    await chapter["km"].shutdown_kernel(now=False)
                await chapter["km"].cleanup_resources()
            except Exception:      # a kernel that will not stop is ended with the cgroup (cgroup.Limits.remove)
                pass
        await asyncio.gather(*(one(c) for c in self.open))


def tell(out: Any, message: dict[str, Any]) -> None:
    """One JSON line to the parent, at once: {"start": name} as a chapter opens, {"chapter": row} as it ends,
    {"revisit": where} before the return to an earlier chapter, {"end": ...} last."""
    out.write(json.dumps(message) + "\n")
    out.flush()


async def main(config: dict[str, Any], out: Any) -> None:
    limits = Limits(memory=Path(config["memory"]), cpu=None)
    with tempfile.TemporaryDirectory(prefix="wmdist-session-") as tmp:
        spec = Path(tmp) / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        # OMP_NUM_THREADS=1: what binder/start exports for every process of a Binder session.
        (spec / "kernel.json").write_text(json.dumps({"argv": config["kernel_argv"], "language": "python",
                                                      "display_name": "wmdist session",
                                                      "env": {"OMP_NUM_THREADS": "1"}}))
        session = Session(str(spec.parent), config["cell_timeout"])
        try:
            for path in map(Path, config["notebooks"]):
                tell(out, {"start": path.stem})
                seconds, errors = await session.run_chapter(path)
                row = chapter_row(path.stem, seconds, errors, await session.alive(), limits)
                tell(out, {"chapter": row})
            end: dict[str, Any] = {"revisit": None, "ok": None, "errors": []}
            if config["revisit"] is not None:
                chapter, cell = config["revisit"]
                tell(out, {"revisit": f"{session.open[chapter]['chapter']}, code cell {cell}"})
                end = await session.revisit(chapter, cell)
            end["alive"] = [c["alive"] for c in await session.alive()]
            tell(out, {"end": end})
        finally:
            await session.close()


if __name__ == "__main__":
    with os.fdopen(int(sys.argv[2]), "w") as result:
        asyncio.run(main(json.loads(sys.argv[1]), result))
