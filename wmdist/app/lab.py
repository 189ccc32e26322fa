"""`wmdist lab`: open the course in JupyterLab, on chapter 00, from any shell (also as root).

    wmdist lab                        JupyterLab on notebooks/, chapter 00 open; prints its URL
    wmdist lab --port 9000            another port (the default 8888 if free, else any free one)
    wmdist lab -- --ip 0.0.0.0        anything after `--` goes to JupyterLab unchanged

A bare `jupyter lab notebooks/00_start_here.ipynb` refuses to start as root (containers, many
cloud notebooks) and picks its own port and token, so a script cannot know where it serves.
This command fixes both as it starts JupyterLab: it adds `--allow-root` when the effective user
is root, chooses the port (and tells JupyterLab not to try others), and sets the token
through the environment (`JUPYTER_TOKEN`, kept if already set), so the one line it prints,

    wmdist lab: open http://localhost:8888/lab/tree/00_start_here.ipynb?token=...

is the address JupyterLab then serves, printed once it answers HTTP 200 (JupyterLab takes
seconds, 6 to 16 s on a busy machine; an address printed sooner met "connection refused").
A --port already in use is refused before anything starts (LabError, which `wmdist` prints
as its one-line `error:`), rather than printing an address that another program answers. A
JupyterLab that exits before it answers (its output is above), or has not answered within
answer_wait (120 s on an idle machine, up to 8x under load), is a `wmdist lab: error:` line
and status 1.

JupyterLab runs as this process's child in a process group of its own, so that one signal
reaches it, from here: the first SIGINT (Ctrl-C), SIGTERM or SIGHUP that `wmdist lab` gets,
alone or with its group, goes on as one SIGTERM, on which JupyterLab shuts its kernels down
and exits; `wmdist lab` exits with its status. (In one group a terminal's Ctrl-C would reach
JupyterLab beside the one passed on, and two stop requests run its clean-up twice.) On Linux
PR_SET_PDEATHSIG sends it SIGTERM should `wmdist lab` be killed (SIGKILL). Its banner says
Control-C "(twice to skip confirmation)": a logging filter (OneCtrlC) makes it say once, and
answer_yes makes that true of a SIGINT sent to JupyterLab itself. It
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
import ctypes
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

START = "00_start_here.ipynb"
DEFAULT_PORT = 8888
ANSWER_WAIT = 120.0       # s to wait for JupyterLab's first 200 on an idle machine (it takes seconds)
PR_SET_PDEATHSIG = 1      # prctl(2): the signal a process gets when its parent dies
ONE_CTRL_C = "(once: no confirmation is asked)"


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
    checkout = Path(__file__).resolve().parents[2] / "notebooks"
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


class OneCtrlC(logging.Filter):
    """JupyterLab's banner says "Use Control-C to stop this server ... (twice to skip confirmation)"; under
    `wmdist lab` one Ctrl-C stops it (module docstring), so the banner is made to say that."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "(twice to skip confirmation)" in record.msg:
            record.msg = record.msg.replace("(twice to skip confirmation)", ONE_CTRL_C)
        return True


# Merged by traitlets into JupyterLab's own logging configuration: "console" is the handler it logs through.
LOGGING = {"filters": {"wmdist_one_ctrl_c": {"()": f"{__name__}.OneCtrlC"}},
           "handlers": {"console": {"filters": ["wmdist_one_ctrl_c"]}}}


def jupyter_command(notebooks: Path, port: int, *, root: bool, browser: bool, extra: list[str]) -> list[str]:
    """The JupyterLab command line `wmdist lab` runs (pure, so tests can read it)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={notebooks}", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.default_url=/lab/tree/{START}",
           f"--ServerApp.open_browser={browser}", "--ServerApp.answer_yes=True",    # a SIGINT asks nothing
           f"--ServerApp.logging_config={json.dumps(LOGGING)}"]                # the banner says one Ctrl-C
    if root:
        cmd.append("--allow-root")
    return cmd + list(extra)


def answer_wait(base: float, load: float, cores: int) -> float:
    """How long to wait for a server that answers within `base` s on an idle machine: `base` stretched by the
    load per core (1x idle, up to 8x), as a loaded machine starts JupyterLab that much later. A deadline for
    giving up on a server that will never answer, never a judgement of its speed."""
    return base * min(8.0, max(1.0, 1.0 + load / max(1, cores) - 0.5))


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _status(opener: Any, url: str) -> int | str:
    """The HTTP status `url` answers with, or why it did not answer."""
    import urllib.error

    try:
        with opener.open(url, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:
        return str(getattr(err, "reason", err))


def _child_setup(parent: int) -> Callable[[], None]:
    """What the server's process does before exec: a process group of its own, and (Linux) SIGTERM when
    `parent` dies; it exits at once if `parent` died before that could be arranged."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None   # loaded before fork

    def setup() -> None:
        os.setpgid(0, 0)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return setup


def _say(text: str) -> None:
    """One line on stderr, safe inside a signal handler (no buffered stream that the main code may be writing)."""
    os.write(2, f"{text}\n".encode())


def serve(cmd: list[str], env: dict[str, str], url: str, *, base_wait: float = ANSWER_WAIT, poll: float = 0.25) -> int:
    """Run `cmd` (the server) as a child; print "wmdist lab: open URL" once `url` answers HTTP 200; pass the first
    SIGINT, SIGTERM or SIGHUP on to it as SIGTERM; return its exit status (128+N if signal N ended it), or 1
    if it exits before it answers or has not answered within answer_wait(base_wait). The server never
    outlives this call: on any way out it is sent SIGTERM (SIGKILL 60 s later) and waited for."""
    import urllib.request

    server: subprocess.Popen[bytes] | None = None
    stops: list[int] = []            # the stop signals received
    forwarded: list[bool] = []       # whether the server has been sent its SIGTERM

    def forward() -> None:
        if server is not None and not forwarded:
            forwarded.append(True)
            server.send_signal(signal.SIGTERM)       # once: two stop requests would run its clean-up twice

    def on_signal(number: int, _frame: Any) -> None:
        stops.append(number)
        if len(stops) > 1:
            _say("wmdist lab: JupyterLab is stopping (it shuts its kernels down first)")
        forward()

    caught = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
    before = {number: signal.signal(number, on_signal) for number in caught}
    try:
        server = subprocess.Popen(cmd, env=env, preexec_fn=_child_setup(os.getpid()))
        if stops:                                    # a signal came while it was being started
            forward()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # localhost, never via a proxy
        started, allowed, last = time.monotonic(), answer_wait(base_wait, _load(), os.cpu_count() or 1), None
        while not stops:
            code = server.poll()
            if code is not None:
                _say(f"wmdist lab: error: JupyterLab exited with status {code} before it answered at "
                     f"{url.split('?')[0]} (its output is above)")
                return 1
            last = _status(opener, url)
            if last == 200:
                if not stops:
                    print(f"wmdist lab: open {url}", flush=True)
                break
            allowed = max(allowed, answer_wait(base_wait, _load(), os.cpu_count() or 1))
            if time.monotonic() - started > allowed:
                _say(f"wmdist lab: error: JupyterLab did not answer HTTP 200 at {url.split('?')[0]} within "
                     f"{allowed:.0f} s (last answer: {last}); stopping it")
                return 1
            time.sleep(poll)
        code = server.wait()
        return 128 - code if code < 0 else code
    finally:
        if server is not None and server.poll() is None:
            forward()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        for number, handler in before.items():
            signal.signal(number, handler)


def main(args: argparse.Namespace) -> int:
    """Start JupyterLab on the course and print its address once it answers; return once it has stopped."""
    notebooks = find_notebooks(args.notebooks)
    port = choose_port(args.port)
    env = dict(os.environ)
    token = env.setdefault("JUPYTER_TOKEN", secrets.token_hex(24))
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [sharing_kernel_dir(), env.get("JUPYTER_PATH")]))
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    cmd = jupyter_command(notebooks, port, root=root, browser=has_display() and not args.no_browser,
                          extra=args.jupyter_args)
    print(f"wmdist lab: the course in {notebooks}, {torch_build()}{', as root' if root else ''}", flush=True)
    print(f"wmdist lab: starting JupyterLab on port {port}; its address follows once it answers "
          "(one Ctrl-C stops it)", flush=True)
    return serve(cmd, env, f"http://localhost:{port}/lab/tree/{START}?token={token}")
