"""Compiling the native libraries, once per source and toolchain (standard library only).

Every kernel family (:mod:`.family`) is built here, variant by variant: ``setup.py`` calls
:func:`build_all` at ``pip install`` time (the libraries then ship inside the package), and a
source checkout builds on first use into a cache directory keyed by a hash of the family's
sources, the compiler version and the targets (:func:`family_key`), so an edited kernel never
loads stale. Concurrent builds (pytest-xdist workers, several vLLM ranks) serialise on a lock
file and a library appears by an atomic rename (:func:`compile_library`).
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # setup.py loads this file alone, without the attn_core package (or torch)
    from attn_core.native.family import Family
    from attn_core.native.toolchain import Toolchain

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "paged_decode.cu"

# One library (30 kernels, fully unrolled loops) takes ~2 min of CPU with nvcc 13.0 for sm_90
# (group 6: 125 s user) and took up to ~14 min of wall time on a 2-core machine shared by
# several builds; the limit only catches a hung compiler.
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


def build_key(toolchain: Toolchain, *, source: Path = SOURCE, flush_denormals: bool = False) -> str:
    """Cache key: ``source``'s files (:func:`source_digest`), compiler kind and version,
    targets and command lines (those with ``flush_denormals`` for a library built so)."""
    h = hashlib.sha256(source_digest(source).encode())
    h.update("|".join((toolchain.kind, toolchain.version, *toolchain.archs)).encode())
    # Where the compiler is installed is not part of what it builds: the same nvcc under
    # /usr/local/bin here and /usr/local/cuda/bin on the lab image must share a cache (a
    # build carried to a device machine was once missed over exactly this).
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


def family_key(toolchain: Toolchain, family: Family) -> str:
    """The build-cache folder of ``family``'s libraries for ``toolchain``."""
    source = CSRC / family.source
    key = build_key(toolchain, source=source, flush_denormals=family.flush_denormals)
    return family.cache_prefix + key


def build_variant(
    toolchain: Toolchain,
    out_dir: Path,
    family: Family,
    variant: str,
    *,
    defines: tuple[str, ...] = (),
) -> tuple[Path, float]:
    """Build ``family``'s ``variant`` into ``out_dir`` unless it is there; ``(path, seconds)``.
    ``defines`` come before the variant's own (tuning and facts builds).

    Raises:
        BuildError: every command line failed (the last one's output is in the message).
    """
    target = out_dir / family.library_name(variant)
    archs = " ".join(toolchain.archs)
    failed = (
        f"building the native {family.name} kernel ({variant}) failed ({toolchain.kind}, {archs})"
    )
    return compile_library(
        toolchain, CSRC / family.source, target, (*defines, *family.variants[variant]), failed,
        flush_denormals=family.flush_denormals,
    )  # fmt: skip


def build_all(
    toolchain: Toolchain,
    families: Iterable[Family],
    *,
    out_dir: Optional[Path] = None,
    cache: Optional[Path] = None,
    defines: tuple[str, ...] = (),
    jobs: int = 0,
    progress: Optional[Callable[[str], None]] = None,
) -> float:
    """Every variant ``toolchain`` builds of each family, compiled in parallel (``jobs``: 0
    means one per CPU); seconds of wall time.

    Args:
        out_dir: one folder for every library (``setup.py``'s ``_prebuilt``); else each family
            goes to ``cache / family_key(...)``.
        progress: called with one line per library as it is done (its time, or that it was
            already built).

    Raises:
        BuildError: naming every library that failed, after the others were built.
    """
    from concurrent.futures import ThreadPoolExecutor

    work = []
    for family in families:
        if out_dir is not None and cache is None:
            folder = out_dir
        elif cache is not None and out_dir is None:
            folder = cache / family_key(toolchain, family)
        else:
            raise ValueError("build_all needs exactly one of out_dir and cache")
        work += [(family, variant, folder) for variant in family.variants_for(toolchain.kind)]
    start = time.monotonic()
    workers = jobs or min(len(work), os.cpu_count() or 1) or 1
    failures = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            (family.library_name(variant), pool.submit(
                build_variant, toolchain, folder, family, variant, defines=defines))
            for family, variant, folder in work
        ]  # fmt: skip
        for name, future in futures:
            try:
                _, seconds = future.result()
            except BuildError as exc:
                failures.append(str(exc))
                continue
            if progress is not None:
                progress(f"  {name}: " + (f"built in {seconds:.0f} s" if seconds else "cached"))
    if failures:
        raise BuildError("\n".join(failures))
    return time.monotonic() - start


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
