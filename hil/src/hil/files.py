"""Writing a run's files without ever writing through a link, and without half-written files.

Records (results, summaries, suite records) are replaced whole: a temporary file in the same
directory, then ``os.replace``, which replaces a symlink or hard link at the name instead of
writing into the file it leads to, and leaves a reader the old file or the new one. Logs are
appended through ``O_NOFOLLOW``: a link where a log should be is refused by name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(path: Path, data: Union[str, bytes]) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8); a link at ``path`` is replaced, never
    followed. The file gets the mode an ordinary ``open`` would give."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_append(path: Path):
    """``path`` opened for appending bytes; OSError (ELOOP) naming it when it is a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(exc.errno, f"refusing to write through the symlink {path}") from None
        raise
    return os.fdopen(fd, "ab")


def _read_umask() -> int:
    old = os.umask(0o022)  # the only portable way to read it: once, at import, before any
    os.umask(old)  # worker thread could create a file under the temporary value
    return old


_UMASK = _read_umask()
