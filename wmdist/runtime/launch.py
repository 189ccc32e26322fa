"""Run one function on N ranks and get back each rank's result.

Locally, `run` starts N processes on gloo (127.0.0.1, a file rendezvous, no
fixed port) and keeps them warm: the processes for a world size are started
once, from a forkserver that has torch preloaded, and reused, so a repeated
call from a notebook costs milliseconds. Functions defined in a notebook cell
or a test body are shipped by value with cloudpickle.

Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR set) the same call runs the
function in the already-launched process instead, on gloo or NCCL, any
number of nodes: scaling out is torch.distributed's job, not ours.

Every call starts from the same rank state: what a call sets process-wide is
put back, and a message it leaves unmatched fails that call. Any failure (a
rank raises, exits, is killed, outlives the timeout or leaves a message
unmatched) ends the call with one RankFailure naming the rank, its traceback
or signal and the last communication it entered; the pool is torn down, so
the next call starts clean.
"""
from __future__ import annotations

import atexit
import contextlib
import inspect
import math
import multiprocessing as mp
import numbers
import os
import signal
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator

import cloudpickle
import torch
import torch.distributed as dist

from wmdist.comm import Context, Ledger
from wmdist.runtime import cleanup
from wmdist.runtime.failures import RankFailure
from wmdist.runtime.pool import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, Pool
from wmdist.runtime.resources import RankResources
from wmdist.runtime.warm import WarmPools

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_LOCAL_WORLD", "MAX_TIMEOUT_S", "MAX_WARM_RANKS", "Pool", "RankFailure", "run",
           "shutdown", "under_torchrun", "warm_pids"]

MAX_LOCAL_WORLD = 32
# Warm ranks kept per process, least recently used pool dropped first: one largest course demo (8 ranks).
# At 16, chapter 11 kept its all-reduce sweep's 2- and 4-rank pools beside the 8-rank one, and the twelve
# chapters' kept kernels summed 2,094 MiB of PSS in Binder's 2,048 (tests/test_binder_session.py); at 8, 1,987.
MAX_WARM_RANKS = 8

_WARM = WarmPools(MAX_WARM_RANKS)
# Under torchrun this process is the rank: its subgroups and buffers outlive one call, like a pool rank's.
_torchrun_resources: list[RankResources] = []


def shutdown() -> None:
    """Stop every warm pool (also done automatically when the interpreter exits)."""
    _WARM.shutdown()


atexit.register(shutdown)
atexit.register(cleanup.remove_empty_inductor_dirs, cleanup.inductor_dirs())    # see its docstring


def warm_pids() -> dict[int, list[int]]:
    """Process ids of the warm pools, by world size (for tests and benchmarks)."""
    return _WARM.pids()


# --- validation and torchrun ------------------------------------------------------------

def under_torchrun() -> bool:
    """True inside a process launched by torchrun (or any launcher setting its variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def as_world_size(value: Any) -> int:
    """`value` as an int world size: ints, numpy integers and 0-dim integer tensors (no bools), >= 1."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.dtype.is_floating_point \
            and not value.dtype.is_complex and value.dtype != torch.bool:
        value = int(value.item())
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"world_size must be a positive integer, got {value!r}")
    return int(value)


def _validate(fn: Any, world_size: Any, args: tuple, kwargs: dict, timeout: Any) -> int:
    """Check everything before any process starts; return the world size as an int."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking (ctx, ...), got {type(fn).__name__}")
    world_size = as_world_size(world_size)
    if not under_torchrun():
        cleanup.require_short_temp_dir()
    if not under_torchrun() and world_size > MAX_LOCAL_WORLD:
        raise ValueError(f"world_size={world_size} is more local ranks than wmdist starts "
                         f"(at most {MAX_LOCAL_WORLD}); use torchrun for larger jobs")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not math.isfinite(timeout) \
            or not 0 < timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} "
                         f"(two hours), got {timeout!r}")
    try:
        inspect.signature(fn).bind(None, *args, **kwargs)
    except TypeError as err:
        raise TypeError(f"fn {getattr(fn, '__qualname__', fn)!r} cannot be called as fn(ctx, *args, **kwargs) "
                        f"with these arguments: {err}") from None
    except ValueError:
        pass   # builtins without a signature: let the call decide
    return world_size


def _refuse_inside_a_rank() -> None:
    name = mp.current_process().name
    if name.startswith("wmdist-rank"):
        raise RuntimeError(f"wmdist.run was called inside a rank function (this is {name[7:]}): ranks cannot "
                           "start ranks. Call wmdist.run from the notebook or script; inside the rank function, "
                           "work with the other ranks through ctx (the counted ops in wmdist.comm, and "
                           "ctx.group_of(ranks) for a subset of them).")


def _register_by_value(fn: Callable[..., Any]) -> None:
    """Ship fn's module by value unless it is an installed package the ranks can import.

    Test modules and scripts are not importable in a rank (their directory is
    not on the rank's path), so their functions travel as code.
    """
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None or module.__name__ == "__main__":
        return   # cloudpickle already ships __main__ by value
    top = module.__name__.split(".")[0]
    if top in ("wmdist", "torch", "numpy", "builtins") or top in sys.stdlib_module_names:
        return
    with contextlib.suppress(Exception):
        cloudpickle.register_pickle_by_value(module)


def _run_torchrun(fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict, timeout: float) -> list[Any]:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(f"world_size={world_size} but torchrun started WORLD_SIZE={env_world}")
    if not dist.is_initialized():
        backend = os.environ.get("WMDIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
    backend = dist.get_backend()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    rank = dist.get_rank()
    if not _torchrun_resources:
        _torchrun_resources.append(RankResources())
    resources = _torchrun_resources[0]
    resources.timeout = timedelta(seconds=timeout)        # groups made during this call
    ctx = Context(rank=rank, world_size=env_world, ledger=Ledger(rank=rank), device=device, backend=backend, resources=resources)
    gathered: list[Any] = [None] * env_world
    with _within(timeout, rank, resources):
        result = fn(ctx, *args, **kwargs)
        dist.all_gather_object(gathered, result)
    return gathered


@contextlib.contextmanager
def _within(timeout: float, rank: int, resources: RankResources) -> Iterator[None]:
    """Bound one torchrun call by `timeout`: its collectives time out then, and so does Python code.

    The process groups (the world and the cached subgroups) get the call's
    timeout for its duration, so a peer that never comes makes the waiting
    op raise instead of waiting gloo's 30 minutes (NCCL's 10). A rank still
    in Python code at the deadline (asleep, or looping) is interrupted with
    TimeoutError by SIGALRM, when the call runs in the main thread and
    SIGALRM is not otherwise in use; torchrun then ends the other ranks.
    """
    groups = [dist.group.WORLD, *resources.groups.values()]
    before = [_group_timeout(g) for g in groups]
    for group in groups:
        group.set_timeout(timedelta(seconds=timeout))
    alarm = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"rank {rank} did not finish within the call's timeout of {timeout:g} s")

    if alarm:
        signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        for group, previous in zip(groups, before):
            with contextlib.suppress(Exception):
                group.set_timeout(previous)
        resources.timeout = None


def _group_timeout(group: dist.ProcessGroup) -> timedelta:
    """The timeout a group's ops use now (torch keeps it in its backend's options), or torch's default."""
    with contextlib.suppress(Exception):
        return group._get_backend(torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")).options._timeout
    return dist.default_pg_timeout


def run(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = DEFAULT_TIMEOUT_S,
        **kwargs: Any) -> list[Any]:
    """Run fn(ctx, *args, **kwargs) on `world_size` ranks; return results in rank order.

    `timeout` (seconds per call, at most MAX_TIMEOUT_S) is the launcher's own
    option; every other keyword goes to fn. Bad arguments are rejected before
    any process starts. Safe to call from several threads.
    """
    _refuse_inside_a_rank()
    world_size = _validate(fn, world_size, args, kwargs, timeout)
    if under_torchrun():
        return _run_torchrun(fn, world_size, args, kwargs, float(timeout))
    _register_by_value(fn)
    try:
        cloudpickle.dumps((fn, args, kwargs))
    except Exception as err:
        raise TypeError(f"fn or its arguments cannot be sent to the ranks: {err}") from None
    return _WARM.run(world_size, fn, args, kwargs, float(timeout))
