"""Binder: a fresh virtual environment built from binder/ alone executes the start notebook.

repo2docker runs `pip install -r binder/requirements.txt`, then `binder/postBuild`, and
launches through `binder/start`; this test does the same steps in a new venv. The one
difference: the `--extra-index-url` line (download.pytorch.org) is dropped, because this
machine reaches only the package registries; the pinned `torch==…+cpu` then resolves to the
local CPU wheel, the same build Binder gets from that index.
"""
from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def _sh(cmd: list[str], env_bin: Path, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {"PATH": f"{env_bin}:/usr/bin:/bin", "HOME": str(Path.home()), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_fresh_binder_environment_runs_the_start_notebook(tmp_path):
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    reqs = [ln for ln in lines if ln.strip() and not ln.startswith(("#", "--extra-index-url"))]
    assert any(ln.startswith("torch==") and ln.endswith("+cpu") for ln in reqs), "Binder must pin a CPU torch"
    (tmp_path / "requirements.txt").write_text("\n".join(reqs) + "\n")

    venv.create(tmp_path / "env", with_pip=True)
    bin_ = tmp_path / "env" / "bin"
    # --no-compile: the same packages without precompiling every module's bytecode (half of the
    # install's time, mostly torch); Python compiles what the notebook imports when it imports it.
    done = _sh([str(bin_ / "python"), "-m", "pip", "install", "-q", "--no-compile", "-r",
                str(tmp_path / "requirements.txt")], bin_, ROOT, 900)
    assert done.returncode == 0, done.stderr[-3000:]
    done = _sh([str(BINDER / "postBuild")], bin_, ROOT, 300)
    assert done.returncode == 0, done.stderr[-3000:]

    listed = _sh([str(bin_ / "python"), "-m", "pip", "list", "--format", "json"], bin_, ROOT, 120)
    packages = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert packages["torch"].endswith("+cpu")
    assert not [name for name in packages if name.startswith("nvidia")], "a CUDA dependency slipped in"
    assert "wmdist" in packages and "pytest" not in packages   # the course, not the test tools

    out = tmp_path / "executed.ipynb"
    done = _sh([str(BINDER / "start"), "jupyter", "nbconvert", "--to", "notebook", "--execute",
                "--ExecutePreprocessor.timeout=300", "--output", str(out),
                str(ROOT / "notebooks" / "00_start_here.ipynb")], bin_, ROOT, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads(out.read_text())["cells"]
    errors = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    shown = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                    for c in cells for o in c.get("outputs", []))
    assert "ring pass: not attempted yet." in shown             # the exercise stub reached its checker
    assert "ring-allreduce" in shown and "FAIL" not in shown     # and the verify table came out clean


def test_binder_kernel_is_the_sharing_launcher():
    """Through binder/start, Jupyter's python3 kernel is wmdist's launcher (kernels fork from one zygote),
    and the committed kernel.json is what `python -m wmdist.kernel install` writes, so the two cannot drift."""
    from wmdist.kernel import spec

    committed = json.loads((BINDER / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert committed == spec.kernel_json(python="python")
    listed = subprocess.run([str(BINDER / "start"), sys.executable, "-m", "jupyter_client.kernelspecapp", "list",
                             "--json"], capture_output=True, text=True, timeout=60, cwd="/")
    assert listed.returncode == 0, listed.stderr
    argv = json.loads(listed.stdout)["kernelspecs"]["python3"]["spec"]["argv"]
    assert argv[1:3] == ["-m", "wmdist.kernel"], argv
