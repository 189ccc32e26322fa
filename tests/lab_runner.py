"""`wmdist lab` with tests/fake_lab_server.py in place of JupyterLab (tests/test_lab_server.py):

    python lab_runner.py PORT DELAY REFUSALS BASE_WAIT [RELEASE]

runs the real CLI path (`wmdist lab --no-browser --port PORT`); only the server command and the
deadline's idle-machine base (lab.serve's base_wait, in s) are replaced; RELEASE goes to the
fake server.
"""
import functools
import sys
from pathlib import Path

from wmdist.app import lab
from wmdist.app.cli import main

port, delay, refusals, base_wait = sys.argv[1:5]
fake = str(Path(__file__).with_name("fake_lab_server.py"))
lab.jupyter_command = lambda *args, **kwargs: [sys.executable, fake, port, delay, refusals, *sys.argv[5:]]
lab.serve = functools.partial(lab.serve, base_wait=float(base_wait))
sys.exit(main(["lab", "--no-browser", "--port", port]))
