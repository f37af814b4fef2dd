"""The one reader of the files ``python -m attn_sim`` takes (profiles excepted: attn-core reads
those, through the same checks): JSON and TOML parsed, then bounded.

A file may not nest deeper than :data:`MAX_DEPTH` levels or hold an integer longer than
:data:`MAX_INT_DIGITS` digits (a RecursionError in the parser, an OverflowError where the
integer met a float); every error is a ``ValueError`` naming ``what``, the file and the key,
before any schema looks at the data (see :mod:`attn_sim.schema` for the schemas).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attn_core.device.profile_file import MAX_DEPTH, MAX_INT_DIGITS, check_plain, parse_json_text

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "read_json", "read_toml"]


def _text(path: Path, what: str) -> str:
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory, not a file")
    if not path.exists():
        raise ValueError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path}: cannot be read ({err})") from None


def read_json(path: Path, what: str) -> Any:
    """The JSON file at ``path``, bounded (see the module docstring)."""
    path = Path(path)
    return parse_json_text(_text(path, what), f"{what} {path}")


def read_toml(path: Path, what: str) -> Any:
    """The TOML file at ``path``, bounded (see the module docstring)."""
    path = Path(path)
    where = f"{what} {path}"
    try:
        data = tomllib.loads(_text(path, what))
    except RecursionError:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # TOMLDecodeError
        raise ValueError(f"{where}: cannot be parsed ({err})") from None
    return check_plain(data, where)
