"""The answer to chapter 09's prompt: along which axis rank 0 of the 2 dp x 2 tp x 2 pp mesh sends the most
bytes in one training step, once the model is made half as wide as the one the page has just run.

The chapter's lesson is that the four patterns differ in kind and that which one leads is a fact
about the sizes, so its prompt asks for an axis (a `Choice`) about a size the page does not show
before the press (issue 33): the learner has seen the width-32 table and must carry each
pattern's growth down to width 16. The answer is read from a real run's ledger, axis by axis (the
"dp/", "tp/", "pp/", "cp/" phases), and set beside the axis costs.mesh.axis_traffic predicts. Here,
not in the notebook, so nothing above the prompt's buttons gives it away; it runs only at the press.

`busiest_axis_formula` is the pure half (no process): the formula's pick and its bytes per axis,
which tests/test_predict_sources.py looks for on the stored page.
"""
from __future__ import annotations

from wmdist.costs.mesh import TRAFFIC_AXES, axis_traffic
from wmdist.mesh import demos
from wmdist.mesh.scenarios import MESH_3D, MESH_3D_NARROW
from wmdist.course.report import Report
from wmdist.ui.choose import ChoiceAnswer


def largest(values: dict[str, float]) -> str:
    """The key of the largest value; ValueError on a tie, which would make the question unanswerable."""
    top = max(values.values())
    leaders = [k for k, v in values.items() if v == top]
    if len(leaders) != 1:
        raise ValueError(f"{' and '.join(leaders)} tie at {top}: no single axis sends the most")
    return leaders[0]


def axis_bytes(run: Report, rank: int) -> dict[str, int]:
    """Bytes `rank` sent along each axis, from the run's ledger (phases "dp/", "tp/", "pp/", "cp/")."""
    return {axis: run.measured(quantity="bytes sent", phase=f"{axis}/")[rank] for axis in TRAFFIC_AXES}


def busiest_axis_formula() -> tuple[str, dict[str, int]]:
    """The axis costs.mesh.axis_traffic says rank 0 of MESH_3D_NARROW sends the most bytes along, and the
    bytes it predicts per axis (pure: no process starts)."""
    spec = MESH_3D_NARROW
    predicted = {axis: t.bytes_sent for axis, t in axis_traffic(spec.shape, spec.mesh.coords(0)).items()}
    return largest(predicted), predicted


def busiest_axis() -> ChoiceAnswer:
    """One step of the 2 dp x 2 tp x 2 pp mesh at half the demo's width, on 8 ranks: the axis rank 0 sent the
    most bytes along, by the ledger, and the one costs.mesh predicts, with every axis's measured bytes."""
    spec = MESH_3D_NARROW
    run = demos.run_mesh(spec, spec.world_size, name="mesh-3d-narrow")
    if not run.passed:
        raise RuntimeError(f"the mesh run at width {spec.width} failed its checks:\n{run}")
    measured = axis_bytes(run, 0)
    formula, _ = busiest_axis_formula()
    wide, narrow = (demos.memory_config(s).param_pieces[0] for s in (MESH_3D, spec))
    return ChoiceAnswer(measured=largest(measured), formula=formula, values=measured,
                        formula_text=f"the largest of costs.mesh.axis_traffic at width {spec.width}",
                        why=f"tp carries activations, whose size is linear in the width: halving it halves tp's "
                            f"bytes. dp carries the gradient, and most parameters sit in width x width (or width "
                            f"x 4 width) matrices, so its bytes fall nearly fourfold: rank 0's share went from "
                            f"{wide:,} to {narrow:,} values (the embedding, positions and norms are only linear in "
                            f"the width). pp halves like tp, and cp sends nothing, as cp = 1. Narrow models "
                            "are activation-heavy, wide ones gradient-heavy, for the same batch and context")
