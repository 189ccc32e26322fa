"""Values kept from one chapter for a later one (wmdist/base/measured.py).

Round trip, fallback said, bad values refused.
"""
from __future__ import annotations

import json

import pytest

from wmdist.base.measured import STORED, KeptValue, recall, remember


def test_a_remembered_share_comes_back_with_its_source(tmp_path):
    path = tmp_path / "measured.json"
    kept = remember("dp_hidden", 0.42, source="chapter 01, 4 ranks", path=path)
    assert kept == KeptValue(0.42, "chapter 01, 4 ranks", True) == recall("dp_hidden", path=path)
    assert "measured on this machine" in recall("dp_hidden", path=path).describe()
    remember("dp_hidden", 0.1, source="again", path=path)                   # a re-run replaces it
    assert recall("dp_hidden", path=path).value == 0.1


@pytest.mark.parametrize("content", [None, "not json", json.dumps([1, 2]), json.dumps({"dp_hidden": {"value": 7}}),
                                     json.dumps({"dp_hidden": {"value": float("nan"), "source": "x"}})])
def test_without_a_usable_measurement_the_stored_value_is_used_and_said(tmp_path, content):
    path = tmp_path / "measured.json"
    if content is not None:
        path.write_text(content)
    got = recall("dp_hidden", path=path)
    assert got == KeptValue(*STORED["dp_hidden"], False)
    assert "run chapter 01 to use your own" in got.describe() and "stored with the course" in got.describe()


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), float("inf")])
def test_a_share_outside_0_to_1_is_refused(tmp_path, value):
    with pytest.raises(ValueError, match="dp_hidden must be a share from 0 to 1"):
        remember("dp_hidden", value, source="x", path=tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_an_unknown_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        remember("dp_hiddn", 0.5, source="x", path=tmp_path / "m.json")
    with pytest.raises(ValueError, match="name must be one of"):
        recall("dp_hiddn", path=tmp_path / "m.json")
