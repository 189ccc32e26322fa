"""wmdist: learn distributed training of world models by running it on real processes.

`wmdist.run`, `wmdist.Context` and the rest below are imported on first use, not here: they
import torch (seconds on a busy machine), which `wmdist --help`, `wmdist list` and the other
commands that start no rank need not pay for.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wmdist.comm import Context, Ledger, Mesh
    from wmdist.runtime import RankFailure, run, shutdown

_HOME = {"Context": "wmdist.comm", "Ledger": "wmdist.comm", "Mesh": "wmdist.comm",
         "RankFailure": "wmdist.runtime", "run": "wmdist.runtime", "shutdown": "wmdist.runtime"}
__all__ = ["Context", "Ledger", "Mesh", "RankFailure", "run", "shutdown"]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    """`wmdist.run` and the other public names, imported from their home module the first time one is used."""
    if name not in _HOME:
        raise AttributeError(f"module 'wmdist' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
