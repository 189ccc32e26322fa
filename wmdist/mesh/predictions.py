"""The answer to chapter 09's prompt: along which axis rank 0 of the 2 dp x 2 tp x 2 pp mesh sends the most
bytes in one training step.

The chapter's lesson is that the four patterns differ in kind and that which one leads is a fact
about the sizes, so its prompt asks for an axis (a `Choice`), not for one chapter's formula
applied again. The answer is read from the run's ledger, axis by axis (the "dp/", "tp/", "pp/",
"cp/" phases), and set beside the axis costs.mesh.axis_traffic predicts. Here, not in the
notebook, so nothing above the prompt's buttons gives it away (issue 33); it runs only at the press.
"""
from __future__ import annotations

from wmdist.costs.mesh import TRAFFIC_AXES, axis_traffic
from wmdist.mesh import demos
from wmdist.mesh.scenarios import MESH_3D
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


def busiest_axis() -> ChoiceAnswer:
    """One step of the 2 dp x 2 tp x 2 pp mesh on 8 ranks: the axis rank 0 sent the most bytes along, by the
    ledger, and the one costs.mesh predicts, with every axis's measured bytes."""
    spec = MESH_3D
    run = demos.mesh_3d_demo(spec.world_size)
    if not run.passed:
        raise RuntimeError(f"the mesh demo failed its checks:\n{run}")
    measured = axis_bytes(run, 0)
    predicted = {axis: t.bytes_sent for axis, t in axis_traffic(spec.shape, spec.mesh.coords(0)).items()}
    share = demos.memory_config(spec).param_pieces[0]
    return ChoiceAnswer(measured=largest(measured), formula=largest(predicted), values=measured,
                        formula_text="the largest of costs.mesh.axis_traffic",
                        why=f"each axis's bytes are the size of what its pattern carries: dp the rank's whole "
                            f"gradient share ({share:,} float32 values), 2(N-1)/N of it; tp only the (b, c, H) "
                            "activations, in 4 small all-reduces per block and microbatch (many messages, few "
                            "bytes); pp one boundary tensor per microbatch each way; cp nothing, as cp = 1. For "
                            "this tiny model the gradient outweighs the activations: see 'Reading the rows' below, "
                            "and the widget further down for sizes where another axis leads")
