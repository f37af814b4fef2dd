"""A profile file (``ATTN_CORE_DEVICE=<file>``, ``--profile FILE``) is parsed into a checked
schema: a 400-digit integer (an OverflowError), 100,000 levels of nesting (a RecursionError) or
``"base": ["h200"]`` (a TypeError) is a ValueError naming the file, the key, the expected and
the actual value."""

from __future__ import annotations

import json

import pytest

from attn_core.device.profile_file import load_profile_file

BIG = int("9" * 400)


def _write(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    return path


def _profile(**change):
    data = {"schema": "attn-core/profile/1", "base": "h200", "name": "h200+x", "fields": {}}
    data.update(change)
    return json.dumps(data)


@pytest.mark.parametrize(
    "text, names",
    [
        (_profile(fields={"hbm_bandwidth": BIG}), ["hbm_bandwidth", "400 digits"]),
        (_profile(fields={"sm_count": BIG}), ["sm_count", "400 digits"]),
        (_profile(provenance={"x": [BIG]}), ["provenance.x[0]", "400 digits"]),
        ("[" * 100_000 + "]" * 100_000, ["nested deeper than 64"]),
        ('{"fields": ' * 100 + "{}" + "}" * 100, ["nested deeper than 64"]),
        (_profile(base=["h200"]), ["base must be one of", "['h200']"]),
        (_profile(name=["x"]), ["name must be a string"]),
        (_profile(schema=["x"]), ["schema must be"]),
    ],
)
def test_profile_file_errors_are_named(tmp_path, text, names):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_profile_file(path)
    message = str(info.value)
    assert str(path) in message
    for name in names:
        assert name in message, message
