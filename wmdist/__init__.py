"""wmdist: learn distributed training of world models by running it on real processes."""
from wmdist.comm import Context, Ledger, Mesh
from wmdist.runtime import RankFailure, run, shutdown

__all__ = ["Context", "Ledger", "Mesh", "RankFailure", "run", "shutdown"]
__version__ = "0.2.0"
