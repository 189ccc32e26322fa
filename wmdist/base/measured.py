"""Numbers a learner measured in one chapter that a later chapter builds on, kept between kernels.

Chapter 01 measures how much of the data-parallel all-reduce its gradient buckets hid under the
backward pass; chapter 09's placement model takes that share as `dp_hidden`. `remember` writes
a value with where it came from to a small JSON file (WMDIST_MEASURED, default
~/.cache/wmdist/measured.json); `recall` reads it back, or, when chapter 01 was not run here
(or the file is unreadable), falls back to the value stored with the course and says so, so a
reader always knows which number the model used. Pure file I/O: no torch, no processes.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

# KeptValue and stored with the course, for a learner who has not run chapter 01 here: the share of
# dp-buckets' all-reduce time hidden under backward with 16 KiB buckets on 4 local ranks (the median over
# ranks, buckets.hidden_share), on the busy 2-core machine the course was built on: 0.2 %, 6.5 % and 10 %
# in three runs, 6.5 % the median. Refreshed by hand, never at run time.
STORED = {"dp_hidden": (0.065, "stored with the course: chapter 01's dp-buckets on 4 ranks of a busy 2-core "
                               "machine (median of three runs)")}


@dataclass(frozen=True)
class KeptValue:
    """A value, where it came from, and whether it was measured here (True) or is the stored fallback."""
    value: float
    source: str
    here: bool

    def describe(self) -> str:
        """One line for a notebook: which number the model uses, and why."""
        if self.here:
            return f"{self.value:.0%}, measured on this machine ({self.source})"
        return f"{self.value:.0%}, {self.source}; run chapter 01 to use your own"


def default_path() -> Path:
    """Where the values live: $WMDIST_MEASURED, else ~/.cache/wmdist/measured.json."""
    return Path(os.environ.get("WMDIST_MEASURED") or Path.home() / ".cache" / "wmdist" / "measured.json")


def _share(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a share from 0 to 1, got {value!r}")
    return value


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(name: str, value: float, *, source: str, path: Path | None = None) -> KeptValue:
    """Keep `value` (a share from 0 to 1) under `name`, with its source, for a later chapter; return it."""
    if name not in STORED:
        raise ValueError(f"name must be one of {sorted(STORED)}, got {name!r}")
    path = path or default_path()
    data = _read(path)
    data[name] = {"value": _share(name, value), "source": str(source)}
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(f".{os.getpid()}.tmp")
    aside.write_text(json.dumps(data, indent=1))
    os.replace(aside, path)                      # all at once: a reader never sees half a file
    return KeptValue(data[name]["value"], data[name]["source"], True)


def recall(name: str, *, path: Path | None = None) -> KeptValue:
    """The value kept under `name` on this machine, or the course's stored one (here=False) if there is none."""
    if name not in STORED:
        raise ValueError(f"name must be one of {sorted(STORED)}, got {name!r}")
    entry = _read(path or default_path()).get(name)
    try:
        return KeptValue(_share(name, entry["value"]), str(entry["source"]), True)
    except (TypeError, KeyError, ValueError):
        value, source = STORED[name]
        return KeptValue(value, source, False)
