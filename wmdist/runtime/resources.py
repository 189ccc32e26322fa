"""What a rank process keeps across calls: its process groups (by rank tuple) and its receive buffers.

Process groups are an OS resource (gloo opens sockets and threads for each),
so they belong to the rank *process*, not to one call: a warm pool (rank.py)
and a torchrun process (launch.py) each make one `RankResources` and hand it
to every Context they build, and a warm rank answers the hundredth request
for the same group from its cache instead of piling up gloo groups.
`wmdist.comm.Context` only holds one (ctx.group_of, ctx.scratch ask it).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


# new_group looks its naming function up in torch's module at call time; swapping that function for one
# call is process-wide, so two threads of one process (under torchrun) must not make groups at once.
_NAMING = threading.Lock()
# torch's own new_group, whatever later replaces dist.new_group (a rank answers a plain one from its cache).
_torch_new_group = dist.new_group


def group_name(ranks: tuple[int, ...]) -> str:
    """The store prefix of the cached group of these global ranks: a function of the ranks alone."""
    return "wmdist-group-" + "-".join(map(str, ranks))


def new_named_group(ranks: tuple[int, ...], *, timeout: timedelta | None = None) -> dist.ProcessGroup:
    """dist.new_group(ranks, use_local_synchronization=True), named by `group_name(ranks)` only.

    torch (2.13) names such a group from its ranks *and* the number of groups
    this process has made so far, and the members rendezvous in the store under
    that name. Members with different histories (rank 0 made group (0, 1) in an
    earlier call, rank 2 did not) then wait under different names for ever. A
    name from the ranks alone makes every member meet under the same one,
    whatever groups each made before, in this call or an earlier one.
    """
    original = getattr(c10d, "_process_group_name", None)
    if original is None:        # another torch: its own naming (history-dependent names may return)
        return _torch_new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
    with _NAMING:
        c10d._process_group_name = lambda _ranks, use_hashed_name: c10d.GroupName(group_name(ranks))
        try:
            return _torch_new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
        finally:
            c10d._process_group_name = original


@dataclass
class RankResources:
    """Per-process resources reused across calls: subgroups by rank tuple, receive buffers by size."""
    groups: dict[tuple[int, ...], dist.ProcessGroup] = field(default_factory=dict)
    buffers: dict[tuple[torch.dtype, str], torch.Tensor] = field(default_factory=dict)
    timeout: timedelta | None = None         # for the groups it makes (None: torch's default)

    def group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        """The gloo/NCCL group of these global ranks, created on first use (members only)."""
        if ranks not in self.groups:
            # Local synchronization: only the members of a group take part in creating it, so a rank
            # never waits for groups it is not in; the name depends on the ranks alone (new_named_group).
            # Overlapping groups are safe when every rank asks for its groups in one global order.
            self.groups[ranks] = new_named_group(ranks, timeout=self.timeout)
        return self.groups[ranks]

    def scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A reusable 1-D receive buffer of at least `numel` elements (grown, never shrunk).

        Fresh memory is not free: first-touch page faults on a 16 MiB buffer
        cost about as much as sending it, so rings receive into this one.
        """
        key = (dtype, str(device))
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self.buffers[key] = buf
        return buf[:numel]
