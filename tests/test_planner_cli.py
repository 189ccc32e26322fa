"""`wmdist plan`: a ranked table, one layout judged, and one-line usage errors (status 2) before any planning."""
from __future__ import annotations

import pytest

from wmdist.app import cli
from wmdist.planner.cli import size

BASE = ["plan", "--model", "megatron-1.7b", "--gpus", "32", "--gpu", "a100-80gb", "--seq", "2048",
        "--batch-tokens", "1M"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sizes_read_binary_suffixes():
    assert size("16M") == 16 * 2 ** 20 and size("8192") == 8192 and size("2k") == 2048


def test_the_table_lists_the_top_layouts_with_their_terms(capsys):
    code, out, err = _run([*BASE, "--top", "3"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "megatron-1.7b on 32 x a100-80gb" in lines[0] and "fitted to the published runs" in lines[0]
    assert lines[1].split()[:3] == ["#", "dp", "tp"] and "compute" in lines[1] and "bubble" in lines[1]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "3"]


def test_a_layout_is_judged(capsys):
    code, out, _ = _run([*BASE, "--layout", "dp=32,micro_batch=4,recompute=full"], capsys)
    assert code == 0
    assert "fits in 80.00 GB" in out and "MFU" in out and "compute" in out


def test_a_layout_that_does_not_fit_says_which_tensors(capsys):
    code, out, _ = _run(["plan", "--model", "gpt3-175b", "--gpus", "8", "--gpu", "a100-80gb", "--seq", "2048",
                         "--batch-tokens", "16k", "--layout", "dp=8,zero=0"], capsys)
    assert code == 0 and "does NOT fit" in out and "optimizer_state" in out


@pytest.mark.parametrize("change, words", [
    (["--model", "llama9"], "--model 'llama9' is not a preset; allowed:"),
    (["--gpu", "v100"], "--gpu 'v100' is not a GPU type; allowed:"),
    (["--cluster", "nowhere"], "--cluster 'nowhere' is not a cluster"),
    (["--gpus", "-16"], "argument --gpus: expected a positive size"),
    (["--seq", "0"], "argument --seq: expected a positive size"),
    (["--batch-tokens", "1000"], "--batch-tokens 1000 must be a whole number of --seq 2048 sequences"),
    (["--layout", "dp=16,tp=4"], "dp*tp*pp*cp = 16*4*1*1 = 64 must equal the GPU count 32"),
    (["--layout", "dp=32,tp=5"], "dp*tp*pp*cp"),
    (["--layout", "dp=4,tp=8,recompute=some"], "recompute must be one of"),
    (["--top", "500"], "--top must be from 1 to 100"),
])
def test_bad_input_is_one_line_and_status_2(change, words, capsys):
    argv = list(BASE)
    for flag, value in zip(change[::2], change[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and err.startswith("wmdist plan")


def test_plan_imports_no_torch():
    """Like the other planning commands, `wmdist plan` answers without importing torch."""
    import subprocess
    import sys
    probe = ("import sys\nfrom wmdist.app.cli import main\n"
             f"code = main({[*BASE, '--layout', 'dp=32,micro_batch=4']!r})\n"
             "print('exit', code, 'torch imported:', 'torch' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120)
    assert done.stderr.splitlines()[-1] == "exit 0 torch imported: False", done.stderr
