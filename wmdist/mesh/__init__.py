"""Chapter 09, putting it together: one world model on a dp x tp x pp x cp mesh, every axis counted.

The capstone: the only chapter that imports the others, through their
public functions (tests/test_layers.py allows it for this folder alone).

The algorithm is in step.py (the rank function: four axis views of the context, chapter 05's mailbox and
schedules, ring all-reduce of gradient buckets over cp and dp, SGD with momentum) and stage.py (one rank's
share of the model: chapter 04's BlockShard, chapter 06's ring attention); neither imports the harness.
The rest checks it:

    spec.py       MeshSpec: model, data, the four degrees; refused before any process starts (pure)
    scenarios.py  the named meshes the demos run and the models the notebook compares (pure)
    reference.py  the same step on one device, and the derived tolerances
    demos.py      mesh-3d (2dp x 2tp x 2pp), mesh-cp (2dp x 2cp x 2tp), mesh-2d (2dp x 2tp, for torchrun);
                  ledger by axis == costs.mesh, bytes held == the memory calculator
    patterns.py   the comm-patterns widget's model: four patterns side by side, Mesh orders on a
                  two-level machine (pure)
    tables.py, figures.py, panel.py   the notebook's tables, figures and widget
    exercises.py  which ranks share my group along an axis (pure)
    warm.py, calibrate.py   chapter 11's small end: warm steps timed in parts; operators per stage counted
                  and what an operator and a message cost these ranks, measured apart from the step

The per-axis formulas and the exact parameter layout live in wmdist.costs.mesh.
"""
