"""The shared pool budget has no blind spot (issue 35 §7): a process that starts ranks while it answers a
neighbour's request is still listening afterwards, so its ranks close when idle and others can ask for them.

The race, as two kernels starting ranks at the same moment met it (4 rounds in 10): A's cell starts a pool and
asks its neighbours; meanwhile B's start asks A, and A's listening thread closes A's idle pool (seconds, under
A's lock). A's start then called `listen()`, a no-op since A was still listening, and waited for the lock to
count its new pool; the close, finding no pool left, stopped listening, and A started ranks nobody could reach.
The test holds each side at its step (A's asking until the close has begun, the close until A has listened, or
for a few seconds once listening waits for the lock), so the losing order happens every time.
"""
from __future__ import annotations

import os
from pathlib import Path

from conftest import alive_after
from test_neighbours import _appears, hood, start  # noqa: F401  (hood and start: fixtures)
from wmdist.runtime import pool_budget

# Run in A (exec'd by its driver). A's next start, once past its first look at its pools, waits in its asking
# of the others until A's listening thread is closing a pool for a neighbour (at most 60 s: B's request comes);
# that close then waits until A's start has called `listen()`, at most HOLD_S seconds.
HOLD = r"""
import threading, pathlib
import wmdist.runtime.launch as _launch, wmdist.runtime.warm as _warm_module
_pools, _closing, _listened, _held = _launch._WARM, threading.Event(), threading.Event(), []
_ask, _listen, _close = _pools.neighbours.ask_others, _pools.neighbours.listen, _warm_module.Pool.close
def _ask_when_closing(**kwargs):
    pathlib.Path(ASKING).write_text("")
    _closing.wait(60)
    return _ask(**kwargs)
def _listen_and_say():
    _listen()
    if threading.current_thread() is threading.main_thread():
        _listened.set()
def _held_close(self, **kwargs):
    if threading.current_thread().name == "wmdist-neighbours" and not _held:
        _held.append(self)
        _closing.set()
        _listened.wait(HOLD_S)
    return _close(self, **kwargs)
_pools.neighbours.ask_others, _pools.neighbours.listen, _warm_module.Pool.close = (
    _ask_when_closing, _listen_and_say, _held_close)
"""
HOLD_S = 5      # bounds the close's wait once the fix has `listen()` wait for it: the outcome does not depend on it


def test_a_pool_started_while_answering_a_neighbour_stays_reachable(start, hood, tmp_path):  # noqa: F811
    a = start("a", hood)
    assert len(a.call("wmdist.run(work, 1)")) == 1          # idle: what B's request will close
    asking = tmp_path / "asking"
    a.call(f"exec({HOLD!r}, {{'ASKING': {str(asking)!r}, 'HOLD_S': {HOLD_S}}})")

    a.send("wmdist.run(work, 2)")                           # A's cell starts a pool ...
    assert _appears(asking, 240), f"A's start never reached its asking; A's stderr:\n{a.stderr()}"
    b = start("b", hood)
    b.send("wmdist.run(work, 2)")                           # ... as B's does: B asks A to close its idle pool
    a_ranks, b_ranks = a.read(), b.read()
    assert len(a_ranks) == 2 and len(b_ranks) == 2

    own_socket = Path(pool_budget.directory(hood)) / f"{a.pid}.sock"
    assert own_socket.exists(), "A holds warm ranks but stopped listening: no neighbour can reach them"
    c = start("c", hood)
    assert len(c.call("wmdist.run(work, 1)")) == 1
    assert alive_after(a_ranks + b_ranks, 10) == [], "C's start left idle ranks running in A or B"
    assert a.call("state()")["pools"] == {} and b.call("state()")["pools"] == {}



ROUNDS = 10 if os.environ.get("WMDIST_STRESS") == "1" else 1    # the 10 rounds: WMDIST_STRESS=1


def test_two_neighbours_starting_pools_at_once_both_stay_reachable(start, hood):  # noqa: F811
    """The race by luck, as the issue met it: before the fix 3 rounds in 10 left a process holding ranks with no
    socket (measured), 0 in 20 after; one round by default, ten with WMDIST_STRESS=1."""
    a, b = start("a", hood), start("b", hood)
    for round_ in range(ROUNDS):
        size = 2 + round_ % 2                                # new sizes each round: each start asks the other
        a.send(f"wmdist.run(work, {size})")
        b.send(f"wmdist.run(work, {size + 1})")
        assert len(a.read()) == size and len(b.read()) == size + 1
        for n in (a, b):
            listening = (Path(pool_budget.directory(hood)) / f"{n.pid}.sock").exists()   # first: nothing is asked
            holds = n.call("state()")["pools"]                                       # now, so none closes since
            assert listening or not holds, f"round {round_}: a driver holds {holds} with no socket"
