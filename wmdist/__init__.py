"""wmdist: learn distributed training of world models by running it on real processes."""
from wmdist.comm import Context, Ledger
from wmdist.launch import RankFailure, run, shutdown

__all__ = ["Context", "Ledger", "RankFailure", "run", "shutdown"]
__version__ = "0.1.0"
