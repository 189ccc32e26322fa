"""Chapter 09's mesh under real torchrun, as two "nodes" on 127.0.0.1 with two processes each.

2 nodes x 4 processes (the 8-rank meshes) also pass, but take about a minute
of this shared 2-core machine; the 4-rank mesh (2 dp x 2 tp) spreads the same
code over two nodes: its dp groups cross the "node" boundary, its tp groups
do not (tp partners are neighbouring ranks, and torchrun numbers ranks node
by node).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import free_port

from wmdist.comm import Mesh

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "WMDIST_BACKEND": "gloo"}


def test_mesh_demo_on_two_nodes_of_two_processes():
    port = free_port()
    procs = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "wmdist", "verify", "mesh-2d", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for node in (0, 1)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    stdout = outs[0][0]
    reports = json.loads(stdout[stdout.index("["):])
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("mesh-2d", 4, True)]
    exact = reports[0]["exact"]
    assert exact and all(row["measured"] == row["predicted"] for row in exact)
    dp_bytes = [row["measured"] for row in exact if row["quantity"] == "bytes sent" and row["phase"] == "dp/"]
    assert len(dp_bytes) == 4 and min(dp_bytes) > 0          # every rank sent gradients across the "nodes"
    mesh = Mesh(dp=2, tp=2)
    assert all({r // 2 for r in g} == {0, 1} for g in mesh.groups("dp"))   # dp groups span both nodes
    assert all(len({r // 2 for r in g}) == 1 for g in mesh.groups("tp"))   # tp groups stay inside one
