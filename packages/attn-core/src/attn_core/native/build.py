"""Compiling the native libraries, once per source and toolchain (standard library only).

Every kernel family (:mod:`.family`) is built here, variant by variant: ``setup.py`` calls
:func:`build_all` at ``pip install`` time (the libraries then ship inside the package), and a
source checkout builds on first use into a cache directory keyed by a hash of the family's
sources, the compiler version and the targets (:func:`family_key`), so an edited kernel never
loads stale. Concurrent builds (pytest-xdist workers, several vLLM ranks) serialise on a lock
file and a library appears by an atomic rename (:func:`compile_library`), with a build record
beside it (its key, size and sha256) that every later cache hit is checked against. Nothing a
build writes follows a symbolic link (a link is replaced, never written through), and a stop
(Ctrl-C, SIGTERM) kills the compilers and removes the temporary folders (:func:`build_all`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

try:
    from attn_core.core.files import write_atomic
except ImportError:  # loaded by path (setup.py, nox's clang session): no package, no torch
    _files_spec = importlib.util.spec_from_file_location(
        "_attn_core_files", Path(__file__).resolve().parents[1] / "core" / "files.py"
    )
    assert _files_spec is not None and _files_spec.loader is not None
    _files = importlib.util.module_from_spec(_files_spec)
    _files_spec.loader.exec_module(_files)
    write_atomic = _files.write_atomic

if TYPE_CHECKING:  # setup.py loads this file alone, without the attn_core package (or torch)
    from attn_core.native.family import Family
    from attn_core.native.toolchain import Toolchain

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "paged_decode.cu"

# One library (30 kernels, fully unrolled loops) takes ~2 min of CPU with nvcc 13.0 for sm_90
# (group 6: 125 s user) and took up to ~14 min of wall time on a 2-core machine shared by
# several builds; the limit only catches a hung compiler.
BUILD_TIMEOUT_S = 1800
# How long a builder waits for another's lock on the same library before it gives up: one
# library's worst build above, so a live builder is waited out and a stopped one is not
# waited on forever.
LOCK_TIMEOUT_VAR = "ATTN_CORE_NATIVE_LOCK_TIMEOUT"
LOCK_TIMEOUT_S = 1800.0


class BuildError(RuntimeError):
    """The compiler failed; the message carries its command and the tail of its output."""


class BuildLockTimeout(BuildError):
    """Another process held a library's build lock past :func:`lock_timeout`."""


class BuildStopped(BuildError):
    """The build was stopped (:func:`stop_compilers`) before this library was done."""


class Terminated(BaseException):
    """SIGTERM arrived during :func:`stop_on_signals` (SIGINT is ``KeyboardInterrupt``)."""


def lock_timeout() -> float:
    """Seconds to wait for another builder's lock: ``ATTN_CORE_NATIVE_LOCK_TIMEOUT`` or
    :data:`LOCK_TIMEOUT_S`; ValueError naming the variable for anything but a positive number."""
    raw = os.environ.get(LOCK_TIMEOUT_VAR, "").strip()
    if not raw:
        return LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{LOCK_TIMEOUT_VAR} must be a positive number of seconds, got {raw!r}")
    return value


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


def library_key(
    toolchain: Toolchain,
    source: Path,
    name: str,
    defines: tuple[str, ...],
    *,
    flush_denormals: bool = False,
) -> str:
    """What one library is built from: :func:`build_key` plus its file name and macros (the
    tuning and facts builds share a family's key folder layout but not its macros)."""
    base = build_key(toolchain, source=source, flush_denormals=flush_denormals)
    h = hashlib.sha256(base.encode())
    h.update("|".join((name, *defines)).encode())
    return h.hexdigest()[:20]


def record_path(library: Path) -> Path:
    """The build record beside ``library``: its key, size and sha256 (``<library>.json``)."""
    return library.with_name(library.name + ".json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def damage(library: Path, key: Optional[str] = None, *, log: bool = False) -> str:
    """Why ``library`` cannot be vouched for ("" when it can): its build record is missing or
    unreadable, names another build (``key``; None checks only the bytes), or its size or
    sha256 is not the library's; with ``log``, also its compiler log (:func:`log_path`, what
    ``facts`` reads) must be the one its build wrote. A truncated or emptied library was once
    served as a cached build (0.0 s); this is the check every cache hit passes first."""
    if not library.is_file():
        return f"no library at {library}"
    try:
        record = json.loads(record_path(library).read_text())
        size, digest, built = int(record["size"]), str(record["sha256"]), str(record["key"])
    except FileNotFoundError:
        return f"{library} has no build record ({record_path(library).name})"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{library}'s build record is unreadable ({exc})"
    if key is not None and built != key:
        return f"{library} was built from other sources or flags (key {built}, expected {key})"
    actual = library.stat().st_size
    if actual != size:
        return f"{library} is {actual} bytes, its build made {size}"
    if _sha256(library) != digest:
        return f"{library}'s sha256 is not its build's"
    if log:
        logged = log_path(library)
        if not logged.is_file() or _sha256(logged) != record.get("log_sha256"):
            return f"{logged} is not the log its build wrote"
    return ""


def cached_damage(
    toolchain: Toolchain,
    library: Path,
    family: Family,
    variant: str,
    *,
    defines: tuple[str, ...] = (),
    log: bool = False,
) -> str:
    """:func:`damage` of ``family``'s ``variant`` built by ``toolchain`` (with ``defines``
    before the variant's own) at ``library``."""
    key = library_key(
        toolchain, CSRC / family.source, library.name, (*defines, *family.variants[variant]),
        flush_denormals=family.flush_denormals,
    )  # fmt: skip
    return damage(library, key, log=log)


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
        BuildError: every command line failed (the last one's output is in the message), the
            lock was held too long (:class:`BuildLockTimeout`) or the build was stopped.
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
        KeyboardInterrupt, Terminated: the running compilers were killed, the libraries not yet
            started skipped and every temporary folder removed before it propagates.
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
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = []
    try:
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
    except BaseException:
        # Ctrl-C once compiled every remaining library before the traceback: stop now
        for _, future in futures:
            future.cancel()
        stop_compilers()
        raise
    finally:
        pool.shutdown(wait=True)  # the workers remove their temporary folders as they stop
        _STOPPING.clear()
    if failures:
        raise BuildError("\n".join(failures))
    return time.monotonic() - start


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block (main thread), SIGTERM raises :class:`Terminated` the way SIGINT raises
    ``KeyboardInterrupt``, so a build stopped either way cleans up (:func:`build_all`)."""

    def terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_STOPPING = threading.Event()
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def stop_compilers() -> None:
    """Kill every compiler this process runs (their whole process groups: nvcc's cicc and
    ptxas too) and make the builds not yet started stop (:class:`BuildStopped`)."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, opened without following a link; a link found there is
    removed (a symlinked lock once emptied a file outside the cache)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    os.unlink(path)
    return os.open(path, flags, 0o644)


def _holder(fd: int) -> str:
    """The pid the lock's holder wrote into it, or "unknown" (a builder that predates this)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "an unknown process"


def _acquire(path: Path, timeout: float) -> int:
    """Hold ``path``'s lock (its descriptor), the holder's pid written into it.

    Raises:
        BuildLockTimeout: another process held it for ``timeout`` seconds (named).
        BuildStopped: :func:`stop_compilers` was called while waiting.
    """
    deadline = time.monotonic() + timeout
    said = False
    while True:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if not said:
                print(
                    f"attn-core: waiting for {path}, held by {holder} (a build of the same "
                    f"library); giving up after {timeout:.0f} s ({LOCK_TIMEOUT_VAR})",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                said = True
            if _STOPPING.is_set():
                raise BuildStopped(f"stopped while waiting for {path}") from None
            if time.monotonic() >= deadline:
                raise BuildLockTimeout(
                    f"gave up after {timeout:.0f} s waiting for the build lock {path}, held by "
                    f"{holder} (a stopped or hung build? {LOCK_TIMEOUT_VAR} sets the limit)"
                ) from None
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
            continue
        # the builder before us removes its lock file on release: only the file still at the
        # path serialises, so a lock taken on a removed one is taken again
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            continue
        held = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd


def _release(path: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)  # removed while still held: a waiter then finds the path changed
    os.close(fd)


def compile_library(
    toolchain: Toolchain,
    source: Path,
    target: Path,
    defines: tuple[str, ...],
    failed: str,
    *,
    flush_denormals: bool = False,
) -> tuple[Path, float]:
    """Compile ``source`` (includes from :data:`CSRC`) into ``target`` unless a build of it
    that its record vouches for (:func:`damage`) is there; ``(target, seconds)``, 0.0 when it
    was. Every library, decode and prefill, is made here.

    One lock file per library (``.<name>.lock`` beside it, holding its builder's pid, removed
    after) serialises concurrent builders; each of ``toolchain``'s command lines is tried in a
    temporary directory until one succeeds; its command and output go to ``<library>.log``, the
    library appears by atomic rename and its record (:func:`record_path`) after it.

    Raises:
        BuildError: every command line failed; the message is ``failed``, the last command and
            the tail of its output. BuildLockTimeout / BuildStopped (:func:`_acquire`).
        ValueError: ``ATTN_CORE_NATIVE_LOCK_TIMEOUT`` is not a positive number.
    """
    timeout = lock_timeout()
    out_dir, name = target.parent, target.name
    out_dir.mkdir(parents=True, exist_ok=True)
    key = library_key(toolchain, source, name, defines, flush_denormals=flush_denormals)
    lock_path = out_dir / f".{name}.lock"
    fd = _acquire(lock_path, timeout)
    try:
        if not damage(target, key):
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
                if _STOPPING.is_set():
                    raise BuildStopped(f"{failed}: stopped")
                if done.returncode == 0 and partial.is_file() and partial.stat().st_size:
                    log = (" ".join(cmd) + "\n" + done.stdout + done.stderr).encode()
                    write_atomic(log_path(target), log)
                    record = {"key": key, "size": partial.stat().st_size,
                              "sha256": _sha256(partial),
                              "log_sha256": hashlib.sha256(log).hexdigest()}  # fmt: skip
                    os.replace(partial, target)
                    write_atomic(record_path(target), json.dumps(record).encode() + b"\n")
                    return target, time.monotonic() - start
                failures.append((cmd, done))
        cmd, done = failures[-1]
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise BuildError(f"{failed}: {' '.join(cmd)}\n{tail}")
    finally:
        _release(lock_path, fd)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    """``cmd`` in its own process group (:func:`stop_compilers` kills the whole group; a
    terminal's Ctrl-C reaches this process, which then does), text decoded leniently."""
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        if _STOPPING.is_set():  # stopped between the check and the start
            _kill(proc)
        try:
            out, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {BUILD_TIMEOUT_S} s")
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    text = (out.decode(errors="replace"), err.decode(errors="replace"))
    return subprocess.CompletedProcess(cmd, proc.returncode, *text)
