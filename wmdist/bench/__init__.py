"""`wmdist bench`: measurements of the course's own machinery, each a ratio taken within one run.

    suite.py    the benchmarks themselves, and benchmarks(): the callables, built from catalog.py in its order
    catalog.py  the benchmarks `wmdist bench` knows, as data: name, function, what each measures
    pairs.py    two things timed in back-to-back pairs, reported as the median per-pair ratio
    load.py     the 1-minute load average, read while a figure is measured
    panels.py   `wmdist bench panels`: how fast each panel answers a control move, without a browser

The record every benchmark returns is wmdist/base/bench_result.py (session/bench.py returns one too).
Import the module you need; this file imports none of them, so `wmdist --help` reads catalog.py without torch.
"""
