"""What a rank function receives: who it is, its ledger, and its process groups.

Process groups are an OS resource (gloo opens sockets and threads for each),
so they live in `RankResources`, which belongs to the rank *process* and
outlives one call: a warm pool answers the hundredth request for the same
group from its cache instead of piling up gloo groups. Everything that is
demo state (the ledger) is made fresh for every call.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Iterable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from wmdist.comm.ledger import Ledger

if TYPE_CHECKING:
    from wmdist.comm.mesh import Mesh


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


@dataclass
class Context:
    """What a rank function receives: who it is and how to talk.

    `group` is the default process group for counted ops (None: the world);
    `ctx.group_of(ranks)` and `ctx.axis_group(mesh, axis)` give cached subgroups;
    `ctx.along(mesh, axis)` is this rank seen from one mesh axis. `phase_prefix`
    starts every phase recorded through this context ("tp/" on a tp view).
    """
    rank: int
    world_size: int
    ledger: Ledger
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "gloo"
    group: dist.ProcessGroup | None = None
    resources: RankResources = field(default_factory=RankResources, repr=False)
    phase_prefix: str = ""

    def group_of(self, ranks: Iterable[int]) -> dist.ProcessGroup:
        """The process group of these global ranks, cached on this rank's process.

        Only the members call it (every member with the same ranks). Asking
        again, in this call or the next, returns the same group.
        """
        key = tuple(sorted(int(r) for r in ranks))
        if not key or key[0] < 0 or key[-1] >= self.world_size or len(set(key)) != len(key):
            raise ValueError(f"ranks must be distinct integers in [0, {self.world_size}), got {list(ranks)}")
        if self.rank not in key:
            raise ValueError(f"rank {self.rank} asked for group {list(key)} it is not a member of")
        if key in self.resources.groups:
            return self.resources.groups[key]
        # Making a group waits for every member: noted like a communication, so a hang here is named.
        self.ledger.enter(f"create group {list(key)} (every member must ask for it)")
        group = self.resources.group(key)
        self.ledger.leave()
        return group

    def axis_group(self, mesh: Mesh, axis: str) -> dist.ProcessGroup:
        """This rank's group along one mesh axis (the ranks that differ only in that coordinate)."""
        if mesh.world_size != self.world_size:
            raise ValueError(f"mesh {mesh} has {mesh.world_size} ranks, this run has {self.world_size}")
        return self.group_of(mesh.axis_ranks(self.rank, axis))

    def along(self, mesh: Mesh, axis: str) -> Context:
        """This rank seen from one mesh axis: rank = its coordinate, world_size = the axis size, group = the axis group.

        The view shares this context's ledger and resources, and every phase
        recorded through it starts with "<axis>/", so a function written for
        "all ranks of the run" (a ring all-reduce, ring attention, a pipeline's
        sends) runs unchanged on one axis of a mesh and its bytes are counted
        under that axis. Call group_of / axis_group on the run's own context:
        they take global ranks.
        """
        group = self.axis_group(mesh, axis)
        return replace(self, rank=mesh.coords(self.rank)[axis], world_size=mesh.size(axis), group=group,
                       phase_prefix=f"{self.phase_prefix}{axis}/")

    def scratch(self, numel: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A reusable receive buffer (see RankResources.scratch); its contents are garbage."""
        return self.resources.scratch(numel, dtype, self.device)
