"""Writing a file whole and never through a link (standard library only: ``setup.py`` loads
this file by path for the native build, without the package or torch).

A temporary file in the same folder, then ``os.replace``: a reader sees the old file or the new
one, never half of one, and a symbolic or hard link at the name is replaced instead of written
through (a link planted in a shared cache or report folder cannot turn a write against the file
it leads to).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(path: Union[str, Path], data: Union[str, bytes]) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8); a link at ``path`` is replaced, never
    followed. The file is readable by everyone (0644)."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp's 0600 would hide a root install's records and logs from the serving user
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
