"""Compiling the native decode library, once per source and toolchain (standard library only).

``setup.py`` calls :func:`build_library` at ``pip install`` time (the library then ships inside
the package); a source checkout builds on first use into a cache directory keyed by a hash of
the sources, the compiler version and the targets, so an edited kernel never loads stale.
Concurrent builds (pytest-xdist workers, several vLLM ranks) serialise on a lock file and the
library appears by an atomic rename.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # setup.py loads this file alone, without the attn_core package (or torch)
    from attn_core.native.toolchain import Toolchain

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "paged_decode.cu"
LIBRARY_NAME = "libattn_native.so"
BUILD_TIMEOUT_S = 900  # all instantiations take ~35 s on a 2-core machine with nvcc 13.0


class BuildError(RuntimeError):
    """The compiler failed; the message carries its command and the tail of its output."""


def source_digest() -> str:
    """A hash of every file under ``csrc/`` (names and bytes)."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build_key(toolchain: Toolchain) -> str:
    """Cache key: sources, compiler kind and version, targets."""
    h = hashlib.sha256(source_digest().encode())
    h.update("|".join((toolchain.kind, toolchain.version, *toolchain.archs)).encode())
    return h.hexdigest()[:20]


def default_cache_dir() -> Path:
    """Where JIT builds go unless ``ATTN_CORE_NATIVE_CACHE`` says otherwise."""
    return Path.home() / ".cache" / "attn_core"


def build_library(
    toolchain: Toolchain, out_dir: Path, *, log: Optional[Path] = None
) -> tuple[Path, float]:
    """Build into ``out_dir/LIBRARY_NAME`` unless it is there; ``(path, seconds spent)``.

    Raises:
        BuildError: every command line failed (the last one's output is in the message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY_NAME
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target, 0.0
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = Path(tmp) / LIBRARY_NAME
            failures = []
            for cmd in toolchain.commands(SOURCE, CSRC, partial):
                done = _run(cmd)
                if done.returncode == 0 and partial.is_file():
                    os.replace(partial, target)
                    if log is not None:
                        log.write_text(" ".join(cmd) + "\n" + done.stdout + done.stderr)
                    return target, time.monotonic() - start
                failures.append((cmd, done))
        cmd, done = failures[-1]
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise BuildError(
            f"building the native decode kernel failed ({toolchain.kind}, "
            f"{' '.join(toolchain.archs)}): {' '.join(cmd)}\n{tail}"
        )


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {BUILD_TIMEOUT_S} s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))
