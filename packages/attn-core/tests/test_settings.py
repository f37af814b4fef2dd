"""attn-core's environment: one parser per kind, every bad value a ValueError naming the variable.

The only tests that hand attn-core an environment; everything else passes overrides explicitly.
They parse plain dicts with :meth:`Overrides.from_env` (no process environment is touched).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attn_core.core.settings import (
    ENV_VARS,
    DecodeOverrides,
    Overrides,
    PrefillOverrides,
    env_var_table,
    parse_bool,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_defaults_from_an_empty_environment() -> None:
    got = Overrides.from_env({})
    assert got == Overrides()
    assert got.decode == DecodeOverrides() and got.prefill == PrefillOverrides()
    assert not got.checks and got.prefill.stream is None


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "yes", "On", " on "])
def test_true_words(word: str) -> None:
    assert parse_bool("X", word) is True


@pytest.mark.parametrize("word", ["0", "false", "False", "no", "OFF"])
def test_false_words(word: str) -> None:
    assert parse_bool("X", word, default=True) is False


def test_empty_means_default() -> None:
    assert parse_bool("X", None, default=True) is True
    assert parse_bool("X", "", default=None) is None


@pytest.mark.parametrize("value", ["false", "off", "0", "no"])
def test_prefill_stream_off_words_turn_streaming_off(value: str) -> None:
    """The old parser took any non-"0" text as on: ``false`` streamed."""
    assert Overrides.from_env({"ATTN_CORE_PREFILL_STREAM": value}).prefill.stream is False
    assert Overrides.from_env({"ATTN_CORE_PREFILL_STREAM": "on"}).prefill.stream is True


@pytest.mark.parametrize("value", ["off", "FALSE", "no", "0", ""])
def test_checks_off_words_turn_checks_off(value: str) -> None:
    """The old parser took anything but 0/false/False as on: ``off`` checked."""
    assert Overrides.from_env({"ATTN_CORE_CHECKS": value}).checks is False
    assert Overrides.from_env({"ATTN_CORE_CHECKS": "yes"}).checks is True


# One bad value per variable family: booleans, positive ints, choices.
BAD_VALUES = [
    ("ATTN_CORE_CHECKS", "garbage"),
    ("ATTN_CORE_PREFILL_STREAM", "maybe"),
    ("ATTN_CORE_NATIVE_BUILD", "sometimes"),
    ("ATTN_CORE_DECODE_PARTITION_SIZE", "abc"),
    ("ATTN_CORE_DECODE_SINGLE_TILE_MAX", "-5"),
    ("ATTN_CORE_DECODE_SUBSCRIPTION", "0"),
    ("ATTN_CORE_DECODE_STREAM_TOKENS", "1.5"),
    ("ATTN_CORE_PREFILL_BUDGET_BYTES", "lots"),
    ("ATTN_CORE_DECODE_TIER", "fast"),
    ("ATTN_CORE_DECODE_SCORES", "fp16"),
    ("ATTN_CORE_DECODE_GATHER_BYTES", "4"),
    ("ATTN_CORE_DECODE_BACKEND", "triton"),
    ("ATTN_CORE_PREFILL_BACKEND", "triton"),
    ("ATTN_CORE_PREFILL_MMA", "mma_sync"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_values_name_the_variable_and_value(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be .*got {re.escape(repr(value))}"):
        Overrides.from_env({name: value})


def test_every_parsed_variable_has_a_bad_value_test() -> None:
    checked = {name for name, _ in BAD_VALUES}
    free_text = {"ATTN_CORE_DEVICE", "ATTN_CORE_NATIVE_ARCH", "ATTN_CORE_NATIVE_CACHE", "CUDA_HOME"}
    assert {v.name for v in ENV_VARS} - free_text == checked


def test_overrides_are_hashable_cache_keys() -> None:
    a = Overrides.from_env({"ATTN_CORE_DECODE_TIER": "one_pass"})
    b = Overrides.from_env({"ATTN_CORE_DECODE_TIER": "one_pass"})
    assert a == b and hash(a) == hash(b)
    assert a != Overrides.from_env({})


def test_overrides_objects_check_their_fields() -> None:
    with pytest.raises(ValueError, match="DecodeOverrides.tier must be None or one of"):
        DecodeOverrides(tier="fast")
    with pytest.raises(ValueError, match="PrefillOverrides.budget_bytes must be None or an int"):
        PrefillOverrides(budget_bytes=0)


def test_readme_table_is_the_generated_one() -> None:
    """attn-core's README shows env_var_table() verbatim: every variable of ENV_VARS, its
    default and meaning, and nothing else (regenerate it with settings.env_var_table())."""
    text = README.read_text()
    assert env_var_table() in text
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", text, flags=re.M))
    assert {r for r in rows if r.startswith("ATTN_CORE_")} == {
        v.name for v in ENV_VARS if v.name.startswith("ATTN_CORE_")
    }
