"""Shared test helpers: which processes are alive, so tests can prove none is left behind."""
from __future__ import annotations

import socket

import psutil
import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pids: list[int]) -> list[int]:
    """The pids among `pids` that still exist and are not zombies."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def descendants() -> set[int]:
    """Every live process below this one (forkserver, resource tracker and ranks)."""
    return set(alive([p.pid for p in psutil.Process().children(recursive=True)]))


@pytest.fixture
def no_leftover_ranks():
    """Fail the test if it leaves a process behind once all pools are shut down."""
    from wmdist import runtime as launch

    launch.shutdown()
    before = descendants()
    yield
    launch.shutdown()
    extra = descendants() - before
    # The forkserver and resource tracker start once per interpreter and stay; they are not ranks.
    extra = {p for p in extra if "forkserver" not in " ".join(psutil.Process(p).cmdline())
             and "resource_tracker" not in " ".join(psutil.Process(p).cmdline())}
    assert not extra, f"processes left behind: {extra}"


@pytest.fixture
def one_thread():
    """One intra-op thread in the test process, as in every rank: tiny matrices gain nothing from a
    second thread, and on a shared 2-core machine it only contends with the ranks."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
