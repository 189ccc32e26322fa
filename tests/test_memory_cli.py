"""`wmdist memory` as people type it: counts like 7B, the fp32 accumulation buffer, public model presets."""
from __future__ import annotations

import argparse
import json

import pytest

from wmdist.app.cli import main
from wmdist.memory import presets
from wmdist.memory.command import VALUE_FLAGS, add_memory_parser, join_signed_values
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes

G = 10 ** 9


def _cli(argv):
    return main(["memory", *argv])


def test_cli_json_and_table(capsys):
    assert _cli(["--params", str(G), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == per_rank_bytes(MemoryConfig(params=G)) and out["optimizer_state"] == 8 * G
    assert _cli(["--params", "10", "--zero", "3", "--dp", "4", "--rank", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 8
    assert _cli(["--params", str(G), "--dtype", "fp16", "--master-weights", "--zero", "1", "--world-size", "8"]) == 0
    table = capsys.readouterr().out
    assert "rank 0 of 8" in table and "ZeRO-1" in table and "(dp=8" in table
    lines = {ln.split()[0]: ln.split() for ln in table.splitlines()[1:]}
    assert lines["optimizer_state"][1:4] == [str(10 ** 9), "1.00", "GB"]   # 2 fp32 moments of P/8
    assert lines["master_weights"][1:4] == [str(5 * 10 ** 8), "500.00", "MB"]
    assert lines["total"][1:4] == [str(55 * 10 ** 8), "5.50", "GB"]        # 4P + 12P/8
    assert _cli(["--params", str(G), "--binary"]) == 0
    assert "7.45 GiB" in capsys.readouterr().out


@pytest.mark.parametrize("argv,word", [
    (["--params", "-5"], "argument --params: expected a whole parameter count from 0 to 1e18"),
    (["--params", "-7B"], "argument --params: expected a whole parameter count from 0 to 1e18, such as 7B, 1.5B, "
                          "70M, 7.5e9 or 7500000000, got '-7B'"),
    (["--params=-7B"], "got '-7B'"), (["--params", "2e18"], "from 0 to 1e18"),
    (["--params", "7500000000.5"], "such as 7B, 1.5B, 70M"),
    (["--zero", "1"], "error: --params: give a parameter count (e.g. --params 7B) or --model (one of gpt2-xl,"),
    (["--model", "gpt2-xl", "--seq-len", "0"], "--seq-len: seq_len must be an integer >= 1, got 0"),
    (["--model", "gpt2-xl", "--layers", "0"], "--layers: layers must be an integer >= 1, got 0"),
    (["--params", "7B", "--layers", "0"], "--layers: layers must be an integer >= 1, got 0"),
    (["--model", "gpt2-xl", "--pp", "64"], "--pp: pp must be an integer from 1 to 48 (gpt2-xl has 48 layers"),
    (["--params", "7B", "--layers", "4", "--pp", "8"], "--pp: pp must be an integer from 1 to 4 (--layers gives 4"),
    (["--params", "7B", "--dp", "0"], "--dp: dp must be an integer >= 1, got 0"),
    (["--params", "7B", "--bogus"], "unrecognized arguments: --bogus"),
    (["--params", "10", "--zero", "4"], "--zero: zero_stage"),
    (["--params", "10", "--grad-accum-dtype", "fp7"], "--grad-accum-dtype: grad_accum_dtype"),
    (["--params", "10", "--dtype", "fp13"], "--dtype: param_dtype"),
    (["--params", "10", "--tp", "3", "--world-size", "8"], "divisible"),
    (["--params", "10", "--dp", "3", "--world", "8"], "--world-size 8 != dp"), (["--params", "10", "--rank", "2"], "--rank: rank must be < world size 1"),
])
def test_cli_errors(capsys, argv, word):
    with pytest.raises(SystemExit) as exc:
        _cli(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(("wmdist memory: error:", "wmdist: error:"))   # one line, no usage
    assert "_whole_number" not in err and "parse_count" not in err      # no internal names leak


def test_signed_values_are_joined_to_their_flag_only():
    assert join_signed_values(["memory", "--params", "-7B", "--dp", "-2", "--json", "-h"]) == \
        ["memory", "--params=-7B", "--dp=-2", "--json", "-h"]
    assert join_signed_values(["memory", "--json", "-5"]) == ["memory", "--json", "-5"]     # not a value flag
    parser = argparse.ArgumentParser()
    add_memory_parser(parser.add_subparsers())
    memory = next(iter(parser._subparsers._group_actions[0].choices.values()))
    takes_value = {o for a in memory._actions if a.nargs is None and a.option_strings and a.const is None
                   for o in a.option_strings}
    assert set(VALUE_FLAGS) == takes_value                   # the list cannot drift from the parser


@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False)])
def test_under_torchrun_only_rank_0_prints_a_usage_error(monkeypatch, capsys, rank, printed):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for argv in (["memory", "--zero", "1"], ["memory", "--params", "x"], ["schedule", "gpipe", "-P", "0"], ["nope"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2                         # every rank exits with the usage status
        err = capsys.readouterr().err
        assert (err.count("\n") == 1 and ": error: " in err) if printed else err == ""


def test_a_world_of_a_trillion_ranks_is_computed_in_closed_form(capsys):
    """ZeRO-3 over dp = 10**12 (a list of dp chunk sizes would not fit in memory): 7B elements, one each."""
    cfg = MemoryConfig(params=7 * G, zero_stage=3, dp=10 ** 12)
    first, last = per_rank_bytes(cfg, rank=0), per_rank_bytes(cfg, rank=10 ** 12 - 1)
    assert (first["parameters"], first["gradients"], first["optimizer_state"]) == (4, 4, 8)   # rank < 7e9: 1
    assert last["total"] == 0                                                                # rank >= 7e9: 0
    assert _cli(["--params", "7B", "--dp", "1000000000000", "--zero", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 16
    assert _cli(["--params", "7B", "--dp", "1000000000000", "--zero", "3"]) == 0
    assert "rank 0 of 1000000000000" in capsys.readouterr().out


@pytest.mark.parametrize("text,count", [("7B", 7 * G), ("1.5B", 15 * 10 ** 8), ("70M", 7 * 10 ** 7),
                                        ("7.5e9", 75 * 10 ** 8), ("7500000000.0", 75 * 10 ** 8), ("1e9", G),
                                        ("1_000", 1000), ("12k", 12000), ("0.5T", 5 * 10 ** 11)])
def test_cli_accepts_counts_as_people_type_them(capsys, text, count):
    assert _cli(["--params", text, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == per_rank_bytes(MemoryConfig(params=count))


def test_fp32_gradient_accumulation_buffer_gives_20_bytes_per_parameter(capsys):
    """bf16 params (2) + bf16 grads (2) + fp32 accumulation buffer (4) + fp32 master (4) + Adam (8)."""
    cfg = MemoryConfig(params=G, param_dtype="bf16", grad_accum_dtype="fp32", optimizer="adam", master_weights=True)
    b = per_rank_bytes(cfg)
    assert b["total"] == 20 * G and b["gradients"] == 6 * G
    assert per_rank_bytes(MemoryConfig(params=G, param_dtype="bf16", grad_dtype="fp32",
                                       master_weights=True))["total"] == 18 * G
    z2 = per_rank_bytes(MemoryConfig(params=G, param_dtype="bf16", grad_accum_dtype="fp32", master_weights=True,
                                     zero_stage=2, dp=8))
    assert z2["gradients"] == 6 * G // 8                      # the buffer shards with the gradients
    assert _cli(["--params", "1B", "--dtype", "bf16", "--grad-accum-dtype", "fp32", "--master-weights", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 20 * G


def test_presets_count_parameters_and_activations_as_published():
    gpt2 = presets.PRESETS["gpt2-xl"]
    assert gpt2.params == 1_557_611_200                       # GPT-2 XL's published count, from its shape
    assert abs(presets.PRESETS["gpt3-6.7b"].params / 6.7e9 - 1) < 0.01
    assert abs(presets.PRESETS["gpt3-175b"].params / 175e9 - 1) < 0.01
    m = presets.PRESETS["gpt3-6.7b"]
    s, h, a = 4096, 4096, 32
    assert m.activation_bytes_per_token(s) * s == s * h * (34 + 5 * a * s / h)   # Korthikanti et al., per layer
    fields = presets.preset_fields("gpt3-6.7b", seq_len=4096)
    cfg = MemoryConfig(**fields, param_dtype="bf16", master_weights=True, zero_stage=2, dp=8)
    assert per_rank_bytes(cfg)["activations"] == 32 * s * h * (34 + 5 * a * s / h)
    ck = per_rank_bytes(MemoryConfig(**fields, checkpointing=True))["activations"]
    assert ck == 32 * s * 2 * h + s * h * (34 + 5 * a * s / h)   # every layer's 16-bit input + one layer
    for tp, sp in ((4, False), (4, True), (8, False)):      # the TP-replicated part: Korthikanti's 10 of 34
        b = per_rank_bytes(MemoryConfig(**fields, tp=tp, sequence_parallel=sp))["activations"]
        per_layer = s * h * (34 + 5 * a * s / h) / tp if sp else s * h * (10 + 24 / tp + 5 * a * s / (h * tp))
        assert b == 32 * per_layer
    assert presets.preset_fields("gpt2-xl")["seq_len"] == 1024
    with pytest.raises(ValueError, match="model must be one of"):
        presets.preset_fields("llama")


def test_cli_preset_with_and_without_checkpointing(capsys):
    argv = ["--model", "gpt3-6.7b", "--dtype", "bf16", "--master-weights", "--zero", "2", "--dp", "8",
            "--seq-len", "4096"]
    assert _cli([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert _cli([*argv, "--checkpointing", "--json"]) == 0
    ckpt = json.loads(capsys.readouterr().out)
    assert plain["parameters"] == ckpt["parameters"] == 2 * presets.PRESETS["gpt3-6.7b"].params
    assert ckpt["activations"] < plain["activations"] / 10
    assert _cli(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("gpt3-6.7b, rank 0 of 8") and "within a step the peak is higher" in text
    assert "Korthikanti" in presets.__doc__ and "16-bit" in presets.__doc__
