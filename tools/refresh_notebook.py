"""Execute notebooks and store only the outputs nbval should check.

Usage: python tools/refresh_notebook.py notebooks/00_start_here.ipynb [...]

The course's convention (docs/notebooks.md): cells starting with the comment
`# NBVAL_CHECK_OUTPUT` keep their output, which becomes nbval's expectation;
every other cell is stored without output or execution count, and no widget
state is stored. Fails if a cell raised (unless marked NBVAL_RAISES_EXCEPTION)
or an output holds an absolute path of this machine.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK = "NBVAL_CHECK_OUTPUT"
RAISES = "NBVAL_RAISES_EXCEPTION"


def refresh(path: Path, timeout: int = 600) -> float:
    """Execute `path` in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    # store_widget_state=True: with False, nbclient fails on panels that draw into an Output
    # widget; the state is dropped from the metadata below anyway.
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            store_widget_state=True, resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    problems, count = [], 0
    home = str(Path(__file__).resolve().parents[2])
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors and RAISES not in cell.source:
            problems.append(f"cell {i} raised {errors[0].ename}: {errors[0].evalue}")
        if CHECK in cell.source:
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if "execution_count" in out:
                    out.execution_count = count
                if home in str(out):
                    problems.append(f"cell {i} output holds the local path {home}")
        else:
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    if problems:
        raise SystemExit(f"{path}:\n  " + "\n  ".join(problems))
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        print(f"{path}: executed in {refresh(path, args.timeout):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
