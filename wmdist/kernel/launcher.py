"""The process Jupyter starts for a kernel: it gets one forked from the zygote, relays signals, reports its exit.

Jupyter starts `python -m wmdist.kernel -f CONNECTION_FILE` in a new session and
treats that process as the kernel: it polls it to see whether the kernel lives,
sends SIGINT to its process group to interrupt, SIGTERM or SIGKILL to end it.
This launcher imports nothing heavy (it stays a few MB for the kernel's life):

1. It connects to the zygote of its Jupyter server (one per server process,
   found by the launcher's parent pid), starting it if there is none; a lock
   file keeps two kernels starting at once from starting two zygotes.
2. It sends the kernel's arguments, environment and working directory, and its
   own stdin, stdout and stderr (as file descriptors), and gets the pid of the
   forked kernel, which leads a process group of its own.
3. It relays every signal Jupyter sends to that process group, as Jupyter would
   have sent it to a kernel it started itself, and exits with the kernel's exit
   status when the zygote reports it. The kernel watches the launcher too and
   ends when the launcher ends (a SIGKILL cannot be relayed); if Jupyter itself
   ends first, the launcher ends the kernel, as ipykernel ends when its parent goes.

Whenever no zygote can be had (no fork, the zygote failed to start, it refused),
the launcher becomes a plain ipykernel with the same arguments and says so on
stderr, so a learner never loses a kernel to the sharing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
ZYGOTE_START_TIMEOUT_S = 180.0     # imports torch, IPython, matplotlib and the course: seconds, more under load
DISABLE_VARIABLE = "WMDIST_KERNEL_ZYGOTE"


class ZygoteUnavailable(RuntimeError):
    """No zygote could be reached, started or used; the launcher starts a plain kernel instead."""


def runtime_dir() -> str:
    """This user's directory for zygote sockets, locks and logs (mode 0700)."""
    path = os.path.join(tempfile.gettempdir(), f"wmdist-kernels-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def socket_path(home: int) -> str:
    """Where the zygote serving Jupyter process `home` listens."""
    return os.path.join(runtime_dir(), f"zygote-{home}.sock")


def main(argv: list[str]) -> int:
    """Run a kernel for Jupyter with ipykernel's arguments `argv` (e.g. ["-f", connection_file])."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # an interrupt before the kernel exists has nothing to stop
    if os.environ.get(DISABLE_VARIABLE, "1") == "0" or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        _become_plain_kernel(argv, why=None)
    try:
        conn, pid = _ask_for_kernel(os.getppid(), argv)
    except (OSError, ValueError, ZygoteUnavailable) as exc:
        _become_plain_kernel(argv, why=str(exc))
    return _relay_until_exit(conn, pid)


def _become_plain_kernel(argv: list[str], *, why: str | None) -> None:
    if why:
        print(f"wmdist kernel: {why}; starting a kernel of its own (not shared with other chapters)", file=sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock
    except OSError:
        sock.close()
        return None


def _zygote(home: int) -> socket.socket:
    """A connection to the zygote of `home`, started first if there is none (one starter at a time)."""
    path = socket_path(home)
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(os.path.join(runtime_dir(), f"zygote-{home}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)                 # another kernel may have started it while we waited
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)                   # a socket left by a zygote that was killed
        log_path = os.path.join(runtime_dir(), f"zygote-{home}.log")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "wmdist.kernel", "zygote", "--home", str(home), "--socket", path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + ZYGOTE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if process.poll() is not None:
                raise ZygoteUnavailable(f"the shared zygote exited with status {process.returncode} while "
                                        f"starting (its log: {log_path})")
            time.sleep(0.05)
        process.kill()
        raise ZygoteUnavailable(f"the shared zygote did not start within {ZYGOTE_START_TIMEOUT_S:.0f} s")


def _read_line(sock: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ZygoteUnavailable("the shared zygote closed the connection")
        data += chunk
    return json.loads(data)


def _ask_for_kernel(home: int, argv: list[str]) -> tuple[socket.socket, int]:
    """Ask the zygote for a kernel; return the connection (its exit status comes on it) and the kernel's pid."""
    for _ in range(3):                        # a stale zygote steps aside; the next one is fresh
        sock = _zygote(home)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "launcher": os.getpid()}
        socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        sock.settimeout(ZYGOTE_START_TIMEOUT_S)   # a fork takes milliseconds; a zygote that never answers is gone
        reply = _read_line(sock)
        sock.settimeout(None)
        if "pid" in reply:
            return sock, int(reply["pid"])
        sock.close()
        if not reply.get("stale"):
            raise ZygoteUnavailable(f"the shared zygote refused: {reply.get('error', reply)}")
    raise ZygoteUnavailable("the shared zygote stayed stale")


def _relay_until_exit(conn: socket.socket, pid: int) -> int:
    """Relay signals to the kernel's process group until the zygote reports its exit status."""
    def relay(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    for sig in RELAYED:
        signal.signal(sig, relay)
    try:
        parent = os.pidfd_open(os.getppid())
    except OSError:
        parent = None
    while parent is not None and conn not in select.select([conn, parent], [], [])[0]:
        relay(signal.SIGTERM, None)          # Jupyter ended without ending its kernel: as ipykernel would, end
        os.close(parent)
        parent = None
    try:
        code = int(_read_line(conn)["exit"])
    except (OSError, ValueError, KeyError, ZygoteUnavailable):
        return _wait_without_zygote(pid)
    if code < 0:                                  # ended by a signal: say so in one line, end the same way
        print(f"wmdist kernel: the kernel (pid {pid}) was ended by {_signal_name(-code)}", file=sys.stderr,
              flush=True)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)  # (SIGKILL's cannot be set, nor need be)
        os.kill(os.getpid(), -code)
    return code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wait_without_zygote(pid: int) -> int:
    """The zygote is gone (killed): wait for the kernel itself; its status is lost with the zygote."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return 1
    while not select.select([fd], [], [], 1.0)[0]:
        pass
    return 1
