"""How many collectives a rank posted on each of its groups in one call, those torch posts from C++ included.

torch keeps a sequence number per process group, and gloo advances it for every op posted on the group,
from Python or from C++ (measured with torch 2.13: +1 per collective, per send and per receive, +2 for a
two-rank monitored_barrier, +3 for DDP's constructor, +1 per bucket in DDP's backward). MessageAudit
reads it before and after each op it sees; what an op it sees adds beyond one collective (a send, a
receive, monitored_barrier's own messages) is that group's *excess*, so

    slots = sequence number now - at the start of the call - excess

counts every collective on the group, the hidden ones (DDP's reducer, `_broadcast_coalesced`) included.
A group torch cannot give the number of is counted by what Python sees alone. Groups are known by
torch's name (unique in a process, and the same on every member: it is where the members meet in the
store) and their global ranks.
"""
from __future__ import annotations

import zlib
from collections import deque
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from wmdist.runtime.matching import MAX_RECORDS, GroupKey, GroupPosts
from wmdist.runtime.stuck import group_id, group_mask

TAIL = 16                 # the last collectives kept per group, to name the one another rank lacks


def sequence_number(group: Any) -> int | None:
    """torch's count of the ops posted on `group` in this process (None where it cannot say)."""
    try:
        return int(group._get_sequence_number_for_group())
    except (AttributeError, RuntimeError, ValueError, TypeError):
        return None


class GroupCount:
    """One group's collectives in this call, on this rank."""

    def __init__(self, key: GroupKey, group: Any, base: int | None):
        self.key, self.group, self.base = key, group, base
        self.gid, self.mask = group_id(key[0]), group_mask(key[1])
        self.excess = self.visible = self.crc = 0
        self.tail: deque[tuple[int, str]] = deque(maxlen=TAIL)
        self.records: list[tuple[int, int]] = []

    def slots(self, *, now: int | None = None) -> int:
        """Collectives posted on the group so far in this call (`now`: its sequence number, if just read)."""
        now = sequence_number(self.group) if now is None and self.base is not None else now
        if self.base is None or now is None:
            return self.visible
        return max(now - self.base - self.excess, self.visible)

    def seen(self, before: int | None, after: int | None, *, collective: bool) -> None:
        """An op this rank saw moved the sequence number from `before` to `after`."""
        if before is not None and after is not None:
            self.excess += after - before - (1 if collective else 0)

    def record(self, slot: int, name: str, wire: str, code: int) -> None:
        self.visible += 1
        self.crc = zlib.crc32(wire.encode(), self.crc)
        self.tail.append((slot, name))
        if len(self.records) < MAX_RECORDS:
            self.records.append((slot, code))

    def posts(self) -> GroupPosts:
        slots = self.slots()
        return GroupPosts(slots, max(0, slots - self.visible), self.crc, tuple(self.tail), tuple(self.records))


class GroupCounts:
    """Every group's GroupCount for one call: started with each known group's sequence number."""

    def __init__(self) -> None:
        self._start = {name: sequence_number(group) for group, name in self._registered()}
        self._by_name: dict[str, GroupCount | None] = {}
        self._by_id: dict[int, GroupCount | None] = {}
        self._seen = -2                          # torch's group count at the last full look (-2: never looked)

    @staticmethod
    def _registered() -> list[tuple[Any, str]]:
        try:
            return [(group, c10d._world.pg_names.get(group) or group.group_name) for group in list(c10d._world.pg_map)]
        except Exception:     # another torch's internals: count what Python sees
            return []

    def of(self, group: Any) -> GroupCount | None:
        """The count of `group` (None: a group torch cannot map to global ranks, which is not counted)."""
        found = self._by_id.get(id(group), False)
        if found is not False:
            return found
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
            name = group.group_name
        except (ValueError, RuntimeError, AttributeError):
            self._by_id[id(group)] = None
            return None
        if name not in self._by_name:
            # A group made during the call starts at 0; torch made it then, so nothing before counts.
            base = self._start.get(name, 0) if sequence_number(group) is not None else None
            self._by_name[name] = GroupCount((name, ranks), group, base)
        self._by_id[id(group)] = self._by_name[name]
        return self._by_name[name]

    def every(self) -> list[GroupCount]:
        """Every group of this process (those only torch's C++ posted on included)."""
        size = self._registry_size()
        if size != self._seen:                   # a group was made (or destroyed) since the last look
            for group, _ in self._registered():
                self.of(group)
            self._seen = size
        return [count for count in self._by_name.values() if count is not None]

    @staticmethod
    def _registry_size() -> int:
        try:
            return len(c10d._world.pg_map)
        except Exception:     # another torch's internals: look every time
            return -1

    def table(self) -> dict[int, tuple[int, int]] | None:
        """{gid: (mask, slots)} of every group, for a board (None: a group past the board's ranks)."""
        out = {}
        for count in self.every():
            if count.mask is None:
                return None
            out[count.gid] = (count.mask, count.slots())
        return out

    def posted(self) -> dict[GroupKey, GroupPosts]:
        """What this rank posted on each group it posted on in this call."""
        return {c.key: p for c in self.every() for p in [c.posts()] if p.slots or c.visible}
