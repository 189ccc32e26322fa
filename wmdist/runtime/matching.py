"""The rules that say a call's posts cannot all be matched: at the end of the call, and while it runs.

A group is one communicator: torch's group name with its global ranks (two groups with the same members
are two queues; gloo pairs the n-th collective of one member with the n-th of every other member *on
that group*). A member's collectives on a group are its **slots**, counted from torch's own per-group
sequence number (messages.py), so those torch posts from C++ where Python never sees them (DDP's
reducer, `_broadcast_coalesced`, the default comm hook Join's shadow passes run) are counted too; the
ones Python sees (ProcessGroup's methods, functional collectives) are *visible* and carry a name and an
op code (routes.py), the others are *hidden*. The rule (`unmatched_collectives`):

1. every member posts the same number of slots on each group (else one is left over for a later call);
2. at each slot that two members both see, their ops pair on the wire (wire class, reduce op, root);
   with no hidden slot on the group, the whole sequence of wire classes agrees too (a checksum).

So a joined rank's visible shadow all-reduce may face its partner's hidden one (torch's Join), and
nothing is compared that only one side could see. Only the first MAX_RECORDS visible slots per group
are compared position by position. The running checks (`behind_finished`, `disagreeing`, `deadlocked`,
used by stuck.stuck on the ranks' boards) use the same slots. Sends and receives are matched per pair of
ranks (`unmatched`, `mismatched_sizes`: messages.py says why).
"""
from __future__ import annotations

from typing import NamedTuple

from wmdist.runtime.stuck import ANY, COLLECTIVE, RECEIVE, SEND, Snapshot, group_id, group_mask, unpack
from wmdist.runtime.routes import codes_agree, describe_code

MAX_RECORDS = 1024
GroupKey = tuple[str, tuple[int, ...]]          # (torch's group name, its global ranks)
ADVICE = ("Every rank must post the same collectives and matching sends and receives (does an "
          "`if ctx.rank == ...` leave one out?)")


class GroupPosts(NamedTuple):
    """One member's collectives on one group in one call."""
    slots: int                                  # all of them, hidden ones included
    hidden: int                                 # those torch posted from C++ (no name, no op code)
    crc: int                                    # checksum of the visible ones' wire classes, in order
    tail: tuple[tuple[int, str], ...]           # the last visible ones: (slot, name)
    records: tuple[tuple[int, int], ...]        # the first MAX_RECORDS visible ones: (slot, op code)


EMPTY = GroupPosts(0, 0, 0, (), ())
Posted = dict[GroupKey, GroupPosts]


def describe_group(key: GroupKey, *, keys: set[GroupKey] | None = None) -> str:
    """'group [0, 1]', with torch's name when another group in `keys` has the same members."""
    name, ranks = key
    same = keys is not None and any(k[1] == ranks and k != key for k in keys)
    return f"group {list(ranks)}" + (f" (torch's group {name!r})" if same else "")


def unmatched_collectives(posted: list[Posted]) -> tuple[int, tuple[int, ...], str] | None:
    """The first group whose members' collectives cannot all have paired: (rank to blame, ranks, what), or None.

    posted[r] is rank r's Posted; a member that never used the group posted nothing on it.
    """
    n = len(posted)
    keys = {k for p in posted for k in p}
    for key in sorted(keys, key=lambda k: (k[1], k[0])):
        members = [r for r in key[1] if r < n]
        seen = {r: posted[r].get(key, EMPTY) for r in members}
        where = describe_group(key, keys=keys)
        counts = {r: seen[r].slots for r in members}
        fewest, most = min(counts.values()), max(counts.values())
        hidden = any(p.hidden for p in seen.values())
        if most > fewest:
            culprit = next(r for r in members if counts[r] == most)
            behind = [r for r in members if counts[r] == fewest]
            op = dict(seen[culprit].tail).get(fewest + 1) or next(
                (describe_code(c, key[1]) for s, c in seen[culprit].records if s == fewest + 1),
                "a collective" + (" torch posted from C++ (DDP's reducer, say)" if hidden else ""))
            how = " (counted from torch's sequence numbers, those torch posts from C++ included)" if hidden else ""
            return culprit, tuple(members), (
                f"posted {op} on {where} (its collective #{fewest + 1} there) that rank(s) "
                f"{', '.join(map(str, behind))} never posted; collectives posted on that group in this call, by rank"
                f"{how}: {counts}")
        codes = {r: dict(seen[r].records) for r in members}
        first = members[0]
        for other in members[1:]:
            for slot in sorted(codes[first].keys() & codes[other].keys()):
                a, b = codes[first][slot], codes[other][slot]
                if not codes_agree(a, b):
                    return first, tuple(members), (
                        f"and rank {other} posted different collectives as their collective #{slot} on {where}: "
                        f"rank {first} posted "
                        f"{describe_code(a, key[1])}, rank {other} {describe_code(b, key[1])} (gloo pairs them; "
                        f"do the ranks agree on the call, `src` and the reduce op?)")
        if not hidden and len({p.crc for p in seen.values()}) > 1:
            names = {r: [name for _, name in seen[r].tail] for r in members}
            return first, tuple(members), (f"and the other members of {where} posted different "
                                           f"collectives in this call (last ones, by rank: {names})")
    return None


def _finished_group(counts: tuple, gid: int, mask: int) -> GroupPosts:
    return next((p for (name, ranks), p in counts[4].items()
                 if group_id(name) == gid and group_mask(ranks) == mask), EMPTY)


def _members(mask: int) -> list[int]:
    return [i for i in range(32) if mask >> i & 1]


def _words(s: Snapshot) -> list[tuple[int, int]]:
    return [(w, at) for w, at in ((s.post, s.post_at), (s.wait, s.wait_at)) if w]


def behind_finished(boards: dict[int, Snapshot], finished: dict[int, tuple]) -> tuple[int, list[int], str] | None:
    """A pending rank's post that a finished rank, whose counts are final, can no longer match."""
    for r, s in sorted(boards.items()):
        for word, at in _words(s):
            kind, n, who = unpack(word)
            for f, counts in sorted(finished.items()):
                sent, received = counts[0], counts[1]
                if kind == COLLECTIVE and who >> f & 1:
                    have = _finished_group(counts, at >> 32, who).slots
                    mine, theirs, ranks = f"collective #{n} on group {_members(who)}", f"{have} there", _members(who)
                elif kind == RECEIVE and who == f:
                    have, mine, theirs = sent[r], f"receive #{n} from rank {f}", f"{sent[r]} send(s) to rank {r}"
                    ranks = [r, f]
                elif kind == SEND and who == f and not counts[2]:      # (a receive from any rank may match it)
                    have, mine = received[r], f"send #{n} to rank {f}"
                    theirs, ranks = f"{received[r]} receive(s) from rank {r}", [r, f]
                else:
                    continue
                if have < n:
                    return r, ranks, (f"posted its {mine}, which rank {f} can no longer match: rank {f} finished "
                                      f"the call having posted {theirs}. {ADVICE}")
    return None


def disagreeing(boards: dict[int, Snapshot], finished: dict[int, tuple]) -> tuple[int, list[int], str] | None:
    """Two ranks' n-th collectives on one group that cannot pair (a broadcast whose ranks disagree on `src`)."""
    posts: dict[tuple[int, int, int], tuple[int, int]] = {}
    for r, s in sorted(boards.items()):
        for word, at in _words(s):
            kind, n, mask = unpack(word)
            if kind != COLLECTIVE:
                continue
            theirs = [(o, c) for o, c in [posts.get((at >> 32, mask, n), (r, at & 0xFFFFFF))] if o != r]
            theirs += [(f, dict(_finished_group(counts, at >> 32, mask).records).get(n, 0))
                       for f, counts in sorted(finished.items()) if mask >> f & 1]
            for other, code in theirs:
                if code and not codes_agree(code, at & 0xFFFFFF):
                    ranks, mine = _members(mask), at & 0xFFFFFF
                    # the lower rank first, as the end-of-call check names them, whichever is still pending
                    (a, ca), (b, cb) = sorted([(r, mine), (other, code)])
                    return a, [a, b], (
                        f"and rank {b} posted different collectives as their collective #{n} on group {ranks}: "
                        f"rank {a} posted {describe_code(ca, tuple(ranks))}, rank {b} "
                        f"{describe_code(cb, tuple(ranks))} (gloo pairs them, and neither can finish: do the ranks "
                        f"agree on the call, `src` and the reduce op?)")
            posts.setdefault((at >> 32, mask, n), (r, at & 0xFFFFFF))
    return None


def _lacking(r: int, s: Snapshot, blocked: dict[int, Snapshot], finished: dict[int, tuple]) -> dict[int, str]:
    """The ranks that have not posted what blocked rank r waits for (finished ones, or blocked ones by their
    counts as they blocked), each with what it did instead.

    A send or receive #n is the n-th with that peer over every (group, tag) queue, but gloo matches it
    within its own queue: only when all of r's sends and receives used one queue is it the n-th there, so
    that a peer with fewer than n posts (over all queues) lacks its match. Otherwise nothing is claimed
    (ring_rounds posts an all-gather receive, tag 1, ahead of a reduce-scatter one, tag 0: its receive #2
    is the first on tag 0, matched by the peer's send #1)."""
    kind, n, who = unpack(s.wait)
    out = {}
    if kind in (RECEIVE, SEND) and s.queues != 1:
        return out
    if kind == COLLECTIVE:
        gid = s.wait_at >> 32
        for m in _members(who):
            if m in finished:
                have, doing = _finished_group(finished[m], gid, who).slots, "finished the call"
            elif m in blocked and m != r and blocked[m].groups is not None:
                have = next((v for g, (mask, v) in blocked[m].groups.items() if g == gid and mask == who), 0)
                doing = f"waits for its {_say(blocked[m], gid, who)}"
            else:
                continue
            if have < n:
                out[m] = f"rank {m} {doing} having posted {have} there"
    elif kind == RECEIVE and who == ANY:                # any rank could send it: each one that has not
        for p in sorted(set(finished) | set(blocked) - {r}):
            have = finished[p][0][r] if p in finished else blocked[p].sent[r]
            doing = "finished the call" if p in finished else f"waits for its {_say(blocked[p], 0, 0)}"
            out[p] = f"rank {p} {doing} having sent it {have} message(s)"
    elif kind in (RECEIVE, SEND):
        if who in finished:
            c = finished[who]
            have, doing = (c[0][r], "finished the call") if kind == RECEIVE else (c[1][r] + c[2], "finished the call")
        elif who in blocked and who != r:
            b = blocked[who]
            have = b.sent[r] if kind == RECEIVE else b.received[r] + b.any_count
            doing = f"waits for its {_say(b, 0, 0)}"
        else:
            return out
        if have < n:
            what = "send(s) to" if kind == RECEIVE else "receive(s) from"
            out[who] = f"rank {who} {doing} having posted {have} {what} rank {r}"
    return out


def _say(s: Snapshot, gid: int, mask: int) -> str:
    kind, n, who = unpack(s.wait)
    if kind == COLLECTIVE:
        other = " (another group with the same members)" if who == mask and s.wait_at >> 32 != gid else ""
        return f"collective #{n} on group {_members(who)}{other}"
    if who == ANY:
        return f"receive #{n} from any rank"
    return f"{'receive' if kind == RECEIVE else 'send'} #{n} {'from' if kind == RECEIVE else 'to'} rank {who}"


def deadlocked(boards: dict[int, Snapshot], finished: dict[int, tuple], world_size: int
               ) -> tuple[int, list[int], str] | None:
    """Blocked ranks none of which can ever be released: each waits for a post that a finished rank, or another
    of them, lacks (a receive from any rank: every other rank is finished or one of them, and short)."""
    blocked = {r: s for r, s in boards.items() if s.wait}
    everyone = set(range(world_size)) | set(boards) | set(finished)
    lacking = {r: _lacking(r, s, blocked, finished) for r, s in blocked.items()}
    doomed = set(blocked)

    def stays(r: int) -> bool:
        kind, n, who = unpack(blocked[r].wait)
        if kind == RECEIVE and who == ANY:
            s = blocked[r]
            if s.queues != 1:                           # n is not its place in one queue (see _lacking)
                return False
            others = [p for p in everyone if p != r]
            if not all(p in finished or p in doomed for p in others):
                return False
            sent = {p: finished[p][0][r] if p in finished else blocked[p].sent[r] for p in others}
            return sum(max(0, sent[p] - s.received[p]) for p in others) < n
        return any(m in finished or m in doomed for m in lacking[r])

    while True:
        gone = {r for r in doomed if not stays(r)}
        if not gone:
            break
        doomed -= gone
    if not doomed:
        return None
    lines, waits = [], {}
    for r in sorted(doomed):
        why = "; ".join(lacking[r].values())
        lines.append(f"rank {r} waits for its {_say(blocked[r], 0, 0)}: {why}")
        kind, _, who = unpack(blocked[r].wait)
        if kind == COLLECTIVE:
            waits.setdefault(who, set()).add(blocked[r].wait_at >> 32)
    same = any(len(gids) > 1 for gids in waits.values())
    return min(doomed), sorted(doomed | {m for r in doomed for m in lacking[r]}), (
        f"can never finish: {'; '.join(lines)}. None of them can post again until its wait ends (a deadlock). "
        + ADVICE + (" Two groups with the same members are two communicators: a collective must be posted on the "
                    "same one on every member" if same else ""))


def mismatched_sizes(sizes: list[tuple[list[list[int]], list[list[int]]]], any_source: list[int]) -> \
        tuple[int, str] | None:
    """The first receiver whose buffers differ in size from the messages sent to it: (its rank, what), or None.

    gloo delivers a smaller message into a larger buffer without a word, and the
    tail keeps stale values, so a buffer must be exactly the size of its message.
    Checked once every count matched; not for a rank that received from any rank.
    """
    n = len(sizes)
    for j in range(n):
        for i in range(n):
            sent, buffers = sizes[i][0][j], sizes[j][1][i]
            if not any_source[j] and sent != buffers:
                return j, (f"received {sent[0]} B in messages from rank {i} into receive buffers of {buffers[0]} B "
                           f"(each buffer must be the size of the message it receives: a larger one keeps stale "
                           f"values past what arrived, and the ledger would count bytes that never came)")
    return None


def unmatched(sent: list[list[int]], received: list[list[int]], any_source: list[int]) -> tuple[int, str] | None:
    """The first unmatched message as (rank to blame, what it did), or None.

    sent[i][j]: sends rank i posted to rank j; received[j][i]: receives rank j
    posted from rank i; any_source[j]: receives rank j posted from any rank.
    """
    n = len(sent)
    for j in range(n):
        extra = {i: sent[i][j] - received[j][i] for i in range(n) if sent[i][j] > received[j][i]}
        missing = {i: received[j][i] - sent[i][j] for i in range(n) if received[j][i] > sent[i][j]}
        if missing:
            i, k = next(iter(missing.items()))
            return j, (f"posted {k} receive(s) from rank {i} that rank {i} never sent "
                       f"(an irecv/recv without a matching send)")
        spare = any_source[j] - sum(extra.values())
        if spare < 0:
            i = next(iter(extra))
            return i, (f"sent {extra[i]} message(s) to rank {j} that rank {j} never received "
                       f"(an isend/send without a matching recv/irecv)")
        if spare > 0:
            return j, f"posted {spare} receive(s) from any rank that no message matched"
    return None
