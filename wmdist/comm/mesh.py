"""Mesh, the one rank layout: defined in wmdist.costs.layout (pure, importable without torch), named here too.

The ranks and their groups reach it as wmdist.comm.Mesh (or from this module); the memory
calculator imports it from wmdist.costs.layout, so `wmdist memory` never imports torch.
"""
from wmdist.costs.layout import COORD_AXES, DEFAULT_ORDER, Mesh

__all__ = ["COORD_AXES", "DEFAULT_ORDER", "Mesh"]
