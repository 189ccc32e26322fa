"""The share of data-parallel traffic hidden under backward, as the stored notebooks show it, is one number.

Chapter 01 measures it (`measured.remember("dp_hidden", ...)`) and chapter 09's placement model reads it
back (`measured.recall`). Their stored outputs must come from the same refresh, so a reader who opens
both on GitHub sees the same share; a refresh of one chapter alone (or a stale store) shows up here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SHARE = re.compile(r"(\d+)%, measured on this machine \(chapter 01, dp-buckets")


def stored_shares(path: Path) -> list[str]:
    """Every 'NN%, measured on this machine (chapter 01, dp-buckets ...' in the notebook's stored outputs."""
    cells = json.loads(path.read_text())["cells"]
    text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []))
    return SHARE.findall(text)


def test_chapters_01_and_09_store_the_same_hidden_share():
    kept = stored_shares(NOTEBOOKS / "01_data_parallel.ipynb")
    used = stored_shares(NOTEBOOKS / "09_putting_it_together.ipynb")
    assert len(kept) == 1 and len(used) == 1, (kept, used)     # each chapter prints it once
    assert kept == used, f"chapter 01 stores {kept[0]}%, chapter 09 {used[0]}%: refresh them together"


def test_chapter_09_says_the_share_is_plumbing_not_a_prediction():
    cells = json.loads((NOTEBOOKS / "09_putting_it_together.ipynb").read_text())["cells"]
    prose = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "plumbing, not as a forecast" in prose


@pytest.mark.parametrize("text, found", [("dp share hidden: 15%, measured on this machine (chapter 01, dp-buckets on 4",
                                          ["15"]),
                                         ("15%, stored with the course: chapter 01's dp-buckets", [])])
def test_the_pattern_reads_a_measured_share_only(tmp_path, text, found):
    nb = {"cells": [{"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "text": [text]}]}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert stored_shares(tmp_path / "x.ipynb") == found
