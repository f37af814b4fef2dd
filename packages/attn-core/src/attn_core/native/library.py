"""Loading the native decode library: a prebuilt copy, a cached build, or a build on first use.

Order: the library ``pip install`` built into the package (``_prebuilt/``), then a build
cached under ``ATTN_CORE_NATIVE_CACHE`` for these sources, toolchain and target, then (unless
``ATTN_CORE_NATIVE_BUILD=0``) a build now. Every outcome is a :class:`NativeStatus` that says
what happened and why; nothing here raises for a missing toolkit, so the torch path runs
wherever the native one cannot. The reason is logged once per process.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from attn_core.core.settings import NativeSettings
from attn_core.native import abi
from attn_core.native.build import build_key, build_library, library_name
from attn_core.native.loader import CLibrary, cache_root, cached_or_built, cuda_index, device_arch
from attn_core.native.toolchain import Toolchain, find_toolchain

log = logging.getLogger("attn_core.native")
PREBUILT = Path(__file__).resolve().parent / "_prebuilt"


@dataclass(frozen=True)
class KernelFacts:
    """One compiled kernel as the driver reports it (what plans and the simulator price)."""

    num_regs: int
    smem_bytes: int
    local_bytes: int
    threads_per_block: int
    blocks_per_sm: int


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native library is usable here, and how it was obtained or why not.

    Attributes:
        available: a library is loaded.
        detail: "prebuilt", "cached build", "built in 34.1 s", or why not.
        path: the loaded file.
        toolchain: compiler kind, version and targets of a build made in this process.
        platform: what the library reports it was compiled for ("nvidia", "iluvatar-corex").
    """

    available: bool
    detail: str
    path: Optional[str] = None
    toolchain: Optional[str] = None
    platform: Optional[str] = None


class NativeError(RuntimeError):
    """A native launch failed (the CUDA error string is in the message)."""


class NativeLibrary(CLibrary):
    """The loaded library with typed entry points."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, abi.declare, "attn_native", abi.ABI_VERSION)
        self.slots = self._lib.attn_native_group_slots()

    def decode(self, args: abi.DecodeArgs, stream: int) -> None:
        """Launch one decode step on ``stream`` (a ``cudaStream_t`` as an int)."""
        rc = self._lib.attn_native_decode(ctypes.byref(args), ctypes.c_void_p(stream))
        if rc:
            raise NativeError(f"native decode launch failed: {self.error_string(rc)} ({rc})")

    def kernel_info(
        self, which: str, query_kind: int, cache_kind: int, bucket: int, group: int
    ) -> KernelFacts:
        """Registers, shared memory and occupancy of the ``"partition"`` or ``"merge"`` kernel
        for a head bucket and GQA group."""
        info = abi.KernelInfo()
        code = 0 if which == "partition" else 1
        rc = self._lib.attn_native_kernel_info(
            code, query_kind, cache_kind, bucket, group, ctypes.byref(info)
        )
        if rc:
            raise NativeError(f"kernel_info({which}) failed: {self.error_string(rc)} ({rc})")
        return KernelFacts(
            num_regs=info.num_regs,
            smem_bytes=info.smem_bytes,
            local_bytes=info.local_bytes,
            threads_per_block=info.threads_per_block,
            blocks_per_sm=info.blocks_per_sm,
        )


_LOCK = threading.Lock()


def load_native(
    settings: NativeSettings, device: torch.device, group: int
) -> tuple[Optional[NativeLibrary], NativeStatus]:
    """The library serving GQA ``group`` on ``device`` (cached per process), with its status."""
    index, why = cuda_index(device)
    if index is None:
        return None, NativeStatus(False, why)
    with _LOCK:
        return _load(settings, device_arch(index, settings.arch), abi.group_slots(group))


@functools.lru_cache(maxsize=32)
def _load(
    settings: NativeSettings, arch: str, slots: int
) -> tuple[Optional[NativeLibrary], NativeStatus]:
    lib, status = _locate(settings, arch, slots)
    if lib is None:
        log.warning("attn-core native decode unavailable, the torch path runs: %s", status.detail)
    return lib, status


def _locate(
    settings: NativeSettings, arch: str, slots: int
) -> tuple[Optional[NativeLibrary], NativeStatus]:
    tried = []
    prebuilt = PREBUILT / library_name(slots)
    if prebuilt.is_file():
        lib, why = _open(prebuilt)
        if lib is not None:
            return lib, NativeStatus(True, "prebuilt", str(prebuilt), None, lib.platform)
        tried.append(f"prebuilt {prebuilt}: {why}")
    toolchain, why = find_toolchain(settings.cuda_home, (arch,))
    if toolchain is None:
        return None, NativeStatus(False, "; ".join([*tried, why]))
    cache = cache_root(settings.cache_dir)
    out_dir = cache / build_key(toolchain)
    # `python -m attn_core.native build` on a machine without a GPU (an image build) targets
    # the platform's default architectures; that library serves this device too.
    every, _ = find_toolchain(settings.cuda_home)
    if every is not None and arch in every.archs:
        built = cache / build_key(every)
        if (built / library_name(slots)).is_file() and not (
            out_dir / library_name(slots)
        ).is_file():
            toolchain, out_dir = every, built
    described = _describe(toolchain)
    path, how = cached_or_built(
        out_dir / library_name(slots), settings.build,
        "no cached build and ATTN_CORE_NATIVE_BUILD is off",
        lambda: build_library(toolchain, out_dir, slots),
    )  # fmt: skip
    if path is None:
        return None, NativeStatus(False, "; ".join([*tried, how]), toolchain=described)
    lib, why = _open(path)
    if lib is None:
        return None, NativeStatus(False, "; ".join([*tried, why]), str(path), described)
    return lib, NativeStatus(True, how, str(path), described, lib.platform)


def _open(path: Path) -> tuple[Optional[NativeLibrary], str]:
    """Load ``path`` and make sure it has code for the current device."""
    try:
        lib = NativeLibrary(path)
        lib.kernel_info("merge", abi.FLOAT16, abi.FLOAT16, 256, lib.slots)
    except OSError as exc:
        return None, f"cannot load: {exc}"
    except NativeError as exc:
        return None, f"no code for this device: {exc}"
    return lib, ""


def _describe(toolchain: Toolchain) -> str:
    return f"{toolchain.kind} {toolchain.version} {','.join(toolchain.archs)}"
