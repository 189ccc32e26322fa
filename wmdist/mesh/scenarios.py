"""Chapter 09's named scenarios: the meshes its demos run, and the models its widget discussion compares (pure).

The notebook and the tests read these same objects, so a sentence in the
notebook ("dp leads for the tiny model, tp for the wide one, cp for the long
context") is tested on exactly the configurations it is about.

    MESH_3D, MESH_CP, MESH_2D   MeshSpec: the runs of demos mesh-3d, mesh-cp, mesh-2d
    MESH_3D_NARROW              MESH_3D at half its width: the case the chapter's prompt asks about
    TINY, WIDE, LONG_CONTEXT    PatternsConfig: the demos' tiny model, a wide model with a short
                                context and a narrower one with a long context, on 8-rank nodes
    PATTERN_SCENARIOS           the three, by the name the notebook prints
"""
from __future__ import annotations

from wmdist.mesh.patterns import PatternsConfig
from wmdist.mesh.spec import MeshSpec

MESH_3D = MeshSpec(dp=2, tp=2, pp=2, cp=1)       # 2 dp x 2 tp x 2 pp on 8 ranks
MESH_CP = MeshSpec(dp=2, tp=2, pp=1, cp=2)       # 2 dp x 2 cp x 2 tp on 8 ranks: ring attention inside tp blocks
MESH_2D = MeshSpec(dp=2, tp=2, pp=1, cp=1)       # 2 dp x 2 tp on 4 ranks: the mesh the torchrun test spreads
MESH_3D_NARROW = MeshSpec(dp=2, tp=2, pp=2, cp=1, width=16)    # the prompt's case (mesh/predictions.py)

TINY = PatternsConfig()                          # the demos' model: every message tiny, latency decides
WIDE = PatternsConfig(width=8192, heads=64, seq_len=2048, batch=512, layers=32, microbatches=8, dp=8, tp=8, pp=4,
                      ranks_per_node=8)          # tp's activations lead
LONG_CONTEXT = PatternsConfig(width=1024, heads=16, seq_len=131072, batch=16, layers=24, microbatches=4, dp=4, tp=4,
                              cp=8, ranks_per_node=8)   # cp's key/value ring leads, and is worth a node
PATTERN_SCENARIOS: dict[str, PatternsConfig] = {"tiny": TINY, "wide": WIDE, "long context": LONG_CONTEXT}

__all__ = ["LONG_CONTEXT", "MESH_2D", "MESH_3D", "MESH_3D_NARROW", "MESH_CP", "PATTERN_SCENARIOS", "TINY", "WIDE"]
