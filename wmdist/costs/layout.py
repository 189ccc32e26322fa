"""One rank layout for every chapter: which global rank sits at which (dp, cp, tp, pp) coordinate.

Pure (no torch): the memory calculator and the real process groups both ask
this object, so a calculator row and a run cannot disagree about which rank
is which. It sits here, with the closed forms, so the calculator (and `wmdist
memory`) can ask it without importing wmdist.comm, which imports torch; the
ranks reach it as wmdist.comm.Mesh (wmdist/comm/mesh.py re-exports it). `order`
lists the axes from fastest to slowest varying; the default
(tp, cp, dp, pp) puts tensor-parallel partners on neighbouring ranks, i.e. on
the fastest links of a node, as Megatron-LM does.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs.validate import require_int

# The four axes in the order a rank's coordinates are written (Mesh.coords, error messages); not the layout.
COORD_AXES = ("dp", "cp", "tp", "pp")
# The default rank layout: axes from fastest to slowest varying (tp partners on neighbouring ranks).
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")


@dataclass(kw_only=True, frozen=True)
class Mesh:
    """Degrees of data, tensor, pipeline and context parallelism; world_size is their product."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER    # fastest-varying axis first

    def __post_init__(self) -> None:
        for axis in COORD_AXES:
            require_int(axis, getattr(self, axis), 1)
        if sorted(self.order) != sorted(COORD_AXES):
            raise ValueError(f"order must name each of {COORD_AXES} once, got {self.order!r}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def size(self, axis: str) -> int:
        if axis not in COORD_AXES:
            raise ValueError(f"axis must be one of {COORD_AXES}, got {axis!r}")
        return getattr(self, axis)

    def coords(self, rank: int) -> dict[str, int]:
        """{"dp": .., "cp": .., "tp": .., "pp": ..} of a global rank."""
        rest = require_int("rank", rank, 0, high=self.world_size - 1)
        out = {}
        for axis in self.order:
            rest, out[axis] = divmod(rest, self.size(axis))
        return {axis: out[axis] for axis in COORD_AXES}

    def rank(self, **coords: int) -> int:
        """The global rank at these coordinates (missing axes are 0)."""
        unknown = set(coords) - set(COORD_AXES)
        if unknown:
            raise ValueError(f"unknown axes {sorted(unknown)}; axes are {COORD_AXES}")
        rank, stride = 0, 1
        for axis in self.order:
            c = require_int(axis, coords.get(axis, 0), 0, high=self.size(axis) - 1)
            rank += c * stride
            stride *= self.size(axis)
        return rank

    def axis_ranks(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks that share every coordinate of `rank` except `axis`, in order of that coordinate."""
        c = self.coords(rank)
        return tuple(self.rank(**{**c, axis: i}) for i in range(self.size(axis)))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group along `axis`, each in axis order, listed by their first rank."""
        seen = {self.axis_ranks(r, axis) for r in range(self.world_size)}
        return sorted(seen)
