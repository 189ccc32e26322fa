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
    assert {row["quantity"] for row in reports[0]["comm"]} == {"bytes sent", "rounds"}


def test_verify_table_and_exit_status_from_a_real_process():
    done = wmdist("verify", "ring-allreduce", "-n", "2")
    assert done.returncode == 0, done.stderr
    assert "ring-allreduce  2" in done.stdout and "PASS" in done.stdout


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    failing = Report("broken", 2, [Check("deliberately wrong", 1.0, 0.0, "test")])
    monkeypatch.setattr("wmdist.cli.verify", lambda names, world: [failing])
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
