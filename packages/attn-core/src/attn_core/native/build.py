"""Compiling the native libraries, once per source and toolchain (standard library only).

``setup.py`` calls :func:`build_library` at ``pip install`` time (the library then ships inside
the package); a source checkout builds on first use into a cache directory keyed by a hash of
the sources, the compiler version and the targets, so an edited kernel never loads stale.
Concurrent builds (pytest-xdist workers, several vLLM ranks) serialise on a lock file and the
library appears by an atomic rename: :func:`compile_library`, which the prefill libraries
(``prefill_library.py``) use too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # setup.py loads this file alone, without the attn_core package (or torch)
    from attn_core.native.toolchain import Toolchain

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "paged_decode.cu"
SLOTS = tuple(range(1, 9))  # one library per head-slot count (csrc/paged_decode.cu, GROUP)


def library_name(slots: int) -> str:
    """File name of the library whose kernels serve ``slots`` query heads per block."""
    return f"libattn_native_g{slots}.so"


# One library (30 kernels, fully unrolled loops) takes ~2 min of CPU with nvcc 13.0 for sm_90
# (group 6: 125 s user) and took up to ~14 min of wall time on a 2-core machine shared by
# several builds (2026-12-01); the limit only catches a hung compiler.
BUILD_TIMEOUT_S = 1800


class BuildError(RuntimeError):
    """The compiler failed; the message carries its command and the tail of its output."""


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def include_closure(entry: Path) -> list[Path]:
    """``entry`` and every ``csrc/`` file it includes with ``#include "..."``, transitively,
    sorted by name. Includes under any ``#if`` count (a superset is safe: it only rebuilds); a
    quoted name that is not a ``csrc/`` file (a toolkit header) is the toolchain's, which the
    build key covers by its version."""
    seen: dict[str, Path] = {}
    todo = [entry]
    while todo:
        path = todo.pop()
        if path.name in seen:
            continue
        seen[path.name] = path
        for name in _LOCAL_INCLUDE.findall(path.read_bytes()):
            included = CSRC / name.decode()
            if included.is_file():
                todo.append(included)
    return [seen[name] for name in sorted(seen)]


def source_digest(entry: Path = SOURCE) -> str:
    """A hash of what ``entry`` compiles (:func:`include_closure`: names and bytes). The decode
    and prefill libraries hash only their own files, so an edit to one rebuilds neither the
    other nor, for a prefill-only file, stales kernel_facts.json."""
    h = hashlib.sha256()
    for path in include_closure(entry):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def log_path(library: Path) -> Path:
    """Where the compiler's output for ``library`` is kept."""
    return library.with_suffix(".log")


def build_all(
    toolchain: Toolchain, out_dir: Path, *, defines: tuple[str, ...] = (), jobs: int = 0
) -> float:
    """Every slot count's library, compiled in parallel (``jobs``: 0 means one per CPU);
    seconds of wall time. Raises :class:`BuildError` for the first that failed."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    workers = jobs or min(len(SLOTS), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(build_library, toolchain, out_dir, n, defines=defines) for n in SLOTS
        ]
        for future in futures:
            future.result()
    return time.monotonic() - start


def build_key(toolchain: Toolchain, *, source: Path = SOURCE, flush_denormals: bool = False) -> str:
    """Cache key: ``source``'s files (:func:`source_digest`), compiler kind and version,
    targets and command lines (those with ``flush_denormals`` for a library built so)."""
    h = hashlib.sha256(source_digest(source).encode())
    h.update("|".join((toolchain.kind, toolchain.version, *toolchain.archs)).encode())
    # Where the compiler is installed is not part of what it builds: the same nvcc under
    # /usr/local/bin here and /usr/local/cuda/bin on the lab image must share a cache (the
    # first device run of 2026-12-01 missed a carried build over exactly this).
    located = dataclasses.replace(toolchain, compiler=Path(toolchain.compiler).name, home="HOME")
    commands = located.commands(
        Path("SOURCE"), Path("INCLUDE"), Path("OUT"), flush_denormals=flush_denormals
    )
    for cmd in commands:
        h.update(" ".join(cmd).encode())
    return h.hexdigest()[:20]


def default_cache_dir() -> Path:
    """Where JIT builds go unless ``ATTN_CORE_NATIVE_CACHE`` says otherwise."""
    return Path.home() / ".cache" / "attn_core"


def build_library(
    toolchain: Toolchain,
    out_dir: Path,
    slots: int,
    *,
    defines: tuple[str, ...] = (),
) -> tuple[Path, float]:
    """Build the ``slots`` library into ``out_dir`` unless it is there; ``(path, seconds)``.
    The compiler's output goes to ``<library>.log`` beside it.

    Raises:
        BuildError: every command line failed (the last one's output is in the message).
    """
    if slots not in SLOTS:
        raise ValueError(f"slots must be one of {SLOTS}, got {slots}")
    defines = (*defines, f"ATTN_GROUP_SLOTS={slots}")
    archs = " ".join(toolchain.archs)
    failed = f"building the native decode kernel failed ({toolchain.kind}, {archs})"
    return compile_library(toolchain, SOURCE, out_dir / library_name(slots), defines, failed)


def compile_library(
    toolchain: Toolchain,
    source: Path,
    target: Path,
    defines: tuple[str, ...],
    failed: str,
    *,
    flush_denormals: bool = False,
) -> tuple[Path, float]:
    """Compile ``source`` (includes from :data:`CSRC`) into ``target`` unless it is there;
    ``(target, seconds)``, 0.0 when it was. Every library, decode and prefill, is made here.

    One lock file per library (``.<name>.lock`` beside it) serialises concurrent builders; each
    of ``toolchain``'s command lines is tried in a temporary directory until one succeeds; its
    command and output go to ``<library>.log`` and the library appears by atomic rename.

    Raises:
        BuildError: every command line failed; the message is ``failed``, the last command and
            the tail of its output.
    """
    out_dir, name = target.parent, target.name
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target, 0.0
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = Path(tmp) / name
            failures = []
            commands = toolchain.commands(
                source, CSRC, partial, defines, flush_denormals=flush_denormals
            )
            for cmd in commands:
                done = _run(cmd)
                if done.returncode == 0 and partial.is_file():
                    log_path(target).write_text(" ".join(cmd) + "\n" + done.stdout + done.stderr)
                    os.replace(partial, target)
                    return target, time.monotonic() - start
                failures.append((cmd, done))
        cmd, done = failures[-1]
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise BuildError(f"{failed}: {' '.join(cmd)}\n{tail}")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {BUILD_TIMEOUT_S} s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))
