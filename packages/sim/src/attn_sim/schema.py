"""Checks for parsed TOML / JSON: each names the dotted key, what it must be and what it is.

A check is ``check(key, value)`` that raises :class:`Invalid`; tables check their keys (missing
required keys and unknown keys are errors: a typo must not silently fall back to a default).
The files are small and their rules few, so this stays a page rather than a dependency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Optional

Check = Callable[[str, Any], None]


class Invalid(ValueError):
    """``key must be expected, got value``."""

    def __init__(self, key: str, expected: str, value: Any) -> None:
        super().__init__(f"{key} must be {expected}, got {_show(value)}")
        self.key = key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        return is_num and math.isfinite(value)
    except OverflowError:  # an int too large for a float (files.read_* refuse those first)
        return False


def integer(lo: int, hi: Optional[int] = None) -> Check:
    expected = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def check(key: str, value: Any) -> None:
        if not (is_int(value) and value >= lo and (hi is None or value <= hi)):
            raise Invalid(key, expected, value)

    return check


def number(lo: float, *, strict: bool) -> Check:
    """A finite number above ``lo`` (``strict``) or at least ``lo``."""
    expected = f"a finite number {'>' if strict else '>='} {lo:g}"

    def check(key: str, value: Any) -> None:
        if not (is_number(value) and (value > lo if strict else value >= lo)):
            raise Invalid(key, expected, value)

    return check


def text(key: str, value: Any) -> None:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise Invalid(key, "a non-empty string", value)


def one_of(choices: tuple) -> Check:
    def check(key: str, value: Any) -> None:
        if value not in choices:
            raise Invalid(key, f"one of {list(choices)}", value)

    return check


def list_of(item: Check, *, min_len: int = 1, max_len: int = 4096, what: str = "") -> Check:
    """A list of ``min_len``..``max_len`` items, each passing ``item`` (keyed ``key[i]``)."""
    expected = f"a list of {min_len}..{max_len} {what or 'items'}"

    def check(key: str, value: Any) -> None:
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            raise Invalid(key, expected, value)
        for i, v in enumerate(value):
            item(f"{key}[{i}]", v)

    return check


def tuple_of(*items: Check, what: str) -> Check:
    """A list of exactly ``len(items)`` values, the i-th passing ``items[i]``."""

    def check(key: str, value: Any) -> None:
        if not isinstance(value, list) or len(value) != len(items):
            raise Invalid(key, what, value)
        for i, (c, v) in enumerate(zip(items, value, strict=True)):
            c(f"{key}[{i}]", v)

    return check


def table(fields: Mapping[str, tuple[bool, Check]], *, extra: bool = False) -> Check:
    """A table with these keys, ``{name: (required, check)}``; no others unless ``extra``."""

    def check(key: str, value: Any) -> None:
        where = f"{key}." if key else ""
        if not isinstance(value, Mapping):
            raise Invalid(key or "the file", "a table (a JSON object)", value)
        for name, (required, sub) in fields.items():
            if name in value:
                sub(f"{where}{name}", value[name])
            elif required:
                raise ValueError(f"{where}{name} is missing (a required key)")
        unknown = sorted(map(str, set(value) - set(fields)))
        if unknown and not extra:
            raise ValueError(
                f"unknown key {where}{unknown[0]} (known here: {', '.join(sorted(fields))})"
            )

    return check


def mapping_of(item: Check, keys: Optional[tuple] = None) -> Check:
    """A table whose keys are free (or among ``keys``) and whose values pass ``item``."""

    def check(key: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise Invalid(key, "a table (a JSON object)", value)
        for name, v in value.items():
            if keys is not None and name not in keys:
                raise Invalid(f"{key} key", f"one of {list(keys)}", name)
            item(f"{key}.{_quoted(name)}", v)

    return check


def _quoted(name: Any) -> str:
    text = str(name)
    return text if text.replace("_", "").replace("-", "").isalnum() else repr(text)
