"""Imported last by the forkserver (start._PRELOAD): make what it preloaded cheap to share with the ranks.

Every rank is forked from the forkserver, so the modules it imported are
shared copy-on-write pages. Two things would copy them into each rank:

- torch._dynamo (with sympy, about 800 modules): torch.optim imports it on
  the first optimizer a process builds (Optimizer.add_param_group is wrapped
  in torch._disable_dynamo). Imported in each rank, it cost 1 to 2 s per rank
  and brought an 8-rank pool from 450 MB to 1,455 MB (PSS, measured); imported
  here once, 616 MB and no delay.
- Python's cyclic garbage collector writes to every tracked object it visits,
  so a collection in a rank dirties the shared pages it walks. gc.freeze()
  moves everything imported so far out of its reach (measured: 616 -> 562 MB
  for 8 ranks and their parent after an optimizer step).

Importing torch._dynamo also creates an empty inductor cache directory
(torchinductor_<user>) in the temporary directory; nothing here compiles, so
one that this import created is removed again, as every pool leaves nothing
behind (docs/architecture.md).
"""
from __future__ import annotations

import gc
import os
import tempfile

_tmp = tempfile.gettempdir()
_before = set(os.listdir(_tmp))

import torch._dynamo  # noqa: E402,F401  (see above: imported for its side effect)

for _name in set(os.listdir(_tmp)) - _before:
    if _name.startswith("torchinductor_"):
        try:
            os.rmdir(os.path.join(_tmp, _name))        # only if still empty
        except OSError:
            pass

gc.collect()
gc.freeze()
