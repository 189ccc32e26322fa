"""What a rank function receives: who it is, its ledger, and its process groups.

Process groups are an OS resource, so they live in the rank process's
resources (`wmdist.runtime.resources.RankResources`, which outlives one call:
the runtime makes it and hands it to every Context). comm sits below the
runtime, so it names only what it needs of them (`ProcessResources`);
everything that is demo state (the ledger) is made fresh for every call.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Protocol

import torch
import torch.distributed as dist

from wmdist.comm.ledger import Ledger

if TYPE_CHECKING:
    from wmdist.comm.mesh import Mesh


class ProcessResources(Protocol):
    """What a Context asks of its rank process's resources (wmdist.runtime.resources.RankResources is one)."""
    groups: dict[tuple[int, ...], dist.ProcessGroup]

    def group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        """The process group of these global ranks, made on first use."""
        ...

    def scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A reusable receive buffer of `numel` elements."""
        ...


@dataclass(kw_only=True)
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
    resources: ProcessResources | None = field(default=None, repr=False)
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
        resources = self._resources()
        if key in resources.groups:
            return resources.groups[key]
        # Making a group waits for every member: noted like a communication, so a hang here is named.
        self.ledger.enter(f"create group {list(key)} (every member must ask for it)")
        group = resources.group(key)
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
        return self._resources().scratch(numel, dtype, self.device)

    def _resources(self) -> ProcessResources:
        if self.resources is None:
            raise ValueError("this Context has no process resources (groups, buffers): the runtime gives every "
                             "Context it makes its rank's; pass resources=wmdist.runtime.RankResources() to one "
                             "made by hand")
        return self.resources
