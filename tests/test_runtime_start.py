"""Starting pools: from several threads at once, ranks never re-run the user's main program
(issue 19, Medium 3)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

RUNS = 20 if os.environ.get("WMDIST_STRESS") == "1" else 1      # the 20 in a row: WMDIST_STRESS=1

# Three threads make their first run at N = 1, 2, 3 at once. Every time the top of the program runs it
# appends a line to a file: the parent's run is the only one allowed.
PROGRAM = """\
import os, sys, threading
with open(sys.argv[1], "a") as f:
    f.write(f"{{__name__}} {{os.getpid()}}\\n")
import wmdist

def call(n, out):
    out[n] = wmdist.run(lambda ctx: ctx.rank, n, timeout=120)

def main():
    out = {{}}
    threads = [threading.Thread(target=call, args=(n, out)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT", sorted(out.items()))

{entry}
"""


@pytest.mark.parametrize("entry", ["main()", "if __name__ == '__main__':\n    main()"], ids=["unguarded", "guarded"])
def test_three_threads_starting_pools_at_once_never_rerun_main(tmp_path, entry):
    script = tmp_path / "threads.py"
    script.write_text(PROGRAM.format(entry=entry))
    for attempt in range(RUNS):
        log = tmp_path / f"top-{attempt}.log"
        proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "RESULT [(1, [0]), (2, [0, 1]), (3, [0, 1, 2])]" in proc.stdout, proc.stdout + proc.stderr[-3000:]
        tops = log.read_text().splitlines()
        assert len(tops) == 1 and tops[0].startswith("__main__ "), f"run {attempt}: main ran again: {tops}"
