"""The `wmdist` command: list, verify (table, JSON, exit status) and usage errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wmdist.cli import main
from wmdist.report import Check, Report


def wmdist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wmdist", *args], capture_output=True, text=True, timeout=300)


def test_list_names_the_ring_demo(capsys):
    assert main(["list"]) == 0
    assert "ring-allreduce" in capsys.readouterr().out


def test_verify_json_is_a_list_of_report_dicts(capsys):
    assert main(["verify", "ring-allreduce", "-n", "3", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 3, True)]
    assert {row["quantity"] for row in reports[0]["exact"]} == {"bytes sent", "rounds"}


def test_verify_table_and_exit_status_from_a_real_process():
    done = wmdist("verify", "ring-allreduce", "-n", "2")
    assert done.returncode == 0, done.stderr
    assert "ring-allreduce  2" in done.stdout and "PASS" in done.stdout


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    failing = Report("broken", 2, [Check("deliberately wrong", 1.0, 0.0, "test")])
    monkeypatch.setattr("wmdist.cli.verify", lambda names, world, progress=None: [failing])
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "deliberately wrong" in out


@pytest.mark.parametrize("args, message", [
    (["verify", "no-such-demo"], "unknown demo(s): no-such-demo"),
    (["verify", "-n", "0"], "expected a positive integer, got 0"),
    (["verify", "-n", "two"], "expected a positive integer, got 'two'"),
    (["bench", "nope"], "unknown benchmark(s): nope"),
])
def test_usage_errors_are_one_clear_line(args, message):
    done = wmdist(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_verify_reports_progress_before_each_run_and_at_the_end():
    from wmdist.demos import verify
    seen = []
    reports = verify(["ring-allreduce"], progress=lambda done, total, text: seen.append((done, total, text)))
    assert [r.world_size for r in reports] == list(range(1, 9))
    assert seen == [(i, 8, f"ring-allreduce on {i + 1} rank(s)") for i in range(8)] + [(8, 8, "done")]


def test_verify_refuses_a_named_demo_below_its_minimum_world_size():
    from wmdist.demos import verify
    with pytest.raises(ValueError, match="latent-seeds need more than 1 rank"):
        verify(["latent-seeds"], world_size=1)


def test_progress_widget_follows_calls():
    from wmdist.ui.progress import Progress
    p = Progress("demos")
    p(2, 5, "zero-1 on 4 rank(s)")
    assert (p.bar.value, p.bar.max, p.label.value) == (2, 5, "zero-1 on 4 rank(s)")
