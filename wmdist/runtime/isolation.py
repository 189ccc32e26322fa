"""Process-wide settings a rank function can change, put back after every call.

A warm rank serves many calls, so whatever one call sets for the whole process
would otherwise carry into the next: `torch.set_default_dtype(torch.float64)`
in one cell doubles the bytes the next demo sends, `torch.set_grad_enabled(False)`
breaks the next training step, a seed set once shifts every later draw.
`RankState.capture()` reads these settings when the rank has started;
`restore()` puts them back after each call, so every call starts from the same
state, and names what cannot be undone in place (the pool is then restarted).

Process groups and receive buffers are deliberately not here: they are OS
resources kept across calls (see `wmdist.runtime.resources.RankResources`).
"""
from __future__ import annotations

import ctypes
import operator
import os
import random
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

_CPU = torch.device("cpu")


@dataclass(kw_only=True, frozen=True)
class Setting:
    """One process-wide setting: how to read it, how to put it back, and how to tell it changed.

    `same(current, saved)` compares a fresh `get()` with what `capture()` saved
    (default: the same reading, compared with ==). `same=None` puts the saved
    value back after every call without reading: cheaper where reading costs
    more than writing (the torch and Python RNG states).
    """
    name: str
    get: Callable[[], Any]
    put: Callable[[Any], Any]
    same: Callable[[Any, Any], bool] | None = operator.eq
    capture: Callable[[], Any] | None = None


def _environ() -> dict:
    # os.environ's own (bytes) mapping copies and compares in microseconds; decoding it all takes 50.
    return dict(getattr(os.environ, "_data", os.environ))


def _text(value: bytes | str) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _put_environ(saved: dict) -> None:
    current = _environ()
    for key in current.keys() - saved.keys():
        del os.environ[_text(key)]
    for key, value in saved.items():
        if current.get(key) != value:
            os.environ[_text(key)] = _text(value)


def _put_default_device(device: torch.device) -> None:
    # Setting "cpu" explicitly would push a device mode that slows every torch call; None removes it.
    torch.set_default_device(None if device == _CPU else device)


def _put_warning_filters(filters: list) -> None:
    warnings.filters[:] = filters
    mutated = getattr(warnings, "_filters_mutated", None)   # drop the cache of already-decided warnings
    if mutated is not None:
        mutated()


def _numpy_rng_bytes(generator: Any = np.random.mtrand._rand._bit_generator) -> bytes:
    """The raw state of numpy's global MT19937: read in 2 us, where get_state() takes 90.

    The state is numpy's C struct {uint32 key[624]; int pos}; every draw moves
    `pos`, so equal bytes mean nothing drew from it. The default argument
    keeps the generator alive, so its address stays valid.
    """
    return ctypes.string_at(generator.ctypes.state_address, 624 * 4 + 4)


SETTINGS = (
    Setting(name="default device", get=torch.get_default_device, put=_put_default_device),
    Setting(name="default dtype", get=torch.get_default_dtype, put=torch.set_default_dtype),
    Setting(name="grad mode", get=torch.is_grad_enabled, put=torch.set_grad_enabled),
    Setting(name="torch RNG state", get=torch.get_rng_state, put=torch.set_rng_state, same=None),
    Setting(name="numpy RNG state", get=_numpy_rng_bytes, put=lambda v: np.random.set_state(v[1]), same=lambda now, v: now == v[0],
            capture=lambda: (_numpy_rng_bytes(), np.random.get_state())),
    Setting(name="python RNG state", get=random.getstate, put=random.setstate, same=None),
    Setting(name="torch threads", get=torch.get_num_threads, put=torch.set_num_threads),
    Setting(name="working directory", get=os.getcwd, put=os.chdir),
    Setting(name="environment variables", get=_environ, put=_put_environ),
    Setting(name="deterministic algorithms", get=lambda: (torch.are_deterministic_algorithms_enabled(),
                                                 torch.is_deterministic_algorithms_warn_only_enabled()),
            put=lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    Setting(name="anomaly detection", get=lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            put=lambda v: torch.set_anomaly_enabled(*v)),
    Setting(name="float32 matmul precision", get=torch.get_float32_matmul_precision, put=torch.set_float32_matmul_precision),
    Setting(name="CPU autocast", get=lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
            put=lambda v: (torch.set_autocast_enabled("cpu", v[0]), torch.set_autocast_dtype("cpu", v[1]))),
    # torch has no getter for flush-denormal; a rank starts with it off (torch's default), so it is reset to off.
    Setting(name="flush denormal", get=lambda: False, put=torch.set_flush_denormal, same=None),
    Setting(name="torch print options", get=lambda: dict(vars(torch._tensor_str.PRINT_OPTS)),
            put=lambda v: torch.set_printoptions(**v)),
    Setting(name="numpy print options", get=np.get_printoptions, put=lambda v: np.set_printoptions(**v)),
    Setting(name="numpy floating-point errors", get=np.geterr, put=lambda v: np.seterr(**v)),
    Setting(name="warning filters", get=lambda: list(warnings.filters), put=_put_warning_filters),
    Setting(name="sys.path", get=lambda: list(sys.path), put=lambda v: sys.path.__setitem__(slice(None), v)),
    Setting(name="recursion limit", get=sys.getrecursionlimit, put=sys.setrecursionlimit),
    Setting(name="sys.stdout", get=lambda: sys.stdout, put=lambda v: setattr(sys, "stdout", v), same=operator.is_),
    Setting(name="sys.stderr", get=lambda: sys.stderr, put=lambda v: setattr(sys, "stderr", v), same=operator.is_),
)


def _mode_stack_depth() -> int:
    depth = getattr(torch._C, "_len_torch_function_stack", None)
    return depth() if depth is not None else 0


# State that cannot be put back from Python: (what, how to read it). A change restarts the pool.
IRREVERSIBLE: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("an open torch function mode (e.g. `with torch.device(...)` entered and never left)", _mode_stack_depth),
    ("inference mode left on", torch.is_inference_mode_enabled),
    ("torch inter-op threads", torch.get_num_interop_threads),
    ("the default process group", dist.is_initialized),
)


@dataclass
class RankState:
    """The settings of a rank process as they were when it started (see the module docstring)."""
    values: dict[str, Any]
    fixed: dict[str, Any]

    @classmethod
    def capture(cls) -> RankState:
        return cls({s.name: (s.capture or s.get)() for s in SETTINGS}, {name: read() for name, read in IRREVERSIBLE})

    def restore(self) -> list[str]:
        """Put every setting back; return what could not be (empty when the rank is as it started)."""
        lost = []
        for s in SETTINGS:
            try:
                saved = self.values[s.name]
                if s.same is None or not s.same(s.get(), saved):
                    s.put(saved)
            except Exception as err:    # e.g. the saved working directory was deleted
                lost.append(f"{s.name} ({type(err).__name__}: {err})")
        lost += [name for name, read in IRREVERSIBLE if read() != self.fixed[name]]
        return lost
