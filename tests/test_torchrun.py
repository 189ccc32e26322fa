"""The same demo under real torchrun: one node with two processes, and two "nodes" on localhost."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import torchrun_env, torchrun_two_nodes

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
DEMO = ["-m", "wmdist", "verify", "ring-allreduce", "--json"]


def _reports(stdout: str) -> list[dict]:
    return json.loads(stdout[stdout.index("["):])


def test_torchrun_two_processes_on_one_node():
    done = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", *DEMO],
                          capture_output=True, text=True, timeout=240, env=torchrun_env())
    assert done.returncode == 0, done.stdout + done.stderr
    reports = _reports(done.stdout)        # rank 0 prints, rank 1 stays quiet
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 2, True)]
    assert done.stdout.count('"name": "ring-allreduce"') == 1


def test_torchrun_two_nodes_on_localhost():
    nodes = torchrun_two_nodes(1, DEMO, timeout=240)
    assert [code for code, _, _ in nodes] == [0, 0], nodes
    reports = _reports(nodes[0][1])
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 2, True)]
    # The ledger was recorded in both nodes' processes and matches the formula on each.
    assert [row["measured"] == row["predicted"] for row in reports[0]["exact"]] == [True] * 4
