"""Run any pipeline Schedule on real ranks: each rank walks its action list, tensors cross with counted isend/irecv.

Rank r owns virtual stages r, r+P, r+2P, ... (the same StageModules the
single-device reference chains). For each action in its list:

    forward  F(s, m): take microbatch m's input (the tokens on stage 0, else
             the activation stage s-1 sent), run stage s, keep input and
             output for the backward, send the output on to stage s+1
             (the last stage computes microbatch m's share of the loss);
    backward B(s, m): take the gradient stage s+1 sent (the last stage
             starts from its loss), backpropagate through stage s, which
             adds microbatch m's gradient into the parameters' .grad, and
             send the input's gradient back to stage s-1.

Sends are non-blocking (isend, waited at the end of the step). All of a
step's receives are posted when it starts, each peer's in the order that
peer sends (plan.incoming), so no message can land in the wrong buffer.
Every transfer goes through wmdist.comm, phase "pp/activation" or
"pp/gradient", and the ledger's counts are returned per rank. Each action's
start (inputs arrived) and end are recorded as a Span (compute plus the
fixed sleep PipeWork asks for) on time.monotonic(), one clock for all
processes of a machine, so the ranks' timelines line up without relying on
when each left the starting barrier.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from wmdist.comm import Context, Pending, barrier, irecv, isend
from wmdist.pipeline.plan import (
    ACTIVATION,
    GRADIENT,
    Message,
    PipeWork,
    incoming,
    microbatch_sizes,
    owner,
    require_stage_ranks,
    stage_blocks,
)
from wmdist.pipeline.schedules import BACKWARD, FORWARD, Action, Schedule
from wmdist.models.world import make_batch
from wmdist.runtime import run
from wmdist.base.spans import Span
from wmdist.models.transformer import TransformerConfig, TransformerWorldModel, make_transformer

PHASE = {FORWARD: f"pp/{ACTIVATION}", BACKWARD: f"pp/{GRADIENT}"}


# --- the model cut into stages (the single-device reference in stages.py chains the same modules) ---

class StageModule(nn.Module):
    """Virtual stage `stage` of `n_stages`: [embedding] + consecutive blocks + [final LayerNorm and head].

    Holds references to the full model's own submodules, so its parameters'
    names and values are the model's. First stage: (obs, actions) -> hidden;
    middle: hidden -> hidden; last: hidden -> predicted next frames.
    """

    def __init__(self, model: TransformerWorldModel, stage: int, n_stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.model_ref = [model]                                  # a list: not registered as a submodule
        self.blocks = nn.ModuleList(model.blocks[i] for i in stage_blocks(len(model.blocks), n_stages)[stage])

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        model = self.model_ref[0]
        x = model.embed_tokens(*inputs) if self.first else inputs[0]     # (b, T, H)
        for block in self.blocks:
            x = block(x)
        return model.predict(x) if self.last else x                      # (b, T, O) or (b, T, H)


def stage_modules(model: TransformerWorldModel, n_stages: int) -> list[StageModule]:
    """All P*v stages of `model`, in pipeline order."""
    return [StageModule(model, s, n_stages) for s in range(n_stages)]


def stage_parameter_names(model: TransformerWorldModel, n_stages: int) -> list[list[str]]:
    """The full model's parameter names that each virtual stage owns (embedding on the first, head on the last)."""
    where = {i: s for s, blocks in enumerate(stage_blocks(len(model.blocks), n_stages)) for i in blocks}
    names: list[list[str]] = [[] for _ in range(n_stages)]
    for name, _ in model.named_parameters():
        parts = name.split(".")
        stage = where[int(parts[1])] if parts[0] == "blocks" else 0 if parts[0] in ("embed", "pos") else n_stages - 1
        names[stage].append(name)
    return names


def model_for(work: PipeWork) -> TransformerWorldModel:
    """The model every rank (and the reference) builds: same seed, same weights."""
    return make_transformer(seed=work.seed, cfg=TransformerConfig(layers=work.layers))


def batch_for(work: PipeWork, *, step: int = 0) -> dict[str, torch.Tensor]:
    """The step's batch of B independent trajectories (obs, actions, next_obs: (B, T, .))."""
    return make_batch(work.batch_size, seq_len=work.seq_len, seed=work.seed * 1000 + step)


def split_microbatches(batch: dict[str, torch.Tensor], microbatches: int) -> list[dict[str, torch.Tensor]]:
    """Whole trajectories per microbatch, in batch order (tensor_split layout)."""
    sizes = microbatch_sizes(batch["obs"].shape[0], microbatches)
    return [dict(zip(batch, parts)) for parts in zip(*(torch.split(v, sizes) for v in batch.values()))]


def microbatch_loss(pred: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
    """This microbatch's share of the full-batch loss: its per-trajectory mean squared errors summed, / B.

    Summed over microbatches it is the single-device loss (mean over all B
    trajectories), whatever the microbatch sizes: no re-weighting needed.
    """
    return (pred - target).pow(2).mean(dim=(1, 2)).sum() / batch_size       # pred, target: (b, T, O)


@dataclass(kw_only=True, frozen=True)
class StageRun:
    """What one rank did in a pipeline run, measured."""
    rank: int
    # the actions it ran, in order, as its schedule writes them ("F3"; "s1F3" when v > 1)
    order: tuple[str, ...]
    spans: tuple[tuple[Span, ...], ...]       # per timed step: one Span per action (time.monotonic() seconds)
    loss: torch.Tensor | None                 # () the last stage's rank: sum of microbatch losses; else None
    outputs: torch.Tensor | None              # (B, T, O) forward only, on the last stage's rank; else None
    grads: dict[str, torch.Tensor]            # gradient of every parameter this rank owns, by model name
    peak_held: int                            # most microbatch activation sets held at once
    transfers: dict[str, int] = field(default_factory=dict)   # ledger, last step: sends/receives by direction
    bytes: dict[str, int] = field(default_factory=dict)       # ledger, last step: bytes sent/received by direction


class Mailbox:
    """All of one step's receives on this rank, posted at once, each peer's in the order that peer sends them.

    Messages between two ranks are matched in the order they are posted, so
    posting in the sender's order puts every tensor in its own buffer, for
    any schedule. Posting them all up front means a message never waits for
    its receiver to get around to asking for it.
    """

    def __init__(self, ctx: Context, expected: dict[int, list[Message]], shapes: dict[int, tuple[int, ...]]):
        self.ctx = ctx                                   # shapes[microbatch]: (b, T, H), every boundary tensor
        self.posted = {msg: irecv(ctx, torch.empty(shapes[msg.microbatch]), src, phase=PHASE[msg.kind])
                       for src, msgs in expected.items() for msg in msgs}

    def take(self, src: int, message: Message) -> torch.Tensor:
        """Wait for `message` from rank `src` and return it."""
        if message not in self.posted:
            raise RuntimeError(f"rank {self.ctx.rank} waits for {message} from rank {src}, which the schedule "
                               f"does not send it")
        return self.posted.pop(message).wait()


@dataclass(kw_only=True)
class _Step:
    """One step's working state on one rank."""
    ctx: Context
    schedule: Schedule
    work: PipeWork
    stages: dict[int, StageModule]
    micro: list[dict[str, torch.Tensor]]
    mailbox: Mailbox
    local: dict[Message, torch.Tensor] = field(default_factory=dict)     # hand-overs between this rank's stages
    sends: list[Pending] = field(default_factory=list)
    held: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    peak: int = 0

    def fetch(self, message: Message, src_stage: int) -> torch.Tensor:
        src = owner(self.schedule, src_stage)
        return self.local.pop(message) if src == self.ctx.rank else self.mailbox.take(src, message)

    def deliver(self, message: Message, tensor: torch.Tensor, dst_stage: int) -> None:
        dst = owner(self.schedule, dst_stage)
        if dst == self.ctx.rank:
            self.local[message] = tensor
        else:
            self.sends.append(isend(self.ctx, tensor, dst, phase=PHASE[message.kind]))

    def busy(self, a: Action, start: float) -> None:
        """Sleep the action's fixed extra time, then record its span: from inputs ready to work done."""
        seconds = self.work.slot_seconds * self.work.work(self.schedule.virtual_stages)[a.stage]
        if seconds > 0:
            time.sleep(seconds * (2 if a.kind == BACKWARD else 1))
        self.spans.append(Span(row=self.ctx.rank, start=start, end=time.monotonic(),
                               kind="forward" if a.kind == FORWARD else "backward",
                               label=self.schedule.token(a)))

    def forward(self, a: Action) -> None:
        s, m, mb = a.stage, a.microbatch, self.micro[a.microbatch]
        x = None if s == 0 else self.fetch(Message(FORWARD, s - 1, m), s - 1)
        if x is not None and not self.work.forward_only:
            x.requires_grad_(True)
        start = time.monotonic()
        with torch.no_grad() if self.work.forward_only else nullcontext():
            out = self.stages[s](mb["obs"], mb["actions"]) if s == 0 else self.stages[s](x)   # (b, T, H) / (b, T, O)
            if self.stages[s].last:
                self.losses[m] = microbatch_loss(out, mb["next_obs"], self.work.batch_size)
                self.outputs[m] = out.detach()
        self.busy(a, start)
        if not self.work.forward_only:
            self.held[(s, m)] = (x, self.losses[m] if self.stages[s].last else out)
            self.peak = max(self.peak, len(self.held))
        if not self.stages[s].last:
            self.deliver(Message(FORWARD, s, m), out.detach(), s + 1)

    def backward(self, a: Action) -> None:
        s, m = a.stage, a.microbatch
        grad = None if self.stages[s].last else self.fetch(Message(BACKWARD, s + 1, m), s + 1)
        x, out = self.held.pop((s, m))
        start = time.monotonic()
        torch.autograd.backward(out, grad)              # adds microbatch m's gradient into this stage's .grad
        self.busy(a, start)
        if s > 0:
            self.deliver(Message(BACKWARD, s, m), x.grad, s - 1)


def pipeline_rank(ctx: Context, schedule: Schedule, work: PipeWork) -> StageRun:
    """Rank function: run `schedule` for `work.repeats` steps on this rank's stages; see the module docstring."""
    P, n = schedule.stages, schedule.virtual_stages
    if ctx.world_size != P:
        raise ValueError(f"world_size ({ctx.world_size}) must equal the number of pipeline stages P ({P})")
    model = model_for(work)
    stages = {s: StageModule(model, s, n) for s in range(ctx.rank, n, P)}
    micro = split_microbatches(batch_for(work), schedule.microbatches)
    shapes = {m: (b, work.seq_len, model.cfg.width)
              for m, b in enumerate(microbatch_sizes(work.batch_size, schedule.microbatches))}
    actions = [a for a in schedule.ranks[ctx.rank] if not (work.forward_only and a.kind == BACKWARD)]
    timelines = []
    for _ in range(work.repeats):
        model.zero_grad(set_to_none=True)
        barrier(ctx, phase="pp/line up")
        ctx.ledger.reset()                                # keep one step's transfers
        expected = incoming(schedule, ctx.rank, forward_only=work.forward_only)
        step = _Step(ctx=ctx, schedule=schedule, work=work, stages=stages, micro=micro, mailbox=Mailbox(ctx, expected, shapes))
        for a in actions:
            (step.forward if a.kind == FORWARD else step.backward)(a)
        for pending in step.sends:
            pending.wait()
        timelines.append(tuple(step.spans))
    last = (n - 1) % P == ctx.rank
    loss = sum((step.losses[m] for m in range(schedule.microbatches)), torch.zeros(())).detach() if last else None
    outputs = torch.cat([step.outputs[m] for m in range(schedule.microbatches)]) if last and work.forward_only else None
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    transfers, sent = _ledger_counts(ctx)
    return StageRun(rank=ctx.rank, order=tuple(schedule.token(a) for a in actions),
                    spans=tuple(timelines), loss=loss, outputs=outputs, grads=grads, peak_held=step.peak,
                    transfers=transfers, bytes=sent)


def _ledger_counts(ctx: Context) -> tuple[dict[str, int], dict[str, int]]:
    """(messages, bytes) this rank's ledger shows for the last step, by direction and send/receive."""
    transfers, nbytes = {}, {}
    for kind, phase in ((ACTIVATION, PHASE[FORWARD]), (GRADIENT, PHASE[BACKWARD])):
        rows = ctx.ledger.select(phase=phase)
        transfers[f"{kind} sends"] = sum(r.op == "isend" for r in rows)
        transfers[f"{kind} receives"] = sum(r.op == "irecv" for r in rows)
        nbytes[f"{kind} bytes sent"] = sum(r.bytes_sent for r in rows)
        nbytes[f"{kind} bytes received"] = sum(r.bytes_recv for r in rows)
    return transfers, nbytes


def run_pipeline(world_size: int, schedule: Schedule, work: PipeWork) -> list[StageRun]:
    """Run `schedule` on `world_size` local ranks; every bad input is refused here, before any process starts.

    A helper for tests: it calls `runtime.run` itself, and no demo reaches it (the chapter's demos are
    Experiments, in demos.py).
    """
    require_stage_ranks(world_size, schedule)
    work.check(schedule)
    return run(pipeline_rank, world_size, schedule, work)
