"""A Binder session replayed and measured: ten chapters, a kernel each, all kept, under Binder's limits.

`run_session` (memory.py) is the entry point; `wmdist bench session-memory` and
tests/test_binder_session.py call it. cgroup.py makes the limits, chapters.py is the learner.
"""
from wmdist.session.memory import ChapterMemory, KernelMemory, SessionMemory, run_session

__all__ = ["ChapterMemory", "KernelMemory", "SessionMemory", "run_session"]
