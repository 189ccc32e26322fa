"""What importing a chapter loads: ZeRO's modules pull in ZeRO's formulas, not every chapter's (issue 32 §3).

`wmdist.costs` names its topics lazily (PEP 562), so importing one topic, or a module that imports
one, runs the package's __init__ without loading the others. Each closure is measured in a fresh
interpreter: this one has imported half the package by the time a test runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wmdist import costs

ROOT = Path(__file__).resolve().parents[1]
# Cost topics of other chapters (04 tensor parallel, 05 pipelines, 06 ring attention, 07 scans,
# 08 diffusion, 09 meshes, 10 experts, 01's compression and algorithm curves): ZeRO uses none of them.
OTHER_CHAPTERS = ("allreduce", "compression", "diffusion", "experts", "mesh", "pipeline", "pipeline_stages",
                  "ring_attention", "scan", "tensor_parallel")


# One interpreter that has imported the third-party libraries (torch above all, 1-2 s a time) but nothing of
# wmdist forks a child per module asked for; the child imports it and reports what of wmdist it loaded. What a
# wmdist import loads does not depend on torch having been imported earlier or later.
_FORKING = r"""
import json, os, sys
import numpy, torch
assert not [m for m in sys.modules if m == "wmdist" or m.startswith("wmdist.")]
for line in sys.stdin:
    module = line.strip()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(module)
            out = {"loaded": sorted(m for m in sys.modules if m == "wmdist" or m.startswith("wmdist."))}
        except BaseException as err:
            out = {"error": f"{type(err).__name__}: {err}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read().decode()
    os.waitpid(pid, 0)
    print(answer or json.dumps({"error": "the child said nothing"}), flush=True)
"""


@pytest.fixture(scope="module")
def forking():
    """The forking interpreter (above), ended after this module's tests."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _FORKING], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def closure(forking: subprocess.Popen, module: str) -> list[str]:
    """The wmdist modules loaded by `import module` in a fresh interpreter (a fork of `forking`), sorted."""
    forking.stdin.write(module + "\n")
    forking.stdin.flush()
    line = forking.stdout.readline()
    assert line, f"the forking interpreter ended (exit {forking.poll()}) before answering for {module}"
    answer = json.loads(line)
    assert "error" not in answer, f"import {module} failed: {answer.get('error')}"
    return answer["loaded"]


@pytest.mark.parametrize("module", ["wmdist.memory.zero", "wmdist.memory.zero_demos", "wmdist.memory.chapter"])
def test_zero_loads_no_other_chapters_formulas(forking, module):
    loaded = closure(forking, module)
    assert "wmdist.costs.zero" in loaded                   # the closure is measured at all: ZeRO's own formulas
    foreign = [m for m in loaded if m.removeprefix("wmdist.costs.") in OTHER_CHAPTERS]
    assert foreign == [], f"import {module} loads other chapters' formulas: {foreign}"


# Cost topics every chapter may reach: the ring layouts and collectives, the mesh record, validators, units and
# the rounding bound. Each chapter's own topics beside them; the capstones (mesh, planner) reach every chapter's.
SHARED_TOPICS = {"collectives", "layout", "validate", "units", "rounding"}
OWN_TOPICS = {"data_parallel": {"allreduce", "compression", "scaling"}, "diffusion": {"diffusion"},
              "experts": {"experts"}, "latents": set(), "memory": {"zero"}, "pipeline": {"pipeline", "pipeline_stages"},
              "ring_attention": {"ring_attention"}, "scan": {"scan"}, "tensor_parallel": {"tensor_parallel"}}
CAPSTONES = {"mesh", "planner"}


def _algorithm_modules() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_algorithm_files import CHAPTERS, algorithm_files
    return [(chapter, ".".join(p.relative_to(ROOT).with_suffix("").parts))
            for chapter in CHAPTERS for p in algorithm_files(chapter)]


def test_every_chapter_is_placed():
    assert {c for c, _ in _algorithm_modules()} == set(OWN_TOPICS) | CAPSTONES


@pytest.mark.parametrize("chapter, module", [cm for cm in _algorithm_modules() if cm[0] not in CAPSTONES])
def test_a_chapters_algorithm_files_reach_only_its_own_and_the_shared_formulas(forking, chapter, module):
    """Issue 32 §3: following a chapter's algorithm leads a reader to its own costs topic and the shared ones."""
    topics = {m.removeprefix("wmdist.costs.") for m in closure(forking, module) if m.startswith("wmdist.costs.")}
    foreign = topics - SHARED_TOPICS - OWN_TOPICS[chapter]
    assert not foreign, f"import {module} loads other chapters' formulas: {sorted(foreign)}"


def test_the_face_alone_loads_no_topic(forking):
    assert [m for m in closure(forking, "wmdist.costs") if m.startswith("wmdist.costs.")] == []


def test_topics_are_the_files():
    files = sorted(p.stem for p in (ROOT / "wmdist" / "costs").glob("*.py") if p.stem != "__init__")
    assert sorted(costs.TOPICS) == files


@pytest.mark.parametrize("name", costs.__all__)
def test_every_public_name_resolves_to_its_topic(name):
    value = getattr(costs, name)
    if name in costs.TOPICS:
        assert value is sys.modules[f"wmdist.costs.{name}"]
    else:
        homes = [t for t in costs.TOPICS if name in vars(getattr(costs, t))]
        assert homes and all(vars(getattr(costs, t))[name] is value for t in homes)
    assert name in dir(costs)


def test_from_import_and_unknown_names():
    from wmdist.costs import ring_allreduce_bytes, scan
    assert ring_allreduce_bytes is costs.collectives.ring_allreduce_bytes and scan.handoff_bytes is not None
    with pytest.raises(AttributeError, match="'wmdist.costs' has no attribute 'handoff_bytes'"):
        costs.handoff_bytes                                # a scan formula: reached through costs.scan only
