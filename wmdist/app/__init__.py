"""The application, the top floor: what a learner types.

    cli.py  the `wmdist` command line: list, verify, bench, memory, schedule, lab (pyproject's entry point, and
            `python -m wmdist`)
    lab.py  `wmdist lab`: the course opened in JupyterLab at chapter 00, on the course's kernel

Import the module you need; this file imports neither.
"""
