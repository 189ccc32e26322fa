"""`wmdist lab`: open the course in JupyterLab, on chapter 00, from any shell (also as root).

    wmdist lab                        JupyterLab on notebooks/, chapter 00 open; prints its URL
    wmdist lab --port 9000            another port (the default 8888 if free, else any free one)
    wmdist lab -- --ip 0.0.0.0        anything after `--` goes to JupyterLab unchanged

A bare `jupyter lab notebooks/00_start_here.ipynb` refuses to start as root (containers, many
cloud notebooks) and picks its own port and token, so a script cannot know where it serves.
This command fixes both before handing over: it adds `--allow-root` when the effective user
is root, chooses the port (and tells JupyterLab not to try others), and sets the token
through the environment (`JUPYTER_TOKEN`, kept if already set), so the one line it prints,

    wmdist lab: open http://localhost:8888/lab/tree/00_start_here.ipynb?token=...

is the address JupyterLab then serves: a --port already in use is refused before anything
starts (LabError, which `wmdist` prints as its one-line `error:`), rather than printing an
address that another program answers. One Ctrl-C stops the server (JupyterLab would otherwise
ask "Shut down this Jupyter server (y/[n])?" and carry on after 5 s without an answer). It
also names the torch build installed (CPU or CUDA), which pip does not say. The notebooks
folder is the server's root: `--notebooks DIR`,
else `./notebooks`, else the one beside this package in a checkout (an editable install).
A browser is opened only where there is a display to open it on (not on a headless Linux
shell, where the printed URL is what the reader needs). The server's python3 kernel is the
course's (wmdist/kernel): kernels fork from one preloaded process, so many open chapters
share torch's memory (`WMDIST_KERNEL_ZYGOTE=0` for plain kernels).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

START = "00_start_here.ipynb"
DEFAULT_PORT = 8888


class LabError(ValueError):
    """Why `wmdist lab` cannot start, found before JupyterLab is started (the CLI prints it as a usage error)."""


def add_parser(subparsers: Any) -> None:
    """Register `lab` on an argparse subparsers object."""
    p = subparsers.add_parser("lab", help="open the course in JupyterLab on chapter 00 (prints the URL; works as root)",
                              description=__doc__.splitlines()[0],
                              epilog="Arguments after `--` are passed to JupyterLab as they are.")
    p.add_argument("--notebooks", type=Path,
                   help="the course's notebooks folder (default: ./notebooks or the checkout's)")
    p.add_argument("--port", type=int, help=f"port to serve on (default {DEFAULT_PORT} if free, else a free one)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser, only print the URL")
    p.add_argument("jupyter_args", nargs="*", metavar="-- JUPYTER_ARGS", help=argparse.SUPPRESS)


def find_notebooks(given: Path | None) -> Path:
    """The folder holding the course's start notebook, or LabError saying where it looked."""
    checkout = Path(__file__).resolve().parents[1] / "notebooks"
    candidates = [given] if given is not None else [Path.cwd() / "notebooks", checkout]
    for folder in candidates:
        try:
            if (folder / START).is_file():
                return folder.resolve()
        except OSError:          # a name too long for the file system, a folder we may not read: not the course
            continue
    looked = ", ".join(str(c) for c in candidates)
    raise LabError(f"no {START} in {looked}; run it from a checkout of the course or pass --notebooks DIR")


def _port_free(port: int) -> bool:
    """Whether a server could listen on `port` now (SO_REUSEADDR as the server sets it, so a port a closed
    server left in TIME_WAIT counts as free, and one another program listens on does not)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(requested: int | None) -> int:
    """`requested` if it is free (LabError if not); else 8888 when free, else a port the kernel hands out as free."""
    if requested is not None:
        if not 0 < requested < 65536:
            raise LabError(f"--port must be in 1..65535, got {requested}")
        if not _port_free(requested):
            raise LabError(f"--port {requested} is in use by another program; pass another port, "
                           "or leave --port out to take a free one")
        return requested
    if _port_free(DEFAULT_PORT):
        return DEFAULT_PORT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_display() -> bool:
    """Whether a browser could be shown: always off Linux, else only with an X or Wayland display."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def torch_build() -> str:
    """The installed torch's version and which build it is, read from its metadata (no import)."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    cuda = any(n.startswith("nvidia-") for n in names) or "+cu" in version
    return f"torch {version} ({'a CUDA build' if cuda else 'the CPU build'})"


def sharing_kernel_dir() -> str:
    """A directory whose kernels/python3 is the course's kernel, for JUPYTER_PATH (searched before the
    environment's own): every notebook's kernel then forks from one preloaded process (wmdist/kernel)."""
    from wmdist.kernel import launcher, spec

    which = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]      # one per interpreter: two `wmdist lab`s
    directory = os.path.join(launcher.runtime_dir(), f"jupyter-{which}")  # from two venvs keep their own
    spec.install(directory)
    return directory


def jupyter_command(notebooks: Path, port: int, *, root: bool, browser: bool, extra: list[str]) -> list[str]:
    """The JupyterLab command line `wmdist lab` runs (pure, so tests can read it)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={notebooks}", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.default_url=/lab/tree/{START}",
           f"--ServerApp.open_browser={browser}", "--ServerApp.answer_yes=True"]    # one Ctrl-C stops it
    if root:
        cmd.append("--allow-root")
    return cmd + list(extra)


def main(args: argparse.Namespace) -> int:
    """Print where the course will be served, then become the JupyterLab server (exec, so signals reach it)."""
    notebooks = find_notebooks(args.notebooks)
    port = choose_port(args.port)
    env = dict(os.environ)
    token = env.setdefault("JUPYTER_TOKEN", secrets.token_hex(24))
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [sharing_kernel_dir(), env.get("JUPYTER_PATH")]))
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    cmd = jupyter_command(notebooks, port, root=root, browser=has_display() and not args.no_browser,
                          extra=args.jupyter_args)
    print(f"wmdist lab: the course in {notebooks}, {torch_build()}{', as root' if root else ''}", flush=True)
    print(f"wmdist lab: open http://localhost:{port}/lab/tree/{START}?token={token}", flush=True)
    os.execve(sys.executable, cmd, env)
    return 0      # not reached: execve replaces this process
