"""``engine-patch`` with bad input: a documented exit code, a message naming the argument or
variable, never a traceback, and under ``--json`` exactly one JSON object on stdout."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import ep_helpers
import pytest
import torch
from ep_helpers import DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.core.cache_layout import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
from attn_core.core.settings import FALSE_WORDS, TRUE_WORDS
from attn_core.core.shapes import DTYPE_NAMES
from attn_core.device.spec import DEVICE_SPECS
from engine_patch import cli
from engine_patch.exit_codes import EXIT_CONFIG, EXIT_INTERNAL, EXIT_OK, MEANINGS
from engine_patch.platform import PLATFORM_ENV

README = Path(__file__).parents[1] / "README.md"
BASE = ["--no-self-test", "--contexts", "1024"]  # bad arguments come after, and win
clean_state = pytest.fixture(ep_helpers.clean_state)
clean_env = pytest.fixture(ep_helpers.clean_env)


def _run(argv, as_json):
    """``main(argv)`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*argv, "--json"] if as_json else list(argv))
    return code, out.getvalue(), err.getvalue()


def _json_error(stdout, code):
    """stdout must be exactly one JSON object, carrying the error with the exit code."""
    report = json.loads(stdout)  # two objects, or text around one, raise here
    assert isinstance(report, dict) and report["exit_code"] == code
    assert report["error"]["exit_code"] == code
    return report["error"]


# Each item of issue 11's "engine-patch CLI" section: (env, argv, what the message must say).
ISSUE_ITEMS = {
    "v1 limit -5": (
        {"ENGINE_PATCH_V1_MAX_SEQ_LEN": "-5"},
        [],
        ["ENGINE_PATCH_V1_MAX_SEQ_LEN must be an integer in [0, 65536], got '-5'"],
    ),
    "head size 100": (
        {"ENGINE_PATCH_HEAD_SIZE": "100"},
        [],
        ["ENGINE_PATCH_HEAD_SIZE=100: head_size must be one of (64,", "got 100"],
    ),
    "platform bogus": (
        {PLATFORM_ENV: "bogus"},
        [],
        [f"{PLATFORM_ENV} must be one of iluvatar, generic, got 'bogus'"],
    ),
    "block size 7": (
        {"ENGINE_PATCH_BLOCK_SIZE": "7"},
        [],
        ["ENGINE_PATCH_BLOCK_SIZE=7: block_size must be one of (8, 16, 32), got 7"],
    ),
    "force maybe": ({"ENGINE_PATCH_FORCE": "maybe"}, [], ["ENGINE_PATCH_FORCE", "got 'maybe'"]),
    "num-seqs 0": ({}, ["--num-seqs", "0"], ["argument --num-seqs: must be an integer >= 1"]),
    "contexts 0,-5": ({}, ["--contexts", "0,-5"], ["argument --contexts:", "got '0,-5'"]),
    "contexts empty": ({}, ["--contexts", ""], ["argument --contexts:", "got ''"]),
    "device bogus": ({}, ["--device", "bogus"], ["argument --device: must be cpu, cuda"]),
    "heads 0": ({}, ["--heads", "0"], ["argument --heads: must be an integer >= 1, got '0'"]),
    "heads not a multiple": ({}, ["--heads", "10"], ["--heads 10, num_kv_heads default 4"]),
    "attn-core bool": ({"ATTN_CORE_CHECKS": "maybe"}, [], ["ATTN_CORE_CHECKS", "got 'maybe'"]),
    "attn-core profile": ({"ATTN_CORE_DEVICE": "bogus"}, [], ["ATTN_CORE_DEVICE='bogus'"]),
    "plan override": (
        {"ATTN_CORE_DECODE_PARTITION_SIZE": "24"},
        [],
        ["ATTN_CORE_DECODE_PARTITION_SIZE=24", "partition_size must be a multiple"],
    ),
    # issue 18, class 4: the native CLI's validator of targets, and bounded numbers
    "native arch": ({"ATTN_CORE_NATIVE_ARCH": "sm90"}, [], ["ATTN_CORE_NATIVE_ARCH", "'sm90'"]),
    "native arch empty": ({"ATTN_CORE_NATIVE_ARCH": ","}, [], ["ATTN_CORE_NATIVE_ARCH", "','"]),
    "partition 1e31": (
        {"ATTN_CORE_DECODE_PARTITION_SIZE": "1" + "0" * 31},
        [],
        ["ATTN_CORE_DECODE_PARTITION_SIZE must be an integer in [1, 16777216]"],
    ),
    "tp without model": ({}, ["--tp", "2"], ["--tp applies only with --model"]),
    "model not a checkpoint": ({}, ["--model", "/nonexistent"], ["--model must be a checkpoint"]),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("item", ISSUE_ITEMS)
def test_issue_items_are_configuration_errors(clean_env, monkeypatch, item, as_json):
    env, argv, expected = ISSUE_ITEMS[item]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = _run([*BASE, *argv], as_json)
    assert code == EXIT_CONFIG
    assert "Traceback" not in out + err
    message = _json_error(out, code)["message"] if as_json else err
    for text in expected:
        assert text in message
    if not as_json:
        assert out == ""


def test_cuda_without_a_gpu(clean_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = _run([*BASE, "--device", "cuda"], True)
    error = _json_error(out, code)
    assert code == EXIT_CONFIG and error["kind"] == "configuration"
    assert "--device cuda needs a CUDA device" in error["message"]
    assert "torch.cuda.is_available() is False" in error["message"]


def test_cuda_index_beyond_the_devices(clean_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code, out, err = _run([*BASE, "--device", "cuda:3"], False)
    assert code == EXIT_CONFIG
    assert "--device must be cuda:0 .. cuda:1 on this machine, got cuda:3" in err


def test_model_without_transformers(clean_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where it is not installed
    code, out, err = _run([*BASE, "--model", str(DATA / "qwen3_5_moe")], False)
    assert code == EXIT_CONFIG and "Traceback" not in err
    assert "--model needs transformers" in err and "not importable" in err


def test_heads_zero_is_not_replaced_by_the_default(clean_env):
    """`args.heads or default` turned 0 into 24; 0 is now refused, a given value is kept."""
    assert _run([*BASE, "--heads", "0"], False)[0] == EXIT_CONFIG
    code, out, _ = _run([*BASE, "--heads", "8", "--kv-heads", "8"], True)
    assert code == EXIT_OK and json.loads(out)["model_shape"]["num_kv_heads"] == 8


def test_usage_errors_are_json_too(clean_env):
    code, out, err = _run([*BASE, "--no-such-flag"], True)
    error = _json_error(out, code)
    assert code == EXIT_CONFIG and error["kind"] == "usage"
    assert "unrecognized arguments: --no-such-flag" in error["message"]
    assert "usage: engine-patch status" in err


def test_a_bug_is_exit_5_with_where_not_a_traceback(clean_env, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("device vanished")

    monkeypatch.setattr(cli, "collect", broken)
    code, out, err = _run(BASE, True)
    error = _json_error(out, code)
    assert code == EXIT_INTERNAL and error["kind"] == "internal"
    assert re.search(r"RuntimeError: device vanished \(at .*test_cli_errors.py:\d+", err)
    assert "Traceback" not in err


def test_a_planner_value_error_without_overrides_is_internal(clean_env, monkeypatch):
    """Only a plan override (ATTN_CORE_DECODE_* / _PREFILL_*) turns a planner's ValueError into
    a configuration error; ATTN_CORE_DEVICE is checked before and does not count."""
    monkeypatch.setenv("ATTN_CORE_DEVICE", "bi-v100")

    def refuses(*args, **kwargs):
        raise ValueError("partition_size must be a multiple of block_size (16), got 24")

    monkeypatch.setattr(cli, "collect", refuses)
    assert _run(BASE, False)[0] == EXIT_INTERNAL
    monkeypatch.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "24")
    assert _run(BASE, False)[0] == EXIT_CONFIG


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"]])
def test_help_lists_json_every_command_and_every_exit_code(argv, capsys):
    assert cli.main(argv) == EXIT_OK
    text = capsys.readouterr().out
    assert "--json" in text and "status" in text
    for code in MEANINGS:
        assert re.search(rf"^\s+{code}  \S", text, re.M), code
    if argv == ["--help"]:
        for command in cli.COMMANDS:
            assert re.search(rf"^\s+{command}\s+\S", text, re.M), command


def test_readme_exit_code_table_is_the_modules():
    text = README.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d) \| (.+?) \|$", section, re.M)
    assert {int(code): meaning for code, meaning in rows} == MEANINGS


def test_importing_engine_patch_leaves_the_warning_filters_alone():
    """The NumPy-warning filter is scoped to the package's own imports."""
    assert not any(f[1] is not None and "NumPy" in f[1].pattern for f in warnings.filters)


def test_no_numpy_warning_without_numpy():
    """torch warns "Failed to initialize NumPy" on import when numpy is absent (a plain pip
    install or a nox session has none); the CLI must not pass that on."""
    code = (
        "import sys; sys.modules['numpy'] = None\n"  # as where numpy is not installed
        "sys.modules['vllm'] = None\n"  # vLLM needs numpy; without both, as off the lab
        "from engine_patch.cli import main\n"
        "sys.exit(main(['--no-self-test', '--contexts', '1024']))\n"
    )
    proc = ep_helpers.run_python(code, env={PLATFORM_ENV: "generic"})
    assert proc.returncode == EXIT_OK, proc.stderr[-2000:]
    assert "Failed to initialize NumPy" not in proc.stderr + proc.stdout


# --- property: random bad arguments and ENGINE_PATCH_* values ---------------------------------

WORDS = st.from_regex(r"[A-Za-z][A-Za-z_]{0,11}", fullmatch=True)
NOT_POSITIVE = st.integers(max_value=0).map(str)
NOT_AN_INT = st.one_of(WORDS, st.floats(-1e6, 1e6).map(lambda f: f"{f:.3f}"))
BAD_COUNT = st.one_of(NOT_POSITIVE, NOT_AN_INT)
BAD_HEAD = st.integers(1, 1024).filter(lambda n: n not in SUPPORTED_HEAD_SIZES).map(str)
BAD_BLOCK = st.integers(1, 1024).filter(lambda n: n not in SUPPORTED_BLOCK_SIZES).map(str)
BAD_BOOL = st.one_of(
    WORDS.filter(lambda w: w.lower() not in TRUE_WORDS + FALSE_WORDS),
    st.integers().filter(lambda n: n not in (0, 1)).map(str),
)

BAD_ARGS = st.one_of(
    st.tuples(
        st.sampled_from(["--heads", "--kv-heads", "--num-seqs", "--tp", "--head-size"]), BAD_COUNT
    ),
    st.tuples(st.just("--head-size"), BAD_HEAD),
    st.tuples(st.just("--block-size"), st.one_of(BAD_COUNT, BAD_BLOCK)),
    st.tuples(st.just("--dtype"), WORDS.filter(lambda w: w not in DTYPE_NAMES)),
    st.tuples(
        st.just("--device"),
        st.one_of(
            WORDS.filter(lambda w: w not in ("cpu", "cuda")),
            st.sampled_from(["cuda:x", "cuda:-1", "cpu:", "gpu:0", "meta"]),
        ),
    ),
    st.tuples(
        st.just("--contexts"),
        st.one_of(
            st.just(""),
            st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=4)
            .filter(lambda xs: min(xs) < 1)
            .map(lambda xs: ",".join(map(str, xs))),
            st.lists(st.one_of(WORDS, st.integers(1, 10**6).map(str)), min_size=1, max_size=4)
            .filter(lambda xs: any(not x.isdigit() for x in xs))
            .map(",".join),
        ),
    ),
    WORDS.map(lambda w: (f"--zz-{w}",)),  # a flag status does not have
)
BAD_ENV = st.one_of(
    st.tuples(st.just("ENGINE_PATCH_FORCE"), BAD_BOOL),
    st.tuples(
        st.just("ENGINE_PATCH_V1_MAX_SEQ_LEN"),
        st.one_of(NOT_AN_INT, st.integers(max_value=-1).map(str)),
    ),
    st.tuples(st.just(PLATFORM_ENV), WORDS.filter(lambda w: w not in ("iluvatar", "generic"))),
    st.tuples(st.sampled_from(["ENGINE_PATCH_HEADS", "ENGINE_PATCH_KV_HEADS"]), BAD_COUNT),
    st.tuples(st.just("ENGINE_PATCH_HEAD_SIZE"), st.one_of(BAD_COUNT, BAD_HEAD)),
    st.tuples(st.just("ENGINE_PATCH_BLOCK_SIZE"), st.one_of(BAD_COUNT, BAD_BLOCK)),
    st.tuples(st.just("ENGINE_PATCH_DTYPE"), WORDS.filter(lambda w: w not in DTYPE_NAMES)),
    st.tuples(st.just("ATTN_CORE_CHECKS"), BAD_BOOL),
    st.tuples(st.just("ATTN_CORE_DEVICE"), WORDS.filter(lambda w: w not in DEVICE_SPECS)),
)
# 1-3 bad things at once, each bad on its own (never two that could make a valid pair).
BAD_INPUT = st.one_of(
    st.tuples(st.lists(BAD_ARGS, min_size=1, max_size=2), st.lists(BAD_ENV, max_size=2)),
    st.tuples(st.just([]), st.lists(BAD_ENV, min_size=1, max_size=2)),
)


def _controlled_env(bad_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINE_PATCH_", "ATTN_CORE_"))}
    env[PLATFORM_ENV] = "generic"
    env.update(dict(bad_env))
    return env


def _check(code, out, err, as_json, offending):
    assert "Traceback" not in out + err
    assert code == EXIT_CONFIG, (code, out[-2000:], err[-2000:])
    message = _json_error(out, code)["message"] if as_json else err
    assert any(name in message for name in offending), (offending, message)


@settings(max_examples=150, deadline=None)
@given(bad=BAD_INPUT, as_json=st.booleans())
def test_property_bad_input_in_process(bad, as_json):
    bad_args, bad_env = bad
    argv = [*BASE, *(token for arg in bad_args for token in arg)]
    with mock.patch.dict(os.environ, _controlled_env(bad_env), clear=True):
        code, out, err = _run(argv, as_json)
    offending = [arg[0] for arg in bad_args] + [name for name, _ in bad_env]
    _check(code, out, err, as_json, offending)


@settings(max_examples=3, deadline=None)
@given(bad=BAD_INPUT)
def test_property_bad_input_real_process(bad):
    """The same, through ``python -m engine_patch`` in a fresh interpreter (always --json)."""
    bad_args, bad_env = bad
    argv = [*BASE, *(token for arg in bad_args for token in arg), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "engine_patch", *argv],
        capture_output=True,
        text=True,
        env=_controlled_env(bad_env),
        timeout=300,
    )
    offending = [arg[0] for arg in bad_args] + [name for name, _ in bad_env]
    _check(proc.returncode, proc.stdout, proc.stderr, True, offending)
