"""What a pipeline run needs decided before any process starts: the split, the messages, the work (pure).

The model is cut into P*v consecutive pieces ("virtual stages"): the first
holds the token embedding, the last the final LayerNorm, the head and the
loss, and the transformer blocks are shared out in order, as evenly as
possible. So every boundary carries the same kind of tensor, one microbatch
of hidden states (b, T, H), forward as an activation and backward as its
gradient.

From the schedule alone each rank can list the messages every other rank
will send it, in the order they will be sent. Point-to-point messages
between two ranks are matched in the order they are posted, so the executor
posts its receives from each peer in exactly that order (all at the start of
a step): any schedule that the ideal-time simulator can finish then runs
without deadlock and without a message landing in the wrong buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from wmdist.costs.pipeline import SCHEDULES, ScheduleName
from wmdist.costs.collectives import nonempty_split
from wmdist.costs.validate import require_bool, require_choice, require_int, require_positive, require_real
from wmdist.pipeline.schedules import BACKWARD, FORWARD, Schedule

ACTIVATION, GRADIENT = "activation", "gradient"
DEMO_LAYERS = 8                         # the demos' model has 8 blocks: at most one stage (rank) per block


class Message(NamedTuple):
    """One boundary tensor, named by who sends it: Message(FORWARD, s, m) is stage s's output for microbatch m,
    going to stage s+1; Message(BACKWARD, s, m) is the gradient of stage s's input, going back to stage s-1."""
    kind: str            # FORWARD (an activation) or BACKWARD (its gradient)
    stage: int           # the virtual stage that sends it
    microbatch: int


def stage_blocks(layers: int, virtual_stages: int) -> list[range]:
    """Which transformer blocks each virtual stage runs: consecutive, the first `layers % n` stages one more.

    e.g. stage_blocks(8, 3) -> [range(0, 3), range(3, 6), range(6, 8)]. More
    stages than blocks is refused: every stage needs at least one (lower P or v,
    or use more layers).
    """
    sizes = nonempty_split(layers, virtual_stages, total_name="layers", parts_name="virtual_stages",
                           what="transformer block",
                           refusal="the pipeline has {parts} (virtual) stages but the model has only {total} blocks: "
                                   "every stage needs at least one block (lower P or v, or use more layers)")
    starts = [0, *accumulate(sizes)]
    return [range(a, b) for a, b in zip(starts, starts[1:])]


def microbatch_sizes(batch_size: int, microbatches: int) -> list[int]:
    """Trajectories per microbatch: whole trajectories, torch.tensor_split's layout (first B % M get one more)."""
    return nonempty_split(batch_size, microbatches, total_name="batch_size", parts_name="microbatches",
                          what="whole trajectory",
                          refusal="microbatches ({parts}) must not exceed batch_size ({total}): a microbatch holds "
                                  "whole trajectories, at least one")


def owner(schedule: Schedule, stage: int) -> int:
    """The rank that runs virtual stage `stage` (stage % P)."""
    return stage % schedule.stages


def outgoing(schedule: Schedule, rank: int, *, forward_only: bool = False) -> list[tuple[int, Message]]:
    """(destination rank, message) for every tensor `rank` sends, in the order its actions send them.

    A forward of stage s < last sends its output to stage s+1; a backward of
    stage s > 0 sends its input's gradient to stage s-1. A message between
    two stages of the same rank (P = 1) is included too; the executor hands
    it over locally instead of sending.
    """
    last = schedule.virtual_stages - 1
    out = []
    for a in schedule.ranks[rank]:
        if a.kind == FORWARD and a.stage < last:
            out.append((owner(schedule, a.stage + 1), Message(FORWARD, a.stage, a.microbatch)))
        elif a.kind == BACKWARD and a.stage > 0 and not forward_only:
            out.append((owner(schedule, a.stage - 1), Message(BACKWARD, a.stage, a.microbatch)))
    return out


def incoming(schedule: Schedule, rank: int, *, forward_only: bool = False) -> dict[int, list[Message]]:
    """For each other rank, the messages it sends to `rank`, in its sending order (the order to post receives)."""
    by_source: dict[int, list[Message]] = {}
    for src in range(schedule.stages):
        if src == rank:
            continue
        msgs = [m for dst, m in outgoing(schedule, src, forward_only=forward_only) if dst == rank]
        if msgs:
            by_source[src] = msgs
    return by_source


def transfer_counts(schedule: Schedule, rank: int, *, forward_only: bool = False) -> dict[str, int]:
    """Messages `rank` sends and receives across ranks, by direction: the counts its ledger must show."""
    sent = [m for dst, m in outgoing(schedule, rank, forward_only=forward_only) if dst != rank]
    received = [m for msgs in incoming(schedule, rank, forward_only=forward_only).values() for m in msgs]
    return {f"{ACTIVATION} sends": sum(m.kind == FORWARD for m in sent),
            f"{ACTIVATION} receives": sum(m.kind == FORWARD for m in received),
            f"{GRADIENT} sends": sum(m.kind == BACKWARD for m in sent),
            f"{GRADIENT} receives": sum(m.kind == BACKWARD for m in received)}


def peak_held(schedule: Schedule, rank: int) -> int:
    """Most activation sets `rank` holds at once when it runs its actions in order (a forward stores, its backward frees)."""
    held = peak = 0
    for a in schedule.ranks[rank]:
        held += 1 if a.kind == FORWARD else -1
        peak = max(peak, held)
    return peak


@dataclass(frozen=True, kw_only=True)
class PipeWork:
    """What each pipeline step computes, and how long each action is made to take.

    `slot_seconds` > 0 adds a fixed sleep to every action: a forward of
    virtual stage s sleeps stage_work[s] * slot_seconds, a backward twice
    that. Sleeping ranks do not compete for the CPU, so a shared, loaded
    machine still gives a clean timeline; the real compute of this tiny
    model is a fraction of a millisecond on top.
    """
    batch_size: int = 8                       # B trajectories per step (independent environments)
    seq_len: int = 6                          # T time steps per trajectory
    layers: int = DEMO_LAYERS                 # transformer blocks cut into P*v stages
    seed: int = 0
    forward_only: bool = False                # run only the forwards (no grad): the text's basic schedule
    slot_seconds: float = 0.0                 # sleep per unit of forward work; backward sleeps 2x
    stage_work: tuple[float, ...] | None = None   # relative work per virtual stage; None: all equal (1.0)
    repeats: int = 1                          # steps timed in a row (the gradients of every step are equal)

    def __post_init__(self) -> None:
        require_int("batch_size", self.batch_size, 1)
        require_int("seq_len", self.seq_len, 1, high=64)
        require_int("layers", self.layers, 1)
        require_int("seed", self.seed, 0)
        require_bool("forward_only", self.forward_only)
        require_real("slot_seconds", self.slot_seconds, low=0.0, high=1.0)
        require_int("repeats", self.repeats, 1, high=20)
        if self.stage_work is not None:
            if not isinstance(self.stage_work, tuple) or not self.stage_work:
                raise TypeError(f"stage_work must be a non-empty tuple of numbers or None, got {self.stage_work!r}")
            for i, w in enumerate(self.stage_work):
                require_positive(f"stage_work[{i}]", w)

    def work(self, virtual_stages: int) -> tuple[float, ...]:
        """Relative work of each virtual stage (all 1.0 unless stage_work says otherwise)."""
        if self.stage_work is None:
            return (1.0,) * virtual_stages
        if len(self.stage_work) != virtual_stages:
            raise ValueError(f"stage_work has {len(self.stage_work)} entries, the pipeline has {virtual_stages} "
                             f"virtual stages")
        return self.stage_work

    def check(self, schedule: Schedule) -> None:
        """Refuse a run that cannot work with `schedule`, before any process starts."""
        stage_blocks(self.layers, schedule.virtual_stages)
        microbatch_sizes(self.batch_size, schedule.microbatches)
        self.work(schedule.virtual_stages)


def slow_stage_work(virtual_stages: int, *, factor: float = 2.0, stage: int = 1) -> tuple[float, ...]:
    """Deliberately unequal stages: every stage does 1.0 except `stage` (default the second), which does `factor`."""
    n = require_int("virtual_stages", virtual_stages, 1)
    require_positive("factor", factor)
    s = require_int("stage", stage, 0) % n
    return tuple(factor if i == s else 1.0 for i in range(n))


def require_stage_ranks(world_size: int, schedule: Schedule) -> None:
    """A pipeline of P stages runs on exactly P ranks: say so before any process starts."""
    n = require_int("world_size", world_size, 1)
    if n != schedule.stages:
        raise ValueError(f"world_size ({n}) must equal the number of pipeline stages P ({schedule.stages}): "
                         f"each rank runs one stage (v={schedule.chunks} virtual stages)")


def check_name(name: str) -> ScheduleName:
    """A schedule name the executor knows, or a ValueError naming the choices."""
    return require_choice("schedule", name, SCHEDULES)
