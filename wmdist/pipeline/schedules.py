"""Pipeline schedules as data: for each rank, the order in which it runs forwards and backwards.

A schedule is a tuple of per-rank action tuples. An executor walks its rank's
tuple, a Gantt plot draws it (after simulate.simulate gives it times), and
tests check its invariants without starting a process. Communication is not
listed: a forward of virtual stage s > 0 receives from stage s-1 and a
backward of stage s < last receives from stage s+1, so sends and receives
follow from the order.

Vocabulary: P ranks (`stages`), M microbatches, v virtual stages per rank
(`chunks`). Virtual stage s holds the s-th of P*v consecutive layer blocks
and lives on rank s % P; in the plain schedules v = 1 and stage == rank.

The orders match torch.distributed.pipelining (2.13) for ScheduleGPipe,
Schedule1F1B and ScheduleInterleaved1F1B, compute actions only; the tests
record torch's per-rank orders literally.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from wmdist.costs.pipeline import SCHEDULES, ScheduleName
from wmdist.costs.validate import require_choice, require_int

FORWARD, BACKWARD = "F", "B"
Kind = Literal["F", "B"]                # an action's kind: FORWARD or BACKWARD
# make_schedule's bounds (the CLI's -P, -M and -v), stated once: a schedule lists 2*P*M*v actions, and the
# ideal-time simulation of the largest one allowed takes about a second on one core.
MAX_STAGES, MAX_MICROBATCHES, MAX_CHUNKS, MAX_SLOTS = 256, 1024, 16, 16384     # MAX_SLOTS bounds P*M*v
_TOKEN = re.compile(r"(?:s(\d+))?([FB])(\d+)")


@dataclass(frozen=True)
class Action:
    """One unit of compute: the forward or backward of one microbatch on one (virtual) stage."""
    kind: Kind         # FORWARD ("F") or BACKWARD ("B")
    microbatch: int    # 0 .. M-1
    stage: int         # virtual stage 0 .. P*v-1; equals the rank in plain schedules

    def __post_init__(self) -> None:
        require_choice("kind", self.kind, (FORWARD, BACKWARD))
        require_int("microbatch", self.microbatch, 0)
        require_int("stage", self.stage, 0)

    def __str__(self) -> str:
        return format_token(self, with_stage=True)


def format_token(action: Action, *, with_stage: bool = False) -> str:
    """Write `action` as "F3" / "B3", or with its virtual stage as "s2F3" (stage 2, forward of microbatch 3)."""
    prefix = f"s{action.stage}" if with_stage else ""
    return f"{prefix}{action.kind}{action.microbatch}"


def parse_token(token: str, *, stage: int | None = None) -> Action:
    """Read a token back into an Action; a token without an "s<k>" prefix takes `stage` (a plain schedule's rank).

    e.g. parse_token("s2F3") -> Action("F", 3, 2); parse_token("B0", stage=1) -> Action("B", 0, 1).
    """
    if not isinstance(token, str):
        raise TypeError(f"token must be a string like 'F3' or 's2B3', got {token!r}")
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        raise ValueError(f"token must look like 'F3', 'B3' or 's2F3' (stage 2, forward of microbatch 3), "
                         f"got {token!r}")
    prefix, kind, microbatch = match.groups()
    if prefix is not None:
        return Action(kind, int(microbatch), int(prefix))
    if stage is None:
        raise ValueError(f"token {token!r} names no stage; pass stage= (the rank, in a plain schedule)")
    return Action(kind, int(microbatch), require_int("stage", stage, 0))


@dataclass(kw_only=True, frozen=True)
class Schedule:
    """A complete pipeline schedule: which actions each rank runs, in order.

    Validated on construction: every (kind, virtual stage, microbatch) appears
    exactly once, on the rank that owns the stage (stage % stages). Whether
    the order can run (no rank waits forever) is simulate.simulate's question,
    so a deliberately bad order can still be built and shown to deadlock.
    """
    name: str                                    # "gpipe", "1f1b", "interleaved", or your own
    stages: int                                  # P: ranks in the pipeline
    microbatches: int                            # M: microbatches per step
    chunks: int                                  # v: virtual stages per rank (1 unless interleaved)
    ranks: tuple[tuple[Action, ...], ...]        # ranks[r]: rank r's actions in execution order

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        p = require_int("stages", self.stages, 1)
        m = require_int("microbatches", self.microbatches, 1)
        v = require_int("chunks", self.chunks, 1)
        ranks = tuple(tuple(actions) for actions in self.ranks)
        object.__setattr__(self, "ranks", ranks)
        if len(ranks) != p:
            raise ValueError(f"ranks must hold one action list per rank ({p}), got {len(ranks)}")
        for rank, actions in enumerate(ranks):
            for i, action in enumerate(actions):
                if not isinstance(action, Action):
                    raise TypeError(f"ranks[{rank}][{i}] must be an Action, got {action!r}")
                if action.stage >= p * v or action.stage % p != rank or action.microbatch >= m:
                    raise ValueError(f"ranks[{rank}][{i}] = {action}: expected a stage below {p * v} that lives "
                                     f"on rank {rank} (stage % {p}) and a microbatch below {m}")
        seen = Counter((a.kind, a.stage, a.microbatch) for actions in ranks for a in actions)
        for key, count in seen.items():
            if count > 1:
                raise ValueError(f"ranks: {Action(key[0], key[2], key[1])} appears {count} times, expected once")
        for rank in range(p):
            for s in range(rank, p * v, p):
                for mb in range(m):
                    for kind in (FORWARD, BACKWARD):
                        if (kind, s, mb) not in seen:
                            raise ValueError(f"ranks[{rank}] lacks {Action(kind, mb, s)}: every stage runs "
                                             f"a forward and a backward of every microbatch")

    @property
    def virtual_stages(self) -> int:
        """P*v: the number of consecutive layer blocks the model is cut into."""
        return self.stages * self.chunks

    def tokens(self) -> tuple[tuple[str, ...], ...]:
        """Each rank's actions as tokens; the stage prefix appears only when v > 1 (a rank owns several)."""
        return tuple(tuple(self.token(a) for a in actions) for actions in self.ranks)

    def token(self, action: Action) -> str:
        """One action as this schedule writes it everywhere (JSON, diagrams, the executor's order): "F3",
        or "s2F3" when v > 1, where the stage is needed to tell a rank's chunks apart."""
        return format_token(action, with_stage=self.chunks > 1)


def _built(cls: type, **fields: Any) -> Any:
    """An instance of the frozen dataclass `cls` set field by field, without its __post_init__ checks: for
    what the builders below make from sizes make_schedule (or the caller's config) has already checked."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _act(kind: str, microbatch: int, stage: int) -> Action:
    return _built(Action, kind=kind, microbatch=microbatch, stage=stage)


def _plain(name: str, stages: int, microbatches: int, orders: Iterable[Iterable[tuple[str, int]]]) -> Schedule:
    ranks = tuple(tuple(_act(kind, mb, rank) for kind, mb in order) for rank, order in enumerate(orders))
    return _built(Schedule, name=name, stages=stages, microbatches=microbatches, chunks=1, ranks=ranks)


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (fill-drain): each rank runs all M forwards, then all M backwards, both in microbatch order.

    Every stage keeps all M microbatches' activations until the backward
    phase begins. torch's ScheduleGPipe runs backwards in this same
    ascending order (microbatch 0 first).
    """
    return _gpipe(require_int("stages", stages, 1), require_int("microbatches", microbatches, 1))


def _gpipe(p: int, m: int) -> Schedule:
    order = [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    return _plain("gpipe", p, m, [order] * p)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): warm-up forwards, then one forward / one backward alternating, then cool-down.

    Rank r first runs min(P-r-1, M) forwards (how far it is from the last
    stage), then pairs "F(next) B(oldest)" until every forward is issued, then
    the remaining backwards. So rank r holds at most min(P-r, M) microbatches'
    activations instead of GPipe's M, for the same ideal bubble. torch's
    Schedule1F1B words it as P-r warm-up forwards then "B F" pairs: the same
    sequence. (torch refuses M < P; here M < P simply leaves no steady phase.)
    """
    return _one_f_one_b(require_int("stages", stages, 1), require_int("microbatches", microbatches, 1))


def _one_f_one_b(p: int, m: int) -> Schedule:
    orders = []
    for rank in range(p):
        warmup = min(p - rank - 1, m)
        order = [(FORWARD, i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [(FORWARD, warmup + i), (BACKWARD, i)]
        order += [(BACKWARD, i) for i in range(m - warmup, m)]
        orders.append(order)
    return _plain("1f1b", p, m, orders)


def interleaved_one_f_one_b(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): v virtual stages per rank, depth first.

    Virtual stage s lives on rank s % P, so a microbatch visits every rank v
    times. A rank works through its chunks in rounds of P microbatches:
    forward step i uses local chunk (i // P) % v on microbatch
    (i // (P*v)) * P + i % P; backward step j uses chunks in reverse,
    v-1 - (j // P) % v, with the same microbatch rule. Rank r warms up with
    (v-1)*P + 2*(P-1-r) forwards (at most M*v), then alternates one forward
    and one backward, then drains the remaining backwards. This is the order
    of torch's ScheduleInterleaved1F1B when M is a multiple of P; at v = 1 it
    is a 1F1B with a deeper warm-up (2*(P-1-r) forwards instead of P-1-r).
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("chunks", chunks, 1)
    _require_rounds(p, m)
    return _interleaved(p, m, v)


def _require_rounds(p: int, m: int) -> None:
    if m % p:
        raise ValueError(f"microbatches must be a multiple of stages for the interleaved schedule "
                         f"(it works in rounds of P microbatches), got microbatches={m}, stages={p}")


def _interleaved(p: int, m: int, v: int) -> Schedule:
    total = m * v

    def step(i: int, chunk: int, kind: str, rank: int) -> Action:
        return _act(kind, (i // (p * v)) * p + i % p, chunk * p + rank)

    ranks = []
    for rank in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - rank), total)
        fwd = [step(i, (i // p) % v, FORWARD, rank) for i in range(total)]
        bwd = [step(j, v - 1 - (j // p) % v, BACKWARD, rank) for j in range(total)]
        order = fwd[:warmup]
        for j in range(total - warmup):
            order += [fwd[warmup + j], bwd[j]]
        ranks.append(tuple(order + bwd[total - warmup:]))
    return _built(Schedule, name="interleaved", stages=p, microbatches=m, chunks=v, ranks=tuple(ranks))


def check_size(stages: int, microbatches: int, *, chunks: int = 1) -> tuple[int, int, int]:
    """(P, M, v) if each lies in 1..MAX_STAGES / MAX_MICROBATCHES / MAX_CHUNKS and P*M*v <= MAX_SLOTS, else ValueError.

    Refused before anything is built, so a mistyped 1000000 answers at once
    instead of listing (and simulating) billions of actions.
    """
    sizes = []
    for name, value, high in (("stages", stages, MAX_STAGES), ("microbatches", microbatches, MAX_MICROBATCHES),
                              ("chunks", chunks, MAX_CHUNKS)):
        require_int(name, value, 1)                  # a bad type or a value below 1 worded as everywhere else
        sizes.append(require_int(name, value, 1, high=high))
    p, m, v = sizes
    if p * m * v > MAX_SLOTS:
        raise ValueError(f"stages*microbatches*chunks must be at most {MAX_SLOTS} (the schedule lists 2*P*M*v "
                         f"actions), got {p}*{m}*{v} = {p * m * v}")
    return p, m, v


def make_schedule(name: ScheduleName, stages: int, microbatches: int, *, chunks: int = 1) -> Schedule:
    """Build the schedule called `name` ("gpipe", "1f1b" or "interleaved") for P ranks, M microbatches, v chunks.

    Sizes are bounded by check_size (P <= 256, M <= 1024, v <= 16, P*M*v <= 16384); the schedule
    functions themselves (gpipe, one_f_one_b, ...) take any size.
    """
    require_choice("name", name, SCHEDULES)
    p, m, v = check_size(stages, microbatches, chunks=chunks)
    if name == "interleaved":
        _require_rounds(p, m)
    elif v != 1:
        raise ValueError(f"chunks must be 1 for the {name} schedule (only 'interleaved' puts several "
                         f"virtual stages on a rank), got chunks={v}")
    return _schedule_unchecked(name, p, m, v)


def _schedule_unchecked(name: ScheduleName, p: int, m: int, v: int) -> Schedule:
    """make_schedule's schedule for a name and sizes it (or a config calling it) has already checked."""
    if name == "interleaved":
        return _interleaved(p, m, v)
    return _gpipe(p, m) if name == "gpipe" else _one_f_one_b(p, m)


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The schedule as plain JSON data: {"schedule", "stages", "microbatches", "chunks", "ranks": [[tokens]]}."""
    return {"schedule": schedule.name, "stages": schedule.stages, "microbatches": schedule.microbatches,
            "chunks": schedule.chunks, "ranks": [list(tokens) for tokens in schedule.tokens()]}


def from_json(data: dict[str, Any]) -> Schedule:
    """Rebuild a Schedule from schedule_to_json's output (or a hand-written order in the same form)."""
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict as written by schedule_to_json, got {type(data).__name__}")
    missing = [k for k in ("schedule", "stages", "microbatches", "chunks", "ranks") if k not in data]
    if missing:
        raise ValueError(f"data lacks {missing}; expected the keys schedule_to_json writes")
    ranks = data["ranks"]
    if not isinstance(ranks, (list, tuple)) or any(not isinstance(r, (list, tuple)) for r in ranks):
        raise TypeError(f"ranks must be a list of token lists, one per rank, got {ranks!r}")
    actions = tuple(tuple(parse_token(t, stage=rank) for t in tokens) for rank, tokens in enumerate(ranks))
    return Schedule(name=data["schedule"], stages=data["stages"], microbatches=data["microbatches"], chunks=data["chunks"], ranks=actions)
