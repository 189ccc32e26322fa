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


# --- the pins against repo2docker's base environment (no network: the lock and metadata are committed) ---------
DATA = ROOT / "tests" / "data" / "binder"
LOCK = DATA / "repo2docker-environment.py-3.11-linux-64.lock"


def _norm(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def _lock_versions() -> dict[str, str]:
    """Package -> version from the conda lock's explicit URLs (…/noarch/jupyter_server-2.17.0-pyh…_0.conda)."""
    import re
    found = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"https://\S+/(?:noarch|linux-64)/(.+)-([^-]+)-[^-]+\.(?:conda|tar\.bz2)#", line)
        if m:
            found[_norm(m.group(1))] = m.group(2)
    return found


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            assert version, f"binder/requirements.txt: {line!r} is not pinned with =="
            pins[_norm(name)] = version
    return pins


def _requires(name: str, version: str) -> list[str] | None:
    """Requires-Dist of name==version: the committed copy, else this venv's when it holds that exact version."""
    import importlib.metadata as md
    from packaging.requirements import Requirement
    committed = json.loads((DATA / "requires.json").read_text())["requires"]
    if f"{name}=={version}" in committed:
        return committed[f"{name}=={version}"]
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    reqs = [Requirement(r) for r in dist.requires or []]
    return [str(r) for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]


def binder_conflicts(pins: dict[str, str]) -> list[str]:
    """The conflicts pip would report installing `pins` over the lock: a pinned package whose requirement the
    result breaks, or a lock package left in place whose requirement on a package pip changed no longer holds.
    A pin's requirement that the lock's version misses makes pip upgrade that package; this venv's version (the
    same pins resolved) stands in for the one pip picks there."""
    import importlib.metadata as md
    from packaging.requirements import Requirement
    from packaging.version import Version
    lock = _lock_versions()
    after = {**lock, **{n: v.split("+")[0] for n, v in pins.items()}}
    changed, problems = set(pins), []
    for name, version in pins.items():
        reqs = _requires(name, version)
        if reqs is None:
            problems.append(f"no metadata for the pin {name}=={version} (not in this venv nor requires.json)")
            continue
        for req in map(Requirement, reqs):
            dep = _norm(req.name)
            if dep in after and not req.specifier.contains(Version(after[dep]), prereleases=True):
                if dep in pins:
                    problems.append(f"{name} {version} requires {req}, pinned {pins[dep]}")
                    continue
                after[dep], changed = md.version(dep), changed | {dep}
                if not req.specifier.contains(Version(after[dep]), prereleases=True):
                    problems.append(f"{name} {version} requires {req}; this venv has {after[dep]}")
    committed = json.loads((DATA / "requires.json").read_text())["requires"]
    for key, reqs in committed.items():
        name, version = key.split("==")
        if name in changed or lock.get(name) != version:
            continue                                   # reinstalled by pip, or not the lock's version
        for req in map(Requirement, reqs):
            dep = _norm(req.name)
            if dep in changed and not req.specifier.contains(Version(after[dep]), prereleases=True):
                problems.append(f"{name} {version} (base environment) requires {req}, but pip installs {after[dep]}")
    return problems


def test_binder_lock_copy_is_for_the_runtime_python():
    """The committed lock is repo2docker's for binder/runtime.txt's Python, and it has the Jupyter the pins meet."""
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime == "python-3.11" and "3.11" in LOCK.name
    lock = _lock_versions()
    assert lock["python"].startswith("3.11.") and {"notebook", "jupyterlab", "ipykernel"} <= set(lock)
    assert "jupyter_repo2docker-2026.4.0" in (DATA / "README.md").read_text()


def test_binder_pins_leave_no_resolver_conflict_over_the_base_environment():
    pins = _pins((BINDER / "requirements.txt").read_text())
    assert binder_conflicts(pins) == []


def test_binder_conflict_check_catches_the_old_jupyterlab_pin():
    """The check can fail: JupyterLab 4.6.6 without a notebook pin breaks the lock's notebook 7.4.7 (<4.5),
    which is the error the build printed before notebook was pinned."""
    pins = _pins((BINDER / "requirements.txt").read_text())
    pins.pop("notebook")
    problems = binder_conflicts(pins)
    assert any(p.startswith("notebook 7.4.7 (base environment) requires jupyterlab<4.5") for p in problems), problems


def test_binder_pins_ipykernel_the_suite_runs():
    """The course's kernel forks through ipykernel, so Binder gets the version these tests run on."""
    import importlib.metadata as md
    pins = _pins((BINDER / "requirements.txt").read_text())
    assert pins.get("ipykernel") == md.version("ipykernel")
    for name in ("jupyterlab", "ipywidgets", "numpy", "matplotlib", "cloudpickle", "psutil"):
        assert pins[name] == md.version(name), name
