"""Sizes read from a user are bounded before anything is allocated: a flag, a variable or a
checkpoint's config.json that asks for a million heads or ten billion layers is a configuration
error (exit 2) naming it and the limit, never a 15 GB allocation or a MemoryError."""

import contextlib
import io

import ep_helpers
import pytest

from engine_patch import cli, qwen3_5_moe
from engine_patch.exit_codes import EXIT_CONFIG

clean_state = pytest.fixture(ep_helpers.clean_state)
clean_env = pytest.fixture(ep_helpers.clean_env)
BASE = ["--contexts", "1024", "--device", "cpu", "--no-self-test"]


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


TOO_BIG = {
    "heads": ({}, ["--heads", "1048576"], ["--heads 1048576", "<= 1024"]),
    "kv heads": ({}, ["--heads", "4096", "--kv-heads", "4096"], ["<= 1024"]),
    "env heads": ({"ENGINE_PATCH_HEADS": "1048576"}, [], ["ENGINE_PATCH_HEADS", "1024"]),
    "v1 limit": (
        {"ENGINE_PATCH_V1_MAX_SEQ_LEN": "524288"},
        [],
        ["ENGINE_PATCH_V1_MAX_SEQ_LEN must be an integer in [0, 65536]", "'524288'"],
    ),
    "num-seqs": ({}, ["--num-seqs", "100000000"], ["--num-seqs", "<= 65536"]),
    "contexts": ({}, ["--contexts", "99999999999"], ["--contexts", "<= 16777216"]),
    "tp": ({}, ["--tp", "99999999999"], ["--tp", "<= 1024"]),
}


@pytest.mark.parametrize("item", TOO_BIG)
def test_sizes_are_bounded_before_any_work(clean_env, monkeypatch, item):
    env, argv, expected = TOO_BIG[item]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = _run([*BASE, *argv])
    assert code == EXIT_CONFIG, err
    assert "Traceback" not in out + err
    for text in expected:
        assert text in err


@pytest.mark.parametrize(
    "layers, interval, message",
    [
        (10**10, 4, "num_hidden_layers must be an integer in [1, 4096], got 10000000000"),
        (40, 0, "full_attention_interval must be an integer in [1, 40], got 0"),
        (40, -1, "full_attention_interval must be an integer in [1, 40], got -1"),
        (40, 41, "full_attention_interval must be an integer in [1, 40], got 41"),
        (40, True, "full_attention_interval must be an integer in [1, 40], got True"),
    ],
)
def test_layer_pattern_is_bounded_before_it_is_built(layers, interval, message):
    """No transformers needed: the check runs before the list of layer kinds is built."""
    with pytest.raises(ValueError) as info:
        qwen3_5_moe.layer_pattern(layers, interval, None)
    assert message in str(info.value)


def test_layer_pattern_default_and_given():
    assert qwen3_5_moe.layer_pattern(8, 4, None)[3] == "full_attention"
    assert qwen3_5_moe.layer_pattern(2, 4, ("full_attention", "linear_attention")) == [
        "full_attention",
        "linear_attention",
    ]


def test_forced_prefill_backend_unavailable_is_a_configuration_error(clean_env, monkeypatch):
    """As decode's: ATTN_CORE_PREFILL_BACKEND=native on the CPU is the configuration's fault
    (exit 2), not a self-test that did not match (exit 1)."""
    monkeypatch.setenv("ATTN_CORE_PREFILL_BACKEND", "native")
    code, out, err = _run(BASE)
    assert code == EXIT_CONFIG, out + err
    assert "ATTN_CORE_PREFILL_BACKEND" in out + err
    assert "needs a CUDA device" in out + err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 64"),
        ('{"num_attention_heads": ' + "9" * 400 + "}", "num_attention_heads"),
        ("{not json", "not readable JSON"),
    ],
)
def test_model_config_is_read_bounded(clean_env, tmp_path, text, expected):
    """--model's config.json is parsed (bounded) before transformers sees it: a RecursionError or
    a 400-digit integer there is a configuration error naming the file, not exit 5."""
    (tmp_path / "config.json").write_text(text)
    code, out, err = _run([*BASE, "--model", str(tmp_path)])
    assert code == EXIT_CONFIG, err
    assert str(tmp_path / "config.json") in err and expected in err


def test_model_path_expands_tilde(clean_env, monkeypatch, tmp_path):
    """``--model=~/ckpt`` (no shell expansion after ``=``) names $HOME/ckpt."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    code, out, err = _run([*BASE, "--model=~/ckpt"])
    assert code == EXIT_CONFIG
    assert str(tmp_path / "ckpt" / "config.json") in err and "not readable JSON" in err
