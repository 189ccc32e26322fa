"""Chapter 09's mesh under real torchrun, as two "nodes" on 127.0.0.1 with two processes each.

2 nodes x 4 processes (the 8-rank meshes) also pass, but take about a minute
of this shared 2-core machine; the 4-rank mesh (2 dp x 2 tp) spreads the same
code over two nodes: its dp groups cross the "node" boundary, its tp groups
do not (tp partners are neighbouring ranks, and torchrun numbers ranks node
by node).
"""
from __future__ import annotations

import json

from conftest import torchrun_two_nodes

from wmdist.comm import Mesh


def test_mesh_demo_on_two_nodes_of_two_processes():
    nodes = torchrun_two_nodes(2, ["-m", "wmdist", "verify", "mesh-2d", "--json"])
    assert [code for code, _, _ in nodes] == [0, 0], nodes
    stdout = nodes[0][1]
    reports = json.loads(stdout[stdout.index("["):])
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("mesh-2d", 4, True)]
    exact = reports[0]["exact"]
    assert exact and all(row["measured"] == row["predicted"] for row in exact)
    dp_bytes = [row["measured"] for row in exact if row["quantity"] == "bytes sent" and row["phase"] == "dp/"]
    assert len(dp_bytes) == 4 and min(dp_bytes) > 0          # every rank sent gradients across the "nodes"
    mesh = Mesh(dp=2, tp=2)
    assert all({r // 2 for r in g} == {0, 1} for g in mesh.groups("dp"))   # dp groups span both nodes
    assert all(len({r // 2 for r in g}) == 1 for g in mesh.groups("tp"))   # tp groups stay inside one
