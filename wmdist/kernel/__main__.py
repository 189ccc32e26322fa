"""`python -m wmdist.kernel -f CONN` (a kernel, as Jupyter starts it), `... zygote ...`, `... install ...`.

Imports nothing heavy: the launcher must start in milliseconds and stay small.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["zygote"]:
        from wmdist.kernel import zygote
        return zygote.main(argv[1:])
    if argv[:1] == ["install"]:
        from wmdist.kernel import spec
        return spec.main(argv[1:])
    from wmdist.kernel import launcher
    return launcher.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
