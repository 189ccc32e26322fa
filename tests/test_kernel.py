"""The course's kernel (wmdist/kernel) through Jupyter's own client: a kernel forked from the server's zygote
runs code with the course preloaded, looks like a freshly started kernel, is interrupted, restarted and shut down
as Jupyter expects, ends with its launcher, and falls back to a plain ipykernel when asked or refused.

Every test ends what it starts, pass or fail: each Kernel is shut down by the fixture that made it (also when it
failed to start), and at the module's end every zygote serving this process is killed with its kernels. Waits for
a kernel or zygote to answer are conftest.patience(): 180 s on an idle machine, more under load."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from conftest import alive, alive_after, patience
from wmdist.kernel import launcher, spec

REPO = Path(__file__).resolve().parents[1]
CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", launcher.DISABLE_VARIABLE, "WMDIST_NEIGHBOURHOOD",
           "WMDIST_POOL_IDLE_S", "JUPYTER_PATH")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A sitecustomize.py on the kernels' PYTHONPATH: every kernel's zygote loads it, so touching it makes that
    zygote stale without touching a file anyone else's zygote loaded."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "sitecustomize.py").write_text('"""Loaded by the zygote of tests/test_kernel.py; touched to make it stale."""\n')
    return folder


@pytest.fixture(scope="module")
def base_env(site) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"                          # every kernel of this module's zygote, and the zygote
    return env


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> KernelSpecManager:
    folder = tmp_path_factory.mktemp("jupyter")
    spec.install(str(folder))
    return KernelSpecManager(kernel_dirs=[str(folder / "kernels")])


class Kernel:
    """A kernel started by a KernelManager in this process, with its stderr in a file."""

    def __init__(self, specs: KernelSpecManager, env: dict[str, str], cwd: Path, stderr: Path):
        self.km = KernelManager(kernel_name=spec.NAME, kernel_spec_manager=specs)
        assert self.km.kernel_spec.argv == spec.kernel_json()["argv"]
        self.stderr_path = stderr
        self._err = open(stderr, "w")                    # open while it lives: a restart starts with it again
        self.kc = None
        self.pid = None
        try:
            self.km.start_kernel(env=env, cwd=str(cwd), stderr=self._err)
            self.kc = self.km.client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=patience(180))
            self.pid, self.ppid = self.json("import os; print(json.dumps([os.getpid(), os.getppid()]))")
        except BaseException:
            self.shutdown()                              # a kernel that never answered ends all the same
            raise

    @property
    def launcher(self) -> int:
        return self.km.provisioner.pid

    def run(self, code: str, timeout: float = 120) -> tuple[str, list[dict]]:
        """Run a cell; return what it printed and the data it displayed (fails on an error)."""
        out: list[str] = []
        shown: list[dict] = []

        def keep(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] in ("display_data", "execute_result"):
                shown.append(msg["content"]["data"])
            elif msg["msg_type"] == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=keep)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out), shown

    def json(self, code: str):
        """Run `code`, which prints one JSON line (json is imported for it); return it parsed."""
        return json.loads(self.run("import json\n" + code)[0].strip().splitlines()[-1])

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def shutdown(self) -> None:
        """End the kernel and its launcher, however far it got (idempotent)."""
        if self.kc is not None:
            self.kc.stop_channels()
        try:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        finally:
            if self.pid is not None and alive([self.pid]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)   # stuck in C code: what the zygote would do 5 s later
            self._err.close()


@pytest.fixture(scope="module")
def kernels(specs, base_env, tmp_path_factory):
    """start(env=..., cwd=...) -> a Kernel; every one shut down at the end of the module."""
    started: list[Kernel] = []
    folder = tmp_path_factory.mktemp("kernels")

    def start(*, env: dict[str, str] | None = None, cwd: Path | None = None) -> Kernel:
        started.append(Kernel(specs, env or base_env, cwd or REPO, folder / f"kernel{len(started)}.stderr"))
        return started[-1]
    start.started = started
    try:
        yield start
    finally:
        for k in started:
            k.shutdown()
        end_zygotes_of(os.getpid())


def zygotes_of(home: int) -> list[psutil.Process]:
    """The zygotes serving the process `home` (found by their command line)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[3:6] == ["zygote", "--home", str(home)]:
            found.append(p)
    return found


def end_zygotes_of(home: int) -> None:
    """Kill the zygotes serving `home` and every kernel they forked (a zygote otherwise lives while `home` does)."""
    for zygote in zygotes_of(home):
        with contextlib.suppress(psutil.Error):
            for p in [*zygote.children(recursive=True), zygote]:
                p.kill()


@pytest.fixture(scope="module")
def pair(kernels, base_env, tmp_path_factory):
    """Two kernels of one zygote, the second with its own working directory and one variable of its own."""
    cwd = tmp_path_factory.mktemp("cwd")
    first = kernels(env={**base_env, "WMDIST_TEST_FIRST_ONLY": "1"})
    second = kernels(env={**base_env, "WMDIST_TEST_MARK": "second kernel"}, cwd=cwd)
    return first, second, cwd


def _zygote_of(pid: int) -> psutil.Process:
    return psutil.Process(pid).parent()


def test_kernels_fork_from_one_zygote_with_torch_loaded(pair):
    first, second, _ = pair
    for k in (first, second):
        assert k.json("import sys; print(json.dumps('torch' in sys.modules "
                      "and 'wmdist.registry.demos' in sys.modules))")
        zygote = _zygote_of(k.pid).cmdline()
        assert zygote[1:5] == ["-m", "wmdist.kernel", "zygote", "--home"] and zygote[5] == str(os.getpid()), zygote
        assert k.pid != k.launcher and psutil.Process(k.launcher).ppid() == os.getpid()
    assert first.ppid == second.ppid                     # one zygote for this process's kernels


def _fresh(env: dict[str, str], code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_each_kernel_looks_freshly_started(pair, base_env):
    first, second, cwd = pair
    draws = "import random, numpy, torch; print(json.dumps([torch.randn(4).tolist(), numpy.random.rand(4).tolist()," \
            " random.random()]))"
    a, b = first.json(draws), second.json(draws)
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2], (a, b)
    threads = "import torch; print(torch.get_num_threads())"
    assert second.json(threads) == int(_fresh(base_env, threads))
    seen = second.json("import os, matplotlib; print(json.dumps([os.getcwd(), os.environ.get('WMDIST_TEST_MARK'), "
                       "'WMDIST_TEST_FIRST_ONLY' in os.environ, __name__, matplotlib.get_backend()]))")
    assert seen[:4] == [os.path.realpath(cwd), "second kernel", False, "__main__"], seen
    assert "inline" in seen[4], seen
    _, shown = second.run("import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()")
    assert any("image/png" in data for data in shown), shown
    _, shown = first.run("import matplotlib.pyplot as plt\nplt.plot([0, 1], [0, 1]);")    # no show(): as in a
    assert any("image/png" in data for data in shown), shown                              # notebook, it shows


def _probe_widget_control(k: Kernel) -> str:
    """What a page's widget manager does at every connection: open a "jupyter.widget.control" comm and ask for the
    widgets' states. Returns the kernel's answer on that comm: "update_states" or "comm_close"."""
    import uuid
    comm_id = uuid.uuid4().hex
    for kind, content, meta in (("comm_open", {"comm_id": comm_id, "target_name": "jupyter.widget.control",
                                               "data": {}}, {"version": "1.0.0"}),
                                ("comm_msg", {"comm_id": comm_id, "data": {"method": "request_states"}}, {})):
        k.kc.shell_channel.send(k.kc.session.msg(kind, content, metadata=meta))
    while True:
        msg = k.kc.get_iopub_msg(timeout=patience(60))
        if msg["content"].get("comm_id") != comm_id:
            continue
        if msg["msg_type"] == "comm_close":
            return "comm_close"
        if msg["msg_type"] == "comm_msg":
            return msg["content"]["data"].get("method", "?")


def test_a_forked_kernel_answers_the_widget_managers_probe(pair):
    """The zygote imported ipywidgets before any kernel existed, so the import could not register its comm targets;
    the forked kernel registers them itself. Without them the kernel answers the page's probe with a comm_close,
    which every other page on that kernel logs as "Comm not found for comm id" (issue 33 §2)."""
    first, _, _ = pair
    targets = first.json("import comm; print(json.dumps(sorted(comm.get_comm_manager().targets)))")
    assert {"jupyter.widget", "jupyter.widget.control"} <= set(targets), targets
    assert _probe_widget_control(first) == "update_states"


def test_threads_as_a_fresh_process_has_them_whatever_the_zygote_was_started_with(kernels, base_env):
    """The zygote was started with OMP_NUM_THREADS=1 (base_env); a kernel started without it, or with a count
    torch would not use, must still have the threads a fresh process of its environment has."""
    threads = "import torch; print(torch.get_num_threads())"
    for env in ({k: v for k, v in base_env.items() if k != "OMP_NUM_THREADS"}, {**base_env, "OMP_NUM_THREADS": "64"}):
        k = kernels(env=env)
        try:
            assert k.json(threads) == int(_fresh(env, threads)), env.get("OMP_NUM_THREADS")
        finally:
            k.shutdown()


def test_interrupt_stops_a_cell_and_the_kernel_goes_on(pair):
    first = pair[0]
    # stop_on_error=False: with it, ipykernel aborts requests that reach it before it has finished failing this
    # cell (it sends the reply first, then starts aborting), and under load the next cell was one of them: an
    # "aborted" reply in a clean-clone CI run. The same race, and the same fix, as in test_runtime_kernel.py.
    # Short sleeps, as a learner's long cell is a loop: a SIGINT whose handler runs after the interpreter's last
    # check but before the sleep's system call starts does not end that call (CPython on POSIX), and one 120 s
    # sleep then outlived the 20 s below in a clean-clone CI run. A signal the relay lost still fails the test.
    code = "import time\nprint('sleeping', flush=True)\nfor _ in range(2400):\n    time.sleep(0.05)"
    msg_id = first.kc.execute(code, stop_on_error=False)
    while True:                  # the cell is in the learner's code (an interrupt before that is ipykernel's race)
        msg = first.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream" \
                and "sleeping" in msg["content"]["text"]:
            break
    first.km.interrupt_kernel()
    reply = first.kc.get_shell_msg(timeout=20)           # well before the 120 s of sleeps would end
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    assert first.json("print(6 * 7)") == 42


def test_restart_gives_a_new_kernel_and_shutdown_leaves_nothing(kernels, pair):
    k = kernels()
    old = [k.pid, k.launcher]
    k.run("x = 1")
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=180)
    pid, ppid = k.json("import os; print(json.dumps([os.getpid(), os.getppid()]))")
    assert pid not in old and ppid == pair[0].ppid
    assert k.json("print(json.dumps('x' in globals()))") is False
    assert alive_after(old, 15) == []
    current = [pid, k.launcher]
    k.shutdown()
    assert alive_after(current, 15) == []


def test_the_kernels_exit_status_is_the_launchers(kernels):
    k = kernels()
    k.kc.execute("import os; os._exit(3)")
    assert k.km.provisioner.process.wait(timeout=30) == 3
    assert alive_after([k.pid], 15) == []


def test_a_killed_launcher_ends_its_kernel_and_the_ranks(kernels):
    k = kernels()
    ranks = k.json(textwrap.dedent("""
        import os, wmdist
        from multiprocessing import forkserver
        pids = wmdist.run(lambda ctx: os.getpid(), 2)
        print(json.dumps(pids + [forkserver._forkserver._forkserver_pid]))"""))
    assert len(ranks) == 3 and alive(ranks) == ranks
    os.kill(k.launcher, signal.SIGKILL)
    assert alive_after([k.pid], 15) == [], "the kernel outlived its launcher"
    assert alive_after(ranks, 15) == [], "ranks or their forkserver outlived the kernel"
    k.km.provisioner.process.wait(timeout=5)


def test_zygote_off_gives_a_plain_ipykernel(kernels, base_env):
    k = kernels(env={**base_env, launcher.DISABLE_VARIABLE: "0"})
    assert k.pid == k.launcher and k.ppid == os.getpid()     # the launcher became ipykernel itself
    assert k.json("import sys; print(json.dumps('torch' in sys.modules))") is False
    assert "wmdist kernel:" not in k.stderr()


MANAGER = r'''
import json, os, sys
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[sys.argv[1]]))
with open(sys.argv[2], "w") as err:
    km.start_kernel(stderr=err)
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=float(sys.argv[3]))
out = []
kc.execute_interactive("import os; print(os.getpid(), os.getppid())", timeout=60,
                       output_hook=lambda m: out.append(m["content"].get("text", "")))
kernel, parent = map(int, "".join(out).split())
print(json.dumps({"launcher": km.provisioner.pid, "kernel": kernel, "parent": parent}), flush=True)
if sys.stdin.readline().strip() == "shutdown":
    kc.stop_channels()
    km.shutdown_kernel()
'''


def _manager(specs: KernelSpecManager, env: dict[str, str], stderr: Path) -> tuple[subprocess.Popen, dict]:
    """A Jupyter-server stand-in: a process of its own with one kernel; its pids once the kernel ran a cell."""
    folder = specs.kernel_dirs[0]
    proc = subprocess.Popen([sys.executable, "-c", MANAGER, folder, str(stderr), str(patience(180))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert line, f"the manager failed; kernel stderr:\n{stderr.read_text()}"
        return proc, json.loads(line)
    except BaseException:
        _end_manager(proc)
        raise


def _end_manager(proc: subprocess.Popen) -> None:
    """Kill the stand-in server, its kernels' launchers and its zygote with their kernels (a failed test's
    clean-up; a passing test has already seen them end)."""
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
    proc.kill()
    proc.wait()
    end_zygotes_of(proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_the_zygote_ends_after_its_server_and_last_kernel(specs, base_env, tmp_path, sig):
    """However the server ends (killed, terminated, interrupted), its kernel, launcher and zygote end with it."""
    proc, pids = _manager(specs, base_env, tmp_path / "kernel.stderr")
    try:
        zygote = psutil.Process(pids["parent"])
        assert zygote.cmdline()[3:6] == ["zygote", "--home", str(proc.pid)], zygote.cmdline()
        everything = [pids["launcher"], pids["kernel"], zygote.pid]
        assert alive(everything) == everything
        proc.send_signal(sig)                            # the server ends without ending its kernel itself
        proc.wait(timeout=patience(30))
        assert alive_after(everything, 20) == [], "the kernel, its launcher or the zygote outlived the server"
        assert not os.path.exists(launcher.socket_path(proc.pid))
    finally:
        _end_manager(proc)


THREADED = '''import sys, threading, time
if sys.argv[1:2] == ["zygote"]:         # only in the zygote: a thread makes forking it unsafe
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
'''


def test_a_zygote_with_a_thread_refuses_and_the_kernel_is_plain(specs, base_env, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(THREADED)
    env = {**base_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), base_env["PYTHONPATH"]])}
    stderr = tmp_path / "kernel.stderr"
    proc, pids = _manager(specs, env, stderr)
    zygotes = []
    try:
        assert pids["kernel"] == pids["launcher"] and pids["parent"] == proc.pid
        assert "the zygote has a thread" in stderr.read_text() and "starting a kernel of its own" in stderr.read_text()
        zygotes = [p.pid for p in psutil.process_iter(["cmdline"])
                   if (p.info["cmdline"] or [])[3:6] == ["zygote", "--home", str(proc.pid)]]
        assert len(zygotes) == 1                         # it started, and refused
    finally:
        try:
            proc.communicate("shutdown\n", timeout=patience(60))
        finally:
            _end_manager(proc)
    assert alive_after([pids["kernel"], *zygotes], 15) == []
    assert not os.path.exists(launcher.socket_path(proc.pid))


def test_a_changed_module_gives_the_next_kernel_a_new_zygote(pair, kernels, site):
    """Runs last: the module's kernels then come from the new zygote."""
    first, second, _ = pair
    module = site / "sitecustomize.py"
    assert first.json("import sys; print(json.dumps(sys.modules['sitecustomize'].__file__))") == str(module)
    stamp = module.stat()
    older = list(kernels.started)
    os.utime(module, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 2_000_000_000))
    fresh = kernels()
    old = psutil.Process(first.ppid)
    assert fresh.ppid != first.ppid and _zygote_of(fresh.pid).cmdline()[3:6] == ["zygote", "--home", str(os.getpid())]
    assert first.json("print(1 + 1)") == 2 and second.json("print(2 + 2)") == 4   # the old zygote's kernels go on
    assert kernels().ppid == fresh.ppid                  # the new zygote serves the next kernels
    assert old.is_running()                              # while its kernels live, it stays to report their exit
    for k in older:
        k.shutdown()
    assert alive_after([old.pid], 15) == [], "the stale zygote outlived its last kernel"


def test_a_kernel_stuck_in_c_code_is_killed_when_its_launcher_is(kernels):
    """Jupyter's SIGKILL reaches the launcher only; a kernel holding the GIL in C code (a regex that never ends)
    cannot run its own watcher, so the zygote kills its process group a few seconds after the launcher ends."""
    k = kernels()
    try:
        k.kc.execute("import re\nre.match(r'(a*)*b', 'a' * 40)")
        assert _busy(k.pid), "the cell did not start"
        os.kill(k.launcher, signal.SIGKILL)
        k.km.provisioner.process.wait(timeout=patience(5))
        assert alive_after([k.pid], 20) == [], "a kernel stuck in C code outlived its launcher"
    finally:
        k.shutdown()                 # pass or fail: a regex that never ends must not spin on after the test


def test_a_zygote_that_dies_takes_no_kernel_with_it(kernels):
    """The kernels are the zygote's children but end with their launchers, not with it (ipykernel's own parent
    watch, JPY_PARENT_PID, would end them when they are re-parented)."""
    k = kernels()
    zygote = psutil.Process(k.ppid)
    assert "zygote" in " ".join(zygote.cmdline())
    zygote.kill()                                       # it stays a zombie until its first launcher reaps it
    assert alive_after([zygote.pid], 10) == [] or zygote.status() == psutil.STATUS_ZOMBIE
    assert alive_after([k.pid], 6) == [k.pid], "the kernel died with the zygote"
    assert k.json("print(json.dumps(6 * 7))") == 42


def test_a_kernel_killed_with_sigkill_is_one_line_from_its_launcher(kernels):
    """The launcher ends as its kernel did (SIGKILL), saying so in one line, not with a traceback."""
    k = kernels()
    os.kill(k.pid, signal.SIGKILL)
    assert k.km.provisioner.process.wait(timeout=patience(30)) == -signal.SIGKILL
    err = k.stderr()
    assert "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if "wmdist kernel:" in ln] == \
        [f"wmdist kernel: the kernel (pid {k.pid}) was ended by SIGKILL"], err


def test_each_kernel_has_its_own_command_line(kernels):
    """Not the zygote's: sys.orig_argv is the kernelspec's command with this kernel's connection file, and `ps`
    shows this kernel (its title names its connection file; its name is wmdist-kernel)."""
    for k in (kernels(), kernels()):
        conn = k.km.connection_file
        assert k.json("import sys; print(json.dumps(sys.orig_argv))") == \
            [sys.executable, "-m", "wmdist.kernel", "-f", conn]
        process = psutil.Process(k.pid)
        title = " ".join(process.cmdline())
        assert "zygote" not in title and os.path.basename(conn) in title and "wmdist" in title, title
        assert process.name() == "wmdist-kernel"


def _busy(pid: int, *, within: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + patience(within)
    process = psutil.Process(pid)
    process.cpu_percent()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if process.cpu_percent() > 50:
            return True
    return False
