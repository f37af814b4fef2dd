"""Building and loading the native prefill libraries: one per matrix-tile implementation.

``libattn_prefill_{fma,wmma,corex_wmma}.so`` from ``csrc/paged_prefill.cu`` with
``-DATTN_PREFILL_MMA=<kind>``, built by the decode library's toolchain (``toolchain.py``) into
the same cache (``build.py``'s key over the files ``paged_prefill.cu`` includes:
:func:`prefill_build_key`)
by ``build.py``'s ``compile_library`` (under a lock, appearing by atomic rename); what loading
shares with the decode library is in :mod:`.loader`. A directory of prebuilt libraries can be
named instead (tests and benchmarks carry libraries compiled on a machine without a GPU).
Nothing here raises for a missing toolkit: the answer is ``(None, why)``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from attn_core.native import prefill_abi as pabi
from attn_core.native.build import CSRC, build_key, compile_library
from attn_core.native.loader import CLibrary, cache_root, cached_or_built, cuda_index, device_arch
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


class PrefillLibrary(CLibrary):
    """A loaded prefill library with typed entry points."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, pabi.declare, "attn_prefill", pabi.ABI_VERSION)
        kinds = {v: k for k, v in pabi.MMA_KINDS.items()}
        self.mma = kinds[self._lib.attn_prefill_mma()]

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


def build_prefill_library(toolchain: Toolchain, out_dir: Path, mma: str) -> tuple[Path, float]:
    """Build ``mma``'s library into ``out_dir`` unless it is there; ``(path, seconds)``."""
    defines = (f"ATTN_PREFILL_MMA={pabi.MMA_KINDS[mma]}",)
    failed = f"building the native prefill kernel ({mma}) failed"
    return compile_library(
        toolchain, SOURCE, out_dir / library_name(mma), defines, failed, flush_denormals=True
    )


def prefill_build_key(toolchain: Toolchain) -> str:
    """Cache key: the files ``paged_prefill.cu`` compiles, compiler, targets and the command
    lines with subnormals flushed, as prefill builds (no decode-only file: a decode edit does
    not rebuild prefill)."""
    return "prefill-" + build_key(toolchain, source=SOURCE, flush_denormals=True)


_LOCK = threading.Lock()


def load_prefill(
    mma: str,
    device: torch.device,
    *,
    library_dir: Optional[str] = None,
    cuda_home: Optional[str] = None,
    cache_dir: Optional[str] = None,
    build: bool = True,
    arch: Optional[str] = None,
) -> tuple[Optional[PrefillLibrary], str]:
    """``(library, how it was obtained)`` or ``(None, why not)`` for matrix layer ``mma``.

    Args:
        library_dir: load ``library_name(mma)`` from here and nowhere else.
        cuda_home / cache_dir / build: the toolkit root, the build cache (default
            ``~/.cache/attn_core``) and whether a missing build may be made now.
        arch: the build target (``ATTN_CORE_NATIVE_ARCH``); default the device's own, CoreX's
            architecture on an Iluvatar GPU (as the decode loader picks it).
    """
    library_name(mma)  # validates
    index, why = cuda_index(torch.device(device))
    if index is None:
        return None, why
    with _LOCK:
        return _load(mma, device_arch(index, arch), library_dir, cuda_home, cache_dir, build)


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
    out_dir = cache_root(cache_dir) / prefill_build_key(toolchain)
    path, how = cached_or_built(
        out_dir / library_name(mma), build, "no cached build and building is off",
        lambda: build_prefill_library(toolchain, out_dir, mma),
    )  # fmt: skip
    if path is None:
        return None, how
    return _open(path, how)


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
