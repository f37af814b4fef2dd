"""Arguments of ``python -m attn_sim``: converters for argparse and output checks.

Converters raise :class:`argparse.ArgumentTypeError`, so argparse names the argument and exits
2 ("argument --shape: ..."). Output paths are checked before any work (a report that takes
seconds must not end in "permission denied" after printing its tables): directories are created,
and a probe file is written and removed, which also catches read-only filesystems when running
as root.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec
from attn_sim.profiles import load_profile


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def profile(text: str) -> DeviceSpec:
    """A built-in profile name or a profile JSON file."""
    try:
        return load_profile(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def profiles(text: str) -> list[DeviceSpec]:
    """``"a,b"``: comma-separated profile names or files, none empty, none twice."""
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated profile names or files, none empty, got {text!r}"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"names {twice} twice (each profile once), got {text!r}")
    return [profile(n) for n in names]


def shape(text: str) -> AttentionShape:
    """``--shape``: see :func:`attn_sim.report.parse_shape`."""
    from attn_sim.report import parse_shape

    try:
        return parse_shape(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def path_text(text: str) -> str:
    """A path argument: refused when empty or blank (``Path("")`` is the working directory, so
    ``--out ''`` would write the report there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"must name a path, got {text!r} (an empty path would mean the working directory)"
        )
    return os.path.expanduser(text)  # the shell leaves ~ as is after "=" (--out=~/r)


def readable_file(path: str, arg: str) -> Path:
    """``path`` as an existing regular file; a ``ValueError`` naming ``arg`` and the path
    otherwise. Called before any output is created."""
    p = Path(path)
    if not p.is_file():
        why = "is a directory" if p.is_dir() else "does not exist"
        raise ValueError(f"{arg} {path}: {why}, expected a file")
    return p


def writable_dir(path: str, arg: str) -> Path:
    """``path`` as a directory this process can write into (created if missing); a
    ``ValueError`` naming ``arg`` and the path otherwise."""
    if not str(path).strip():
        raise ValueError(f"{arg} must name a directory, got {path!r} (not the working directory)")
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except FileExistsError:
        raise ValueError(f"{arg} {path}: exists and is not a directory") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        why = getattr(err, "strerror", None) or err
        raise ValueError(f"{arg} {path!r}: cannot write there ({why})") from None
    return p


def writable_file(path: str, arg: str) -> Path:
    """``path`` as a file this process can (over)write, its directory created if missing."""
    if not str(path).strip():
        raise ValueError(f"{arg} must name a file, got {path!r}")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{arg} {path}: is a directory, not a file")
    writable_dir(str(p.parent), f"{arg} {path}: directory")
    if p.exists() and not p.is_symlink():  # a link is replaced, never opened (core.files)
        try:
            with open(p, "a"):
                pass
        except OSError as err:
            raise ValueError(f"{arg} {path}: cannot write ({err.strerror or err})") from None
    return p
