"""Chapter 09 exercise: which ranks share my group along one mesh axis (pure)."""
from __future__ import annotations

from collections.abc import Iterator

from wmdist.course.exercises import Exercise


def axis_group_solution(rank: int, axis: str, dp: int, tp: int, pp: int, cp: int) -> tuple[int, ...]:
    """The global ranks that share every coordinate with `rank` except `axis`, in order of that coordinate.

    Layout (Mesh's default): tp varies fastest, then cp, then dp, then pp. A
    neighbour along an axis is `stride` ranks away, the product of the sizes
    of the faster axes.
    """
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    stride = 1
    for name in ("tp", "cp", "dp", "pp"):
        if name == axis:
            break
        stride *= sizes[name]
    coordinate = (rank // stride) % sizes[axis]
    first = rank - coordinate * stride
    return tuple(first + i * stride for i in range(sizes[axis]))


def axis_group_cases() -> Iterator[tuple[int, str, int, int, int, int]]:
    """(rank, axis, dp, tp, pp, cp) for every rank and axis of a few meshes, uneven sizes included."""
    for dp, tp, pp, cp in ((2, 2, 2, 1), (2, 2, 1, 2), (3, 2, 2, 1), (2, 4, 1, 1), (1, 2, 3, 2), (2, 3, 2, 2)):
        for axis in ("tp", "cp", "dp", "pp"):
            for rank in range(dp * tp * pp * cp):
                yield rank, axis, dp, tp, pp, cp


AXIS_GROUP = Exercise(
    name="my group along an axis",
    task="Return the global ranks in `rank`'s group along `axis` (one of 'dp', 'tp', 'pp', 'cp'), in order of "
         "that axis's coordinate, for a dp x tp x pp x cp mesh laid out with tp varying fastest, then cp, dp, pp.",
    reference=axis_group_solution,
    cases=axis_group_cases,
    hint="only tp partners are neighbouring ranks: the members of a group along an axis are `stride` apart, the "
         "product of the sizes of the axes that vary faster (tp, then cp, then dp)",
)

EXERCISES = [AXIS_GROUP]
