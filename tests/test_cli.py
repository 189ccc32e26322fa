"""The `wmdist` command: list, verify (table, JSON, exit status), usage errors, pipes and signals."""
from __future__ import annotations

from dataclasses import dataclass

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import alive, alive_after, patience

from wmdist.app.cli import main
from wmdist.course.report import Check, Report


def test_list_names_the_ring_demo(capsys):
    assert main(["list"]) == 0
    assert "ring-allreduce" in capsys.readouterr().out


def test_the_catalog_wmdist_list_prints_is_the_registry():
    from wmdist.registry import catalog
    from wmdist.registry.demos import registry
    built = [catalog.Demo(d.name, d.chapter, d.world_sizes, d.title) for d in registry().values()]
    missing = [f"    Demo({d.name!r}, {d.chapter!r}, {d.world_sizes!r}, {d.title!r})," for d in built
               if d not in catalog.DEMOS]
    assert not missing, "wmdist/registry/catalog.py lacks (or has another version of):\n" + "\n".join(missing)
    assert list(catalog.DEMOS) == built          # the same demos, in course order, none extra


@pytest.mark.parametrize("args", [["--help"], [], ["no-such-command"], ["list"], ["lab", "--help"],
                                  ["schedule", "1f1b", "-P", "4", "-M", "8"], ["schedule", "1f1b", "-P", "0"],
                                  ["memory", "--params", "7B", "--dtype", "bf16", "--zero", "2", "--dp", "8"],
                                  ["memory", "--model", "gpt3-6.7b", "--tp", "2", "--pp", "2", "--json"],
                                  ["memory", "--params", "-7B"], ["verify", "no-such-demo"], ["verify", "--help"]])
def test_commands_that_start_no_rank_import_no_torch(args):
    """Help, usage errors, list, schedule and memory answer without importing torch (seconds on a busy machine)."""
    probe = ("import sys\n"
             "from wmdist.app.cli import main\n"
             "try:\n"
             f"    code = main({args!r})\n"
             "except SystemExit as stop:\n"
             "    code = stop.code\n"
             "print('exit', code, 'torch imported:', 'torch' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(("exit 0 ", "exit 2 ")) and last.endswith("torch imported: False"), done.stderr


def test_the_cli_reads_torchrun_as_the_runtime_does(monkeypatch):
    from wmdist import runtime
    from wmdist.app.cli import TORCHRUN_VARS, under_torchrun
    for present in range(1 << len(TORCHRUN_VARS)):
        for i, name in enumerate(TORCHRUN_VARS):
            if present >> i & 1:
                monkeypatch.setenv(name, "0")
            else:
                monkeypatch.delenv(name, raising=False)
        assert under_torchrun() == runtime.under_torchrun()


def test_wmdist_run_is_still_the_package_entry_point():
    import wmdist
    from wmdist.runtime import RankFailure, run
    assert wmdist.run is run and wmdist.RankFailure is RankFailure and "run" in dir(wmdist)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        wmdist.nope


def test_verify_json_is_a_list_of_report_dicts(capsys):
    assert main(["verify", "ring-allreduce", "-n", "3", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["world_size"], r["passed"]) for r in reports] == [("ring-allreduce", 3, True)]
    assert {row["quantity"] for row in reports[0]["exact"]} == {"bytes sent", "rounds"}


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    wrong = Check(name="deliberately wrong", error=1.0, tolerance=0.0, reason="test")
    failing = Report(name="broken", world_size=2, checks=[wrong])
    monkeypatch.setattr("wmdist.registry.demos.verify",
                        lambda names=None, *, world_size=None, progress=None, prepared=None: [failing])
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "deliberately wrong" in out


def test_a_demo_that_breaks_while_running_is_a_fail_row_and_verify_goes_on(monkeypatch, capsys, one_thread):
    """Only errors raised before any process starts are usage errors: a ValueError from a demo's comparison (here a
    tolerance turned NaN after its ranks ran) is that demo's FAIL row with its reason, and the next demo runs."""
    from wmdist.course.experiment import Experiment, Verdict

    @dataclass(frozen=True)
    class Sized:
        world_size: int

    def breaks(spec, results):
        raise ValueError("tolerance must be a finite number >= 0.0, got nan")

    def toy(name, compare):
        return Experiment(name=name, title=name, chapter="99", world_sizes=(2,), spec=Sized,
                          ranks=lambda ctx, spec: ctx.rank, compare=compare)
    def fine(spec, results):
        return Verdict(checks=[Check(name="x", error=0.0, tolerance=1.0, reason="r")])
    demos = {"breaks": toy("breaks", breaks), "fine": toy("fine", fine)}
    monkeypatch.setattr("wmdist.registry.demos.registry", lambda: demos)
    assert main(["verify"]) == 1
    captured = capsys.readouterr()
    assert "usage" not in captured.err
    rows = [line.split() for line in captured.out.splitlines()[1:3]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("breaks", "2", "FAIL"), ("fine", "2", "PASS")]
    assert "broke while running: ValueError: tolerance must be a finite number >= 0.0, got nan" in captured.out


@pytest.mark.parametrize("args, message", [
    (["verify", "no-such-demo"], "unknown demo(s): no-such-demo"),
    (["verify", "-n", "0"], "expected a positive integer, got 0"),
    (["verify", "-n", "two"], "expected a positive integer, got 'two'"),
    (["verify", "-n", "64", "ring-allreduce"], "world size 64 is more local ranks than wmdist starts (at most 32)"),
    (["verify", "-n", "1", "latent-seeds"], "latent-seeds: seeds_demo needs world_size >= 2"),
    (["verify", "-n", "2", "activation-checkpointing"],
     "activation-checkpointing: world_size must be 1 (the demo runs in this process and starts no ranks), got 2"),
    (["bench", "nope"], "unknown benchmark(s): nope"),
])
def test_usage_errors_are_one_clear_line(args, message, capsys):
    # In this process (the same main() the console script calls); one case runs the real
    # `wmdist` executable below, since each start costs seconds of importing torch.
    try:
        status = main(args)
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and "Traceback" not in err
    assert err.count("\n") <= 2, "usage line and one error line"


def test_the_real_executable_table_usage_error_and_a_reader_that_stops():
    """Three `wmdist` commands in real processes, started together (each mostly imports torch):
    a table with exit status 0; a usage error, one line and exit status 2; and `verify ... | head`,
    whose reader leaves before the table is printed, exits quietly."""
    cmd = [sys.executable, "-m", "wmdist", "verify"]
    table, usage, piped = (subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                           for args in (["ring-allreduce", "-n", "2"], ["-n", "1", "latent-seeds"],
                                        ["ring-allreduce", "-n", "1"]))
    try:
        piped.stdout.close()
        piped_err = piped.stderr.read()
        out, err = table.communicate(timeout=300)
        assert table.returncode == 0, err
        assert "ring-allreduce  2" in out and "PASS" in out
        _, err = usage.communicate(timeout=300)
        assert usage.returncode == 2
        assert "latent-seeds: seeds_demo needs world_size >= 2" in err and "Traceback" not in err
        assert err.count("\n") <= 2, "usage line and one error line"
        assert piped.wait(timeout=300) == 0, piped_err
        assert "Traceback" not in piped_err and "BrokenPipe" not in piped_err
    finally:
        for proc in (table, usage, piped):
            proc.kill()


def test_verify_reports_progress_before_each_run_and_at_the_end():
    from wmdist.registry.demos import verify
    seen = []
    reports = verify(["ring-allreduce"], progress=lambda done, total, text: seen.append((done, total, text)))
    assert [r.world_size for r in reports] == list(range(1, 9))
    assert seen == [(i, 8, f"ring-allreduce on {i + 1} rank(s)") for i in range(8)] + [(8, 8, "done")]


def test_verify_refuses_a_named_demo_outside_its_sizes_before_anything_runs(no_processes):
    from wmdist.registry.demos import verify

    with pytest.raises(ValueError, match="latent-seeds: seeds_demo needs world_size >= 2"):
        verify(["latent-seeds"], world_size=1)
    with pytest.raises(ValueError,
                       match=r"activation-checkpointing: world_size must be 1 \(the demo runs in this process"):
        verify(["activation-checkpointing"], world_size=2)
    with pytest.raises(ValueError, match="at most 32"):
        verify(["ring-allreduce"], world_size=64)


def test_verify_at_one_size_leaves_out_the_demos_that_cannot_run_there():
    import numpy as np

    from wmdist.registry.demos import plan
    runs, left_out = plan(None, world_size=np.int64(2))
    assert ("activation-checkpointing", 2) not in runs
    assert "runs in this process" in left_out["activation-checkpointing"]
    assert ("ring-allreduce", 2) in runs and all(n == 2 for _, n in runs)
    assert "latent-seeds" in plan(None, world_size=1)[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_verify_ended_by_a_signal_leaves_no_directory_or_process(tmp_path, sig):
    # A short TMPDIR: the forkserver's socket path under it must fit Unix's 107 bytes, which tmp_path under
    # xdist (/tmp/pytest-of-root/pytest-NN/popen-gwN/test_verify_ended_..._N/) outgrows once NN reaches 3 digits.
    tmp = Path(tempfile.mkdtemp(prefix="wmdist-test-verify-", dir="/tmp" if os.path.isdir("/tmp") else None))
    with open(tmp_path / "stderr.txt", "w") as err, open(tmp_path / "stdout.txt", "w") as out:
        # The signal's default action, whatever this test inherited: under nohup SIGHUP is ignored, and
        # an ignored signal is left ignored (the verify then runs to its end and exits 0).
        proc = subprocess.Popen([sys.executable, "-m", "wmdist", "verify", "ring-allreduce", "-n", "3"],
                                stdout=out, stderr=err, env={**os.environ, "TMPDIR": str(tmp)},
                                preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    family = [proc.pid]
    try:
        deadline = time.monotonic() + patience(240)
        while not list(tmp.glob("wmdist-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)                            # the pool is starting
        assert proc.poll() is None, ("verify finished before it could be interrupted (status "
                                     f"{proc.returncode}); its table (a FAIL row names the check):\n"
                                     + (tmp_path / "stdout.txt").read_text()[-3000:]
                                     + "\nstderr:\n" + (tmp_path / "stderr.txt").read_text()[-3000:])
        time.sleep(0.5)
        family += [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(sig)
        assert proc.wait(timeout=patience(60)) == -sig, (tmp_path / "stderr.txt").read_text()
        assert alive_after(family, patience(10)) == []  # a few seconds quiet; longer on a loaded machine
    finally:
        for pid in alive(family):                       # pass or fail, nothing of it stays
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    left_in_tmp = sorted(p.name for p in tmp.iterdir())
    shutil.rmtree(tmp, ignore_errors=True)
    assert left_in_tmp == []
