"""The config's string rules: ``${VAR}`` expansion, names that become paths, variable names,
and the build arguments a Dockerfile declares. Pure functions; errors are ValueErrors that the
loader prefixes with the file and the dotted key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

# one path component under --out (targets, suites, steps, run ids): no separators, no "..",
# no leading dot or dash, nothing a shell or a file system treats specially
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SAFE_NAME_RULE = (
    "one path component: letters, digits, '.', '_', '-', starting with a letter or digit, "
    "no '..', at most 100 characters"
)
# environment variables and build arguments: what a POSIX shell can name
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REF_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOCKERFILE_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE | re.MULTILINE)


def is_safe_name(name: object) -> bool:
    return isinstance(name, str) and bool(SAFE_NAME.fullmatch(name)) and ".." not in name


def check_name(name: object, what: str) -> str:
    """``name`` if it is one safe path component, else ValueError naming ``what``."""
    if not is_safe_name(name):
        raise ValueError(f"{what} must be {SAFE_NAME_RULE}, got {name!r}")
    return str(name)


def check_variable_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not VARIABLE_NAME.fullmatch(name):
        raise ValueError(
            f"{what} must be a variable name (a letter or '_', then letters, digits, '_'; "
            f"no '=' or spaces), got {name!r}"
        )
    return name


def dockerfile_args(path: Path) -> set:
    """The build arguments ``path`` declares (its ``ARG NAME`` lines)."""
    return set(_DOCKERFILE_ARG.findall(path.read_text(errors="replace")))


def expand(text: str, environ: Mapping[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}``, where a default may hold references itself
    (``${A:-${B:-x}}``); a variable set to "" counts as unset. ValueError for an unset variable
    without a default, and for any ``${`` that is not one of these forms (unterminated, a bad
    name, another shell operator): nothing is ever kept literally. A ``$`` not followed by ``{``
    is ordinary text."""
    value, end = _text(text, 0, environ, nested=False, needed=True)
    assert end == len(text)
    return value


def _text(text: str, i: int, environ, nested: bool, needed: bool) -> tuple:
    """The expansion of ``text[i:]`` up to its end (or, ``nested``, to the ``}`` closing a
    default); ``needed=False`` checks the syntax without asking for variables."""
    parts = []
    while i < len(text):
        if text.startswith("${", i):
            value, i = _reference(text, i, environ, needed)
            parts.append(value)
        elif nested and text[i] == "}":
            return "".join(parts), i
        else:
            parts.append(text[i])
            i += 1
    if nested:
        raise ValueError(f"unterminated ${{...}} in {text!r}: a default has no closing '}}'")
    return "".join(parts), i


def _reference(text: str, start: int, environ, needed: bool) -> tuple:
    """One ``${...}`` starting at ``start``: (its value, the index after it)."""
    m = _REF_NAME.match(text, start + 2)
    if not m:
        raise ValueError(
            f"bad reference at offset {start} of {text!r}: expected ${{NAME}} or "
            "${NAME:-default} with NAME a letter or '_' then letters, digits, '_'"
        )
    name, i = m.group(0), m.end()
    value = environ.get(name, "")
    if text.startswith("}", i):
        if needed and value == "":
            raise ValueError(f"environment variable {name} is not set (needed by {text!r})")
        return value, i + 1
    if text.startswith(":-", i):
        default, i = _text(text, i + 2, environ, nested=True, needed=needed and value == "")
        return (value if value != "" else default), i + 1
    raise ValueError(
        f"bad reference ${{{name}{text[i : i + 2]}... at offset {start} of {text!r}: only "
        "${NAME} and ${NAME:-default} are supported"
        if i < len(text)
        else f"unterminated ${{{name} in {text!r}: expected '}}' or ':-default}}'"
    )
