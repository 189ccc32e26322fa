"""A stand-in for JupyterLab that `wmdist lab` starts in tests/test_lab_server.py (through lab_runner.py):

    python fake_lab_server.py PORT DELAY REFUSALS [RELEASE]

It says its pid, refuses connections for DELAY s (JupyterLab takes seconds to listen), answers
503 to the first REFUSALS requests and 200 to the rest, saying "answering CODE" on its stdout
before each answer goes out (so in a shared pipe that line comes before anything the asker
prints on receiving it). REFUSALS < 0: it says why on stderr and exits 3 at once, as a server
that cannot start. It names each SIGTERM or SIGINT it gets and exits 0 one second after the
first (as JupyterLab shuts down), or once the file RELEASE exists, if given: a second stop
request sent to it meanwhile shows in its output.
"""
import http.server
import os
import signal
import sys
import threading
import time


def say(text: str) -> None:
    os.write(1, f"fake server: {text}\n".encode())      # unbuffered, and safe inside a signal handler


port, delay, refusals = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
release = sys.argv[4] if len(sys.argv) > 4 else None
say(f"pid {os.getpid()}")
if refusals < 0:
    os.write(2, b"fake server: cannot start, the port is haunted\n")
    sys.exit(3)
stops: list[int] = []


def on_signal(number: int, _frame: object) -> None:
    stops.append(number)
    say(signal.Signals(number).name)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
time.sleep(delay)
answered: list[str] = []


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answered.append(self.path)
        code = 200 if len(answered) > refusals else 503
        say(f"answering {code}")
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
while not stops:
    time.sleep(0.05)
if release is None:
    time.sleep(1.0)
while release is not None and not os.path.exists(release):
    time.sleep(0.05)
sys.exit(0)
