"""Counted communication: everything a rank sends or receives goes through here.

    ledger.py       Ledger, Record and `counted`, the one place a record is written
    context.py      Context (rank, world size, ledger, the rank process's cached groups: runtime.resources)
    p2p.py          send, recv, isend, irecv (Pending handles), exchange
    collectives.py  all_reduce, all_gather, reduce_scatter, broadcast, all_to_all (+ _single, uneven), barrier
    ring.py         hand-written ring reduce-scatter, all-gather and all-reduce
    ring_rounds.py  their rounds, pipelined: each chunk sent as pieces, added and forwarded as they land
    mesh.py         Mesh: which global rank sits at which (dp, cp, tp, pp) coordinate (pure)
"""
from wmdist.comm.collectives import (all_gather, all_reduce, all_to_all, all_to_all_single, barrier, broadcast,
                                     reduce_scatter)
from wmdist.comm.context import Context
from wmdist.comm.ledger import COMPLETED, Ledger, Record, counted
from wmdist.comm.mesh import Mesh
from wmdist.comm.p2p import Pending, exchange, irecv, isend, nbytes, recv, send
from wmdist.comm.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

__all__ = ["COMPLETED", "Context", "Ledger", "Mesh", "Pending", "Record", "all_gather",
           "all_reduce", "all_to_all", "all_to_all_single", "barrier", "broadcast", "counted", "exchange", "irecv",
           "isend", "nbytes", "recv", "reduce_scatter", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter",
           "send"]
