"""Building and loading the native prefill libraries: one per matrix-tile implementation.

``libattn_prefill_{fma,wmma,corex_wmma}.so`` from ``csrc/paged_prefill.cu`` with
``-DATTN_PREFILL_MMA=<kind>``, built by the decode library's toolchain (``toolchain.py``) into
the same cache (``build.py``'s key plus the prefill-only sources: :func:`prefill_build_key`)
by ``build.py``'s ``compile_library`` (under a lock, appearing by atomic rename). A directory
of prebuilt libraries can be named instead (tests and benchmarks carry libraries compiled on a
machine without a GPU). Nothing here raises for a missing toolkit: the answer is
``(None, why)``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from attn_core.native import prefill_abi as pabi
from attn_core.native.build import (
    CSRC,
    BuildError,
    build_key,
    compile_library,
    default_cache_dir,
    source_digest,
)
from attn_core.native.toolchain import Toolchain, find_toolchain

SOURCE = CSRC / "paged_prefill.cu"


def library_name(mma: str) -> str:
    """File name of the prefill library built with matrix layer ``mma``."""
    if mma not in pabi.MMA_KINDS:
        raise ValueError(f"mma must be one of {sorted(pabi.MMA_KINDS)}, got {mma!r}")
    return f"libattn_prefill_{mma}.so"


@dataclass(frozen=True)
class ConfigFacts:
    """One compiled tile configuration, as the driver reports it."""

    config: int
    rows: int
    keys: int
    threads: int
    smem_bytes: int
    num_regs: int
    local_bytes: int
    blocks_per_sm: int


class PrefillLibrary:
    """A loaded prefill library with typed entry points."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = pabi.declare(ctypes.CDLL(str(path)))
        version = self._lib.attn_prefill_abi_version()
        if version != pabi.ABI_VERSION:
            raise OSError(f"{path} has ABI version {version}, attn-core needs {pabi.ABI_VERSION}")
        kinds = {v: k for k, v in pabi.MMA_KINDS.items()}
        self.mma = kinds[self._lib.attn_prefill_mma()]
        self.platform = self._lib.attn_prefill_platform().decode()

    def launch(self, args: pabi.PrefillArgs, stream: int) -> None:
        rc = self._lib.attn_prefill(ctypes.byref(args), ctypes.c_void_p(stream))
        if rc:
            raise RuntimeError(f"native prefill launch failed: {self.error_string(rc)} ({rc})")

    def config_facts(
        self, config: int, query_kind: int, cache_kind: int, head_bucket: int
    ) -> Optional[ConfigFacts]:
        """Resources of one kernel, or None where this library has none for the combination."""
        info = pabi.PrefillConfigInfo()
        rc = self._lib.attn_prefill_config_info(
            config, query_kind, cache_kind, head_bucket, ctypes.byref(info)
        )
        if rc:
            raise RuntimeError(f"config_info failed: {self.error_string(rc)} ({rc})")
        if not info.available:
            return None
        return ConfigFacts(
            config,
            info.rows,
            info.keys,
            info.threads,
            info.smem_bytes,
            info.num_regs,
            info.local_bytes,
            info.blocks_per_sm,
        )

    def error_string(self, code: int) -> str:
        return self._lib.attn_prefill_error_string(code).decode()


def build_prefill_library(toolchain: Toolchain, out_dir: Path, mma: str) -> tuple[Path, float]:
    """Build ``mma``'s library into ``out_dir`` unless it is there; ``(path, seconds)``."""
    defines = (f"ATTN_PREFILL_MMA={pabi.MMA_KINDS[mma]}",)
    failed = f"building the native prefill kernel ({mma}) failed"
    return compile_library(toolchain, SOURCE, out_dir / library_name(mma), defines, failed)


def prefill_build_key(toolchain: Toolchain) -> str:
    """Cache key: the decode library's (shared sources, compiler, targets) and the
    prefill-only sources."""
    h = hashlib.sha256(build_key(toolchain).encode())
    h.update(source_digest(prefill=True).encode())
    return "prefill-" + h.hexdigest()[:20]


_LOCK = threading.Lock()


def load_prefill(
    mma: str,
    device: torch.device,
    *,
    library_dir: Optional[str] = None,
    cuda_home: Optional[str] = None,
    cache_dir: Optional[str] = None,
    build: bool = True,
) -> tuple[Optional[PrefillLibrary], str]:
    """``(library, how it was obtained)`` or ``(None, why not)`` for matrix layer ``mma``.

    Args:
        library_dir: load ``library_name(mma)`` from here and nowhere else.
        cuda_home / cache_dir / build: the toolkit root, the build cache (default
            ``~/.cache/attn_core``) and whether a missing build may be made now.
    """
    library_name(mma)  # validates
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, f"needs a CUDA device, got {device.type}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    with _LOCK:
        return _load(mma, f"sm_{major}{minor}", library_dir, cuda_home, cache_dir, build)


@functools.lru_cache(maxsize=16)
def _load(
    mma: str,
    arch: str,
    library_dir: Optional[str],
    cuda_home: Optional[str],
    cache_dir: Optional[str],
    build: bool,
) -> tuple[Optional[PrefillLibrary], str]:
    if library_dir is not None:
        return _open(Path(library_dir) / library_name(mma), "prebuilt")
    toolchain, why = find_toolchain(cuda_home, (arch,))
    if toolchain is None:
        return None, why
    out_dir = Path(cache_dir or default_cache_dir()) / prefill_build_key(toolchain)
    if not (out_dir / library_name(mma)).is_file() and not build:
        return None, "no cached build and building is off"
    try:
        path, seconds = build_prefill_library(toolchain, out_dir, mma)
    except (BuildError, OSError) as exc:
        return None, str(exc)
    return _open(path, f"built in {seconds:.1f} s" if seconds else "cached build")


def _open(path: Path, how: str) -> tuple[Optional[PrefillLibrary], str]:
    if not path.is_file():
        return None, f"no library at {path}"
    try:
        lib = PrefillLibrary(path)
        # has code for this device: asking a kernel's attributes fails otherwise
        lib.config_facts(pabi.CONFIG_32K, 1, 1, 64)
    except (OSError, RuntimeError) as exc:
        return None, f"cannot use {path}: {exc}"
    return lib, f"{how}: {path}"
