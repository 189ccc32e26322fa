"""Process groups a rank function makes with torch's own API: reused where possible, found where not.

gloo opens sockets and threads for every group, and keeps them for the life of
the process. Torch's tutorials make a group with `dist.new_group(ranks)` inside
the training function, so on a warm rank each call would add one (measured on
rank 0 over 50 calls: 26 -> 376 file descriptors, 8 -> 158 threads). Inside a
rank, a plain `dist.new_group(ranks)` (no timeout, backend or options) is
therefore answered from the rank's cached groups (the same as
`ctx.group_of(ranks)`; every rank still calls it, as torch requires, but only
the members take part). Groups made any other way (options, `new_subgroups`,
a DeviceMesh over a subset) and cached groups destroyed by the call are found
after it, and the pool is replaced with a PoolRestartWarning that says why.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from wmdist.comm import Ledger
from wmdist.runtime.resources import RankResources


def route_new_group(resources: RankResources, world_size: int, ledger: Callable[[], Ledger | None]) -> None:
    """Answer a plain dist.new_group in this process from `resources` (call once per rank process).

    `ledger()` is the current call's ledger (None between calls): making a
    group waits for every member, so it is noted as the rank's last op.
    """
    original = c10d.new_group
    signature = inspect.signature(original)

    def new_group(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)      # torch's own error
        given = {k: v for k, v in bound.arguments.items() if k not in ("ranks", "use_local_synchronization",
                                                                          "group_desc", "sort_ranks")}
        ranks = bound.arguments.get("ranks")
        key = tuple(range(world_size)) if ranks is None else tuple(sorted(ranks))
        plain = all(v is None for v in given.values()) and bound.arguments.get("sort_ranks", True) \
            and len(set(key)) == len(key) and all(isinstance(r, int) and 0 <= r < world_size for r in key)
        if not plain:
            return original(*args, **kwargs)      # found after the call (groups_lost)
        if dist.get_rank() not in key:
            return dist.GroupMember.NON_GROUP_MEMBER
        if key in resources.groups:
            return resources.groups[key]
        current = ledger()
        if current is not None:
            current.enter(f"dist.new_group({list(key)}) (every member must call it)")
        group = resources.group(key)
        if current is not None:
            current.leave()
        return group

    c10d.new_group = dist.new_group = new_group


def groups_lost(resources: RankResources) -> list[str]:
    """What a call did to this process's groups that a warm rank cannot keep: [] when nothing."""
    registered = c10d._world.pg_map
    destroyed = [list(key) for key, group in resources.groups.items() if group not in registered]
    lost = []
    if destroyed:
        lost.append(f"the rank's process groups (it destroyed the cached group(s) {destroyed} with "
                    "dist.destroy_process_group; a later call could not make them again under the same name)")
    extra = len(registered) - 1 - (len(resources.groups) - len(destroyed))
    if extra > 0:
        lost.append(f"the rank's process groups (it made {extra} group(s) outside the rank's cache: dist.new_group "
                    "with a timeout, backend or options, new_subgroups, a DeviceMesh over some ranks; gloo keeps "
                    "every group's sockets and threads for the life of the process, so each call would add more; "
                    "ctx.group_of(ranks), or a plain dist.new_group(ranks), reuses one)")
    return lost
