"""Which collective each torch route posts: the name a learner knows it by, and what gloo pairs it with.

gloo pairs the n-th collective posted on a group on one rank with the n-th on every other member,
and different torch calls can be the same operation on the wire. Measured with torch 2.13 on gloo
(two ranks, one tensor each, rank 0 calling one form and rank 1 another, both results checked):
`all_gather`, `all_gather_into_tensor`, their coalesced forms and the functional `all_gather_tensor`
all pair with one another and give the right answer; so do `all_to_all` with `all_to_all_single`,
the all-reduce forms, the tensor forms of reduce-scatter, and `broadcast` with its functional form.
`reduce_scatter` of a list with `reduce_scatter_tensor` does not: both ranks time out. So a
collective is checksummed by its wire class (the second name below) and named by its own.

Functional collectives (`torch.distributed._functional_collectives`, which DTensor uses) never call
ProcessGroup's Python methods: they call torch ops (`torch.ops._c10d_functional.all_reduce`, ...)
whose C++ kernels call the group directly. Every Python caller (funcol, DTensor, their backward
passes, a compiled graph's generated code) reaches such an op through its OpOverloadPacket or
OpOverload, and both call the op's `_op`, so `count_functional` wraps that (keeping its hash: torch
files ops in tables by it). The legacy `c10d_functional` ops call the new ones from Python, so they
are counted there, once. A functional op's result carries its unfinished work (torch's work
registry); one left unwaited is waited for at the end of the call (`wait_functional`).

Each posted collective also gets an `op_code`: its wire class, reduce op and root (for the rooted ones) in
one int, so two members' n-th collectives on a group can be compared field by field (`codes_agree`): a
broadcast whose ranks disagree on `src` pairs on the wire and then hangs, and an all-reduce with SUM on
one rank and MAX on the other finishes silently with one rank's op applied on both (measured on two
ranks: both got the sum). A field a route does not say (the functional ops pass their root and op in
their own forms) is 0: unknown, and agrees with anything.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch._guards import detect_fake_mode

# ProcessGroup's collective methods (torch 2.13; absent ones are skipped): (the name a user knows, wire class).
COLLECTIVES = {
    "allreduce": ("all_reduce", "all_reduce"), "allreduce_coalesced": ("all_reduce_coalesced", "all_reduce"),
    "allgather": ("all_gather", "all_gather"), "allgather_coalesced": ("all_gather_coalesced", "all_gather"),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "all_gather"),
    "_allgather_base": ("all_gather_into_tensor", "all_gather"),
    "all_gather_single": ("all_gather_into_tensor", "all_gather"),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", "all_gather"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter"),
    "_reduce_scatter_base": ("reduce_scatter_tensor", "reduce_scatter_tensor"),
    "reduce_scatter_single": ("reduce_scatter_tensor", "reduce_scatter_tensor"),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor"),
    "alltoall": ("all_to_all", "all_to_all"), "alltoall_base": ("all_to_all_single", "all_to_all"),
    "all_to_all_single": ("all_to_all_single", "all_to_all"),
    "broadcast": ("broadcast", "broadcast"), "reduce": ("reduce", "reduce"), "gather": ("gather", "gather"),
    "scatter": ("scatter", "scatter"), "barrier": ("barrier", "barrier"),
    "monitored_barrier": ("monitored_barrier", "monitored_barrier")}

# The functional ops (namespace, op): (the name a user knows, wire class). Their group is the argument `group_name`.
FUNCTIONAL = {
    **{("_c10d_functional", op): (f"{op.rstrip('_')} (functional)", "all_reduce")
       for op in ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_")},
    **{("_c10d_functional", op): ("all_gather_into_tensor (functional)", "all_gather")
       for op in ("all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced")},
    **{("_c10d_functional", op): ("reduce_scatter_tensor (functional)", "reduce_scatter_tensor")
       for op in ("reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced")},
    ("_c10d_functional", "all_to_all_single"): ("all_to_all_single (functional)", "all_to_all"),
    ("_c10d_functional", "broadcast"): ("broadcast (functional)", "broadcast"),
    ("_c10d_functional", "broadcast_"): ("broadcast (functional)", "broadcast"),
    **{("_c10d_functional_autograd", op): (f"{op} (functional)", wire) for op, wire in (
        ("all_gather_into_tensor", "all_gather"), ("reduce_scatter_tensor", "reduce_scatter_tensor"),
        ("all_to_all_single", "all_to_all"))},
}

WIRE_CLASSES = ("all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "broadcast",
                "reduce", "gather", "scatter", "barrier", "monitored_barrier")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCING = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce")
REDUCE_OPS = tuple(torch.distributed.ReduceOp.RedOpType.__members__)     # SUM, AVG, ... in torch's order


def op_code(wire: str, args: tuple, kwargs: dict) -> int:
    """An int of 24 bits: (wire class + 1) << 16 | (reduce op + 1) << 8 | (group root + 1); 0 fields: unknown.

    `args`, `kwargs`: what a ProcessGroup method was called with (its options object, or the root and
    op of its short overloads)."""
    root = op = None
    for value in (*args, *kwargs.values()):
        if hasattr(value, "rootRank"):
            root = value.rootRank
        if hasattr(value, "reduceOp"):
            op = value.reduceOp
        elif isinstance(value, (torch.distributed.ReduceOp, torch.distributed.ReduceOp.RedOpType)):
            op = value
        elif isinstance(value, int) and not isinstance(value, bool) and wire in ROOTED:
            root = value
    op_index = int(getattr(op, "op", op)) + 1 if op is not None and wire in REDUCING else 0
    root_index = root + 1 if root is not None and wire in ROOTED and 0 <= root < 255 else 0
    return (WIRE_CLASSES.index(wire) + 1) << 16 | min(op_index, 255) << 8 | root_index


def codes_agree(a: int, b: int) -> bool:
    """Whether two members' op codes can pair: the same wire class, and the same op and root where both say."""
    for shift in (16, 8, 0):
        x, y = a >> shift & 0xFF, b >> shift & 0xFF
        if x and y and x != y:
            return False
    return True


def describe_code(code: int, ranks: tuple[int, ...]) -> str:
    """'broadcast from rank 1', 'all_reduce (MAX)': what an op code says, roots as global ranks of `ranks`."""
    wire, op, root = code >> 16 & 0xFF, code >> 8 & 0xFF, code & 0xFF
    text = WIRE_CLASSES[wire - 1] if 0 < wire <= len(WIRE_CLASSES) else "a collective"
    if op:
        text += f" ({REDUCE_OPS[op - 1] if op <= len(REDUCE_OPS) else op - 1})"
    if root:
        text += f" from rank {ranks[root - 1] if root <= len(ranks) else f'(group rank {root - 1})'}"
    return text


class _Counted:
    """An op's `_op`, reporting each call to `post(name, wire, group, call)`; hashes as the original does."""

    def __init__(self, original: Any, name: str, wire: str, group_at: int, post: Callable[..., Any]):
        self.original, self.name, self.wire, self.group_at, self.post = original, name, wire, group_at, post

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = lambda: self.original(*args, **kwargs)   # noqa: E731
        if detect_fake_mode(args) is not None:
            return call()                                 # traced (torch.compile), not posted
        group = kwargs.get("group_name", args[self.group_at] if len(args) > self.group_at else None)
        return self.post(self.name, self.wire, group, call)

    def __hash__(self) -> int:
        return hash(self.original)

    def __getattr__(self, key: str) -> Any:
        return getattr(self.original, key)


def count_functional(post: Callable[[str, str, Any, Callable[[], Any]], Any]) -> None:
    """Route every functional collective of this process through `post(name, wire, group, call)`, which must
    run `call()` and return its result (once per process; ops this torch lacks are skipped)."""
    for (namespace, op), (name, wire) in FUNCTIONAL.items():
        try:
            packet = getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):
            continue
        for target in [packet] + [getattr(packet, o) for o in packet.overloads()]:
            schema = getattr(target, "_schema", None) or packet.default._schema
            names = [a.name for a in schema.arguments]
            if "group_name" in names and not isinstance(target._op, _Counted):
                target._op = _Counted(target._op, name, wire, names.index("group_name"), post)


def work_registry_size() -> int:
    """Functional collectives whose result nobody has waited for yet, in this process (0 where torch cannot say)."""
    size = getattr(torch._C._distributed_c10d, "_get_work_registry_size", None)
    return size() if size is not None else 0


def wait_functional(kept: list[tuple[Any, str]], *, within: float) -> str | None:
    """Wait up to `within` seconds for the functional collectives in `kept` (their results, what they were);
    describe one that does not finish, or None. Waiting twice is harmless: a waited result has no work left."""
    state: dict[str, Any] = {"at": 0, "error": None}
    done = threading.Event()

    def wait_all() -> None:
        try:
            for i, (result, _) in enumerate(kept):
                state["at"] = i
                for tensor in result if isinstance(result, (list, tuple)) else [result]:
                    torch.ops._c10d_functional.wait_tensor(tensor)
        except Exception as err:     # gloo raises when a peer's tensor does not fit
            state["error"] = f": {str(err).splitlines()[0]}"
        done.set()

    threading.Thread(target=wait_all, name="wmdist-wait-functional", daemon=True).start()
    if done.wait(within) and state["error"] is None:
        return None
    return (f"left {kept[state['at']][1]} unfinished after the call ended (every member posted the same "
            f"collectives: do their tensors' sizes agree?){state['error'] or f' within {within:.1f} s'}")
