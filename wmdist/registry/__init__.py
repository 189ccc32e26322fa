"""Every chapter's demos and exercises by name, above the chapters and their capstones.

    demos.py    the registries: each chapter.py's DEMOS and EXERCISES, by name; prepare(), plan(), verify()
    catalog.py  the same demos' names, chapters, world sizes and titles as plain data (what `wmdist list` prints,
                with no torch)

The kernel's zygote preloads demos.registry(), and the command line, the benchmarks and the tests read both.
Import the module you need; this file imports neither.
"""
