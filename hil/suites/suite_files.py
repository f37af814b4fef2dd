"""How the in-container scripts write their files: whole, and never through a link.

Standard library only (the vendor image's Python 3.10). A temporary file in the same directory
then ``os.replace``: a reader (the host copying results while a suite hangs) sees the old file
or the new one, never half of one, and a symlink or hard link at the name is replaced instead
of written through.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path, data) -> None:
    """Replace ``path`` with ``data`` (str as UTF-8, or bytes)."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
