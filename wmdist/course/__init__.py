"""The course's core, under every chapter: a demo as one typed object, its Report, its comparisons, the checker.

    experiment.py   Experiment (a demo's decisions, rank function and judgement), Verdict, the one runner
    report.py       Report, Check, Count: what a demo checked, counted and predicted; text, HTML and JSON views
    report_html.py  a Report's checks and counts as HTML tables
    compare.py      bound_ratio, worst, ROUNDOFF, reordered_terms: a result against its single-device reference
    exercises.py    Exercise, check(), solution(): a learner's function run through its checker

Import the module you need (`from wmdist.course.report import Report`, `from wmdist.course.exercises import check`);
this file imports none of them.
"""
