"""How much memory checking your own model takes, and a refusal up front when it will not fit.

A check on a model of P float32 parameters (4P bytes: "one copy") holds at its peak:

* in this process (the parent), while it compares: the ranks' results as they arrive, each twice for
  a moment (the pickled bytes and the tensors made from them): data_parallel keeps rank 0's final
  parameters and step-0 gradient, ours and DDP's (4 copies; every other rank sends a digest of its
  parameters, not a copy, which for 4 ranks was 8 copies more), ZeRO every rank's chunk of both (2)
  and torch's parameters (1); then the one-process reference: its model and gradients (2), the
  optimizer's state (slots), the whole gradient and the step-0 one (2), one float32 bound per step
  (steps; float64 before), and the bound's working set (two float64 running sums, its two float32
  outputs, one example's gradient: 7). The tolerance probes come one at a time, each smaller.
* in each rank: its model, gradients, optimizer state, the flat gradient and the all-reduce's
  buffers, then torch's run of the same (DDP's buckets; FSDP2's padded, gathered units and its
  reduce-scatter inputs, the most), with the result of the first kept: RANK_COPIES, fitted per stage
  to peaks measured at 4.2M and 16.8M parameters (Adam, 2 ranks), plus the fixed part of that fit.

Freed memory is handed back to the system after each phase (`release_freed_memory`): glibc kept the
freed 16 MiB blocks, and the parent's peak grew probe after probe. Measured (USS, summed over the
parent and its ranks, 4.2M parameters, Adam, 2 ranks; the parent's 191 MiB of torch before it included):
data_parallel 1588 MiB before these changes, 1046 MiB after; zero(stage=3) 2041 -> 1721 MiB, of which
torch's FSDP2 run is most of each rank's 584 MiB. The estimate for those two: 961 MiB (measured 855
above the parent's own torch) and 1473 MiB (measured 1530: within 4%; a 16.8M model's zero-3, about
5.4 GiB, is refused under Binder's 2 GiB before it starts). `refuse_if_too_big` compares the estimate with the
memory this process may still use (its cgroup's limit less its usage, v2 or v1, or MemAvailable,
the least) before any process starts. Frozen parameters are counted as trainable ones (an over-estimate:
they have no gradient or optimizer state) and a float64 element as two float32 ones (dp_check.estimate).
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

MiB = 2 ** 20
RESULT_COPIES = {0: 4, 1: 3, 2: 3, 3: 3}      # tensors the parent receives, in copies of the model (see above)
REFERENCE_COPIES = 2 + 2 + 7                   # model and grads, the whole and step-0 gradients, the bound's set
PARENT_FIXED_BYTES = 32 * MiB                  # the parent's own working memory for a check, besides the copies
RANK_COPIES = {0: 14, 1: 18, 2: 25, 3: 31}     # peak per rank, in copies (Adam), with RANK_FIXED_BYTES: fitted to
RANK_FIXED_BYTES = 48 * MiB                    # peaks at 4.2M and 16.8M parameters, kept small so that a warm rank
                                               # (already charged) is not refused for memory it already holds
OVERRIDE = "WMDIST_YOURS_MEMORY_BYTES"         # environment: the memory to compare with, instead of the system's


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Bytes a check will hold at its peak: in this process, in each rank, and all together."""
    parent: int
    per_rank: int
    world_size: int

    @property
    def total(self) -> int:
        return self.parent + self.world_size * self.per_rank


def estimate_bytes(numel: int, world_size: int, *, stage: int, slots: int, steps: int) -> Estimate:
    """The peak of a check on `numel` float32 parameters (`slots` optimizer state vectors: Adam 2, momentum 1)."""
    copy = 4 * numel
    parent = (2 * RESULT_COPIES[stage] + REFERENCE_COPIES + slots + steps) * copy + PARENT_FIXED_BYTES
    return Estimate(parent=parent, per_rank=RANK_COPIES[stage] * copy + RANK_FIXED_BYTES, world_size=world_size)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None      # "max" (v2, no limit) reads as None


def _own_cgroups(proc_cgroup: str) -> list[tuple[str, str]]:
    """(version, path) of this process's memory cgroup: v2's one line "0::/path", or v1's memory line."""
    out = []
    for line in proc_cgroup.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            out.append(("v2", path))
        elif "memory" in controllers.split(","):
            out.append(("v1", path))
    return out


def available_bytes(*, root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc"),
                    env: dict[str, str] | None = None) -> tuple[int, str]:
    """(bytes this process may still use, where that number comes from). The tightest of: each cgroup from this
    process's up to the root (limit less usage: a parent's limit applies too), and MemAvailable."""
    env = os.environ if env is None else env
    if env.get(OVERRIDE, "").isdigit():
        return int(env[OVERRIDE]), f"${OVERRIDE}"
    found: list[tuple[int, str]] = []
    meminfo = {line.split(":")[0]: line.split()[1] for line in _text(proc / "meminfo").splitlines() if ":" in line}
    if meminfo.get("MemAvailable", "").isdigit():
        found.append((int(meminfo["MemAvailable"]) * 1024, "MemAvailable in /proc/meminfo"))
    for version, path in _own_cgroups(_text(proc / "self" / "cgroup")):
        here = (root if version == "v2" else root / "memory") / path.lstrip("/")
        limit_name, usage_name = ("memory.max", "memory.current") if version == "v2" else \
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        while True:
            limit, usage = _read_int(here / limit_name), _read_int(here / usage_name)
            if limit is not None and limit < 2 ** 60:                 # v1 writes "no limit" as ~2^63
                found.append((max(0, limit - (usage or 0)), f"the cgroup limit {here / limit_name} less its usage"))
            if here == root or here.parent == here or root not in here.parents:
                break
            here = here.parent
    if not found:
        return 2 ** 62, "nothing readable (no cgroup limit, no /proc/meminfo)"
    return min(found)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def refuse_if_too_big(estimate: Estimate, available: tuple[int, str], *, numel: int, what: str) -> None:
    """MemoryError, before any process starts, when the estimate exceeds the memory available."""
    have, source = available
    if estimate.total <= have:
        return
    raise MemoryError(f"{what} on {numel:,} parameters ({4 * numel / MiB:.1f} MiB a copy) would need about "
                      f"{estimate.total / MiB:,.0f} MiB at its peak ({estimate.parent / MiB:,.0f} MiB here, "
                      f"{estimate.per_rank / MiB:,.0f} MiB in each of {estimate.world_size} ranks; "
                      f"wmdist/yours/footprint.py lists the copies), more than the {have / MiB:,.0f} MiB available "
                      f"({source}). Use a smaller model (fewer or narrower layers) or fewer ranks")


def release_freed_memory() -> None:
    """Hand the freed heap back to the system (glibc's malloc_trim; nothing elsewhere): a phase's freed tensors
    are otherwise kept for the next one, and the peak grows phase after phase."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
