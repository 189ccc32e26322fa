"""Late wake-ups, as a loaded machine gives them: imported at start-up by every Python process that
tools/nbval_load.py puts this folder on PYTHONPATH for (the notebooks' kernels under the suite's nbval
run, and the forkserver and ranks they start). Nothing happens unless WMDIST_LATE_WAKEUPS is set.

With it set to F (a number > 0), `time.sleep(s)` sleeps s + F * s * e, e drawn from an exponential
of mean 1 (a scheduler's late wake-ups: mostly small, now and then several times the sleep), afresh in every process (reseeded after each fork, so ranks forked from one forkserver do not share
their draws). That is what CPU hogs do to the course's timings: its measurements time ranks that
sleep a fixed slot (a stand-in for a big model's work), and a busy scheduler wakes each of them late
by a varying amount. Only sleeping is stretched: nothing computed or counted changes, so a checked
output that differs under it depends on timing.
"""
import os

_FACTOR = os.environ.get("WMDIST_LATE_WAKEUPS", "")
if _FACTOR:
    import random
    import time

    _spread = float(_FACTOR)
    _draws = random.Random()
    _sleep = time.sleep

    def _reseed() -> None:
        _draws.seed(int.from_bytes(os.urandom(8), "little"))

    def _late_sleep(seconds: float) -> None:
        """time.sleep, woken late by an exponential delay of mean `_spread` times what was asked."""
        _sleep(seconds * (1.0 + _spread * _draws.expovariate(1.0)) if seconds > 0 else seconds)

    _reseed()
    os.register_at_fork(after_in_child=_reseed)
    time.sleep = _late_sleep
