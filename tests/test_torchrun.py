"""The same demo under real torchrun: one node with two processes, and two "nodes" on localhost."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import free_port

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
DEMO = ["-m", "wmdist", "verify", "ring-allreduce", "--json"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "WMDIST_BACKEND": "gloo"}


def _reports(stdout: str) -> list[dict]:
    return json.loads(stdout[stdout.index("["):])


def test_torchrun_two_processes_on_one_node():
    done = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", *DEMO],
                          capture_output=True, text=True, timeout=240, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    reports = _reports(done.stdout)        # rank 0 prints, rank 1 stays quiet
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 2, True)]
    assert done.stdout.count('"name": "ring-allreduce"') == 1


def test_torchrun_two_nodes_on_localhost():
    port = free_port()
    procs = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                               "--master-addr", "127.0.0.1", "--master-port", str(port), *DEMO],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for node in (0, 1)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    reports = _reports(outs[0][0])
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 2, True)]
    # The ledger was recorded in both nodes' processes and matches the formula on each.
    assert [row["measured"] == row["predicted"] for row in reports[0]["exact"]] == [True] * 4
