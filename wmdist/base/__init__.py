"""Pure bases beside costs/, at the bottom: what every layer above may use without torch, widgets or plots.

    knobs.py         slider ranges, stated once beside the config they set
    spans.py         timelines as data: spans of work per row, and how much of one kind hides another
    measured.py      values one chapter measures for a later one, kept in a JSON file across kernels
    bench_result.py  the record one benchmark returns (inputs, measurement, headline, target, load)
    on_progress.py   OnProgress, the type of the progress callback runs report through

Import the module you need (`from wmdist.base.knobs import Knob`); this file imports none of them.
"""
