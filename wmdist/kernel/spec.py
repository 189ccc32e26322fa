"""The course's kernelspec: Jupyter's "python3" kernel, started through the sharing launcher.

It is named `python3` so that every notebook (whose metadata names python3)
opens with it and a learner picks nothing. It is written into a directory that
Jupyter searches before the environment's own kernels (`JUPYTER_PATH`):
`wmdist lab` writes one for the server it starts, and Binder reads the
committed `binder/jupyter/kernels/python3/kernel.json` through `binder/start`.

    python -m wmdist.kernel install --dir D     write D/kernels/python3/kernel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

NAME = "python3"


def kernel_json(*, python: str = sys.executable) -> dict:
    """The kernelspec: ipykernel's own, with the launcher in front."""
    return {"argv": [python, "-m", "wmdist.kernel", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python", "interrupt_mode": "signal",
            "metadata": {"debugger": True, "wmdist": "kernels fork from one shared, preloaded process"}}


def install(directory: str, *, python: str = sys.executable) -> str:
    """Write the kernelspec under `directory`/kernels/python3; return the kernel.json path."""
    target = os.path.join(directory, "kernels", NAME)
    os.makedirs(target, exist_ok=True)
    path = os.path.join(target, "kernel.json")
    aside = f"{path}.{os.getpid()}"
    with open(aside, "w", encoding="utf-8") as f:
        json.dump(kernel_json(python=python), f, indent=1)
    os.replace(aside, path)                  # a kernel starting meanwhile reads the old file or the new, whole
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wmdist.kernel install")
    parser.add_argument("--dir", required=True, help="a directory to put in JUPYTER_PATH")
    parser.add_argument("--python", default=sys.executable, help="the interpreter kernels run (default: this one)")
    args = parser.parse_args(argv)
    print(install(args.dir, python=args.python))
    return 0
