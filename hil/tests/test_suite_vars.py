"""Issue 11, suite variables: HIL_QUICK through one boolean grammar, HIL_LC_* validated; a bad
value is a config error naming the variable (exit 2, a JUnit case "config"), not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hil_helpers import REPO

sys.path.insert(0, str(REPO / "hil" / "suites"))
import suite_vars  # noqa: E402
from suite_vars import SuiteConfigError  # noqa: E402

LONG_CONTEXT = REPO / "hil" / "suites" / "long_context.py"


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " On "])
def test_quick_true_words(raw):
    assert suite_vars.quick({"HIL_QUICK": raw}) is True


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", "OFF"])
def test_quick_false_words(raw):
    assert suite_vars.quick({"HIL_QUICK": raw}) is False


@pytest.mark.parametrize("env", [{}, {"HIL_QUICK": ""}, {"HIL_QUICK": "  "}])
def test_quick_unset_or_empty_is_the_default(env):
    assert suite_vars.quick(env) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "tru", "y"])
def test_quick_other_values_name_the_variable(raw):
    with pytest.raises(SuiteConfigError, match=f"HIL_QUICK must be one of .* got {raw!r}"):
        suite_vars.quick({"HIL_QUICK": raw})


def _outcome(parse, raw, default):
    try:
        return ("value", parse("X", raw, default))
    except ValueError as exc:
        return ("error", str(exc))


_WORDS = [w for words in (suite_vars.TRUE_WORDS, suite_vars.FALSE_WORDS) for w in words]
_SPELLINGS = [None, "", "  ", "bogus", "2", "tru", "y", "nO", "\tyes\n", "ON ", "0.0"] + [
    f(w) for w in _WORDS for f in (str, str.upper, str.title, lambda t: f" {t} ")
]


@pytest.mark.parametrize("default", (False, True, None))
def test_same_grammar_as_attn_core(default):
    """The local copy (hil needs no torch) and attn_core.core.settings.parse_bool: the same words,
    the same value or the same error message for every spelling and default."""
    settings = pytest.importorskip("attn_core.core.settings")
    assert suite_vars.TRUE_WORDS == settings.TRUE_WORDS
    assert suite_vars.FALSE_WORDS == settings.FALSE_WORDS
    for raw in _SPELLINGS:
        want = _outcome(settings.parse_bool, raw, default)
        assert _outcome(suite_vars._local_parse_bool, raw, default) == want, raw


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: suite_vars.parse_choices("HIL_LC_KINDS", "bogus", suite_vars.KINDS), "bogus"),
        (lambda: suite_vars.parse_choices("HIL_LC_KINDS", ",", suite_vars.KINDS), "','"),
        (lambda: suite_vars.parse_dtype("HIL_LC_DTYPE", "bogus"), "float16, bfloat16"),
        (lambda: suite_vars.parse_contexts("HIL_LC_CONTEXTS", "abc"), "bad item 'abc'"),
        (lambda: suite_vars.parse_contexts("HIL_LC_CONTEXTS", "1024,0"), "bad item '0'"),
        (lambda: suite_vars.parse_contexts("HIL_LC_CONTEXTS", "-5"), ">= 1"),
    ],
)
def test_bad_values_name_the_variable(call, message):
    with pytest.raises(SuiteConfigError) as err:
        call()
    assert "HIL_LC_" in str(err.value) and message in str(err.value)


def test_good_values():
    assert suite_vars.parse_choices("V", " prefill , decode", suite_vars.KINDS) == [
        "prefill",
        "decode",
    ]
    assert suite_vars.parse_dtype("V", "") is None
    assert suite_vars.parse_dtype("V", "bfloat16") == "bfloat16"
    assert suite_vars.parse_contexts("V", "32768, 65536,") == [32768, 65536]
    assert suite_vars.parse_contexts("V", "") == []


def run_long_context(tmp_path, env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIL_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "packages" / "attn-core" / "src"), env.get("PYTHONPATH", "")]
    )
    junit = tmp_path / "j.xml"
    return subprocess.run(
        [sys.executable, str(LONG_CONTEXT), "--out", str(tmp_path), "--junit", str(junit), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "env, name",
    [
        ({"HIL_LC_KINDS": "bogus"}, "HIL_LC_KINDS"),
        ({"HIL_LC_DTYPE": "bogus"}, "HIL_LC_DTYPE"),
        ({"HIL_LC_CONTEXTS": "abc"}, "HIL_LC_CONTEXTS"),
        ({"HIL_QUICK": "maybe"}, "HIL_QUICK"),
    ],
)
def test_long_context_config_error(tmp_path, env, name):
    proc = run_long_context(tmp_path, env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"long-context: config error: {name}" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    junit = (tmp_path / "j.xml").read_text()
    assert 'name="config"' in junit and name in junit and "<error" in junit


def test_long_context_option_named_when_given(tmp_path):
    proc = run_long_context(tmp_path, {"HIL_LC_KINDS": "decode"}, "--kinds", "nope")
    assert proc.returncode == 2 and "--kinds must be" in proc.stderr


def test_hil_quick_true_means_quick(tmp_path):
    """HIL_QUICK=true once meant "not quick" (only "1" counted): the quick shapes must run."""
    proc = run_long_context(
        tmp_path,
        {"HIL_QUICK": "true", "HIL_LC_KINDS": "decode", "HIL_LC_CONTEXTS": "40"},
        "--device",
        "cpu",
        "--repeats",
        "1",
        "--warmup",
        "0",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    records = json.loads((tmp_path / "long_context_metrics.json").read_text())
    assert [(r["kind"], r["context_len"], r["num_heads"]) for r in records] == [("decode", 40, 4)]
