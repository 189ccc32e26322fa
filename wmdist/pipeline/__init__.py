"""Chapter 05, pipeline parallelism: consecutive layer blocks on separate ranks, microbatches flowing through.

What this folder holds:

    schedules.py   pipeline schedules as data: per-rank lists of forward and
                   backward actions (GPipe, 1F1B, interleaved 1F1B), their
                   tokens ("F3", "B3", "s2F3") and JSON form; pure Python
    simulate.py    an ideal-time run of a schedule: start and end of every
                   action, makespan, idle fraction, activations in flight per
                   rank, deadlock detection, and a text slot diagram

The closed forms these are checked against (bubble fraction in both
conventions, peak activations in flight, boundary transfers) live in
wmdist.costs.pipeline. Nothing here imports torch: an executor on real ranks
interprets the same action lists, and a Gantt plot draws the same timings.
"""
