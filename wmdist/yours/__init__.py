"""Your own model, run the course's way: chapters 01, 03 and 04 on an nn.Module the course did not write.

    from wmdist.yours import Workload, data_parallel, zero, tensor_parallel

    work = Workload(model=lambda: MyNet(), loss=per_example_loss, batch=lambda step: (x[step], y[step]),
                    steps=3, optimizer="adam", lr=1e-2, seed=0)
    data_parallel(work, world_size=2)                 # ring all-reduce, vs one process and torch's DDP
    zero(work, stage=3, world_size=2)                 # flat-vector ZeRO-1/2/3, vs one process and
                                                      # ZeroRedundancyOptimizer (1) or FSDP2 (2, 3)
    tensor_parallel(first, second, x, world_size=2)   # two nn.Linears column -> row, vs one process

Each returns a Report, as every demo does: checks against one process (and torch's implementation),
with tolerances and their reasons, and the bytes each rank sent (and, for ZeRO, held) next to their
formulas, exactly. Bad input is refused before any process starts (workload.py says what is checked).
Functions defined in a notebook cell work: they travel to the ranks by value.

The algorithm is in training.py (data parallelism and ZeRO on any module) and
wmdist/tensor_parallel/layers.py (chapter 04's column and row layers); neither imports the harness
itself (this file does, to offer the checked functions at the top). The rest checks it: workload.py
(what a workload is, checked), refusals.py (what is refused before any process starts, named as found),
footprint.py (the memory a check takes, estimated and compared with what is available up front),
reference.py (one process, the gradient bound and the measured parameter tolerance), versus_torch.py (DDP, ZeroRedundancyOptimizer, FSDP2, counted), dp_check.py,
zero_check.py and tp_check.py (the public functions, their Experiments and Reports).
"""
from wmdist.yours.dp_check import data_parallel
from wmdist.yours.tp_check import tensor_parallel
from wmdist.yours.workload import Workload
from wmdist.yours.zero_check import zero

__all__ = ["Workload", "data_parallel", "tensor_parallel", "zero"]
