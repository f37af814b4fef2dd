"""Loading any kernel family's library, and whether it may serve a configuration here.

One path for every family (:mod:`.family`), in this order: the library ``pip install`` built
into the package (``_prebuilt/``), a build cached under ``ATTN_CORE_NATIVE_CACHE`` for these
sources, toolchain and target, then (unless ``ATTN_CORE_NATIVE_BUILD=0``) a build now. Every
outcome is a :class:`NativeStatus` that says what happened and why; nothing here raises for a
missing toolkit, so the torch path runs wherever the native one cannot. The reason is logged
once per process.

:func:`native_ready` is the impure step the resolver (:mod:`attn_core.runtime.resolve`) takes
once per resolved plan: load, then ask the verify-once registry (:mod:`attn_core.core.
verify_once`) whether the library matched the float64 reference for this configuration on this
device. A verification syncs, so during a CUDA-graph capture an unverified configuration is
reported as not ready (the registry keeps no verdict then) and that plan takes the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar

import torch

from attn_core.core import verify_once
from attn_core.core.settings import NativeSettings
from attn_core.device.iluvatar import is_iluvatar
from attn_core.native import abi
from attn_core.native.build import (
    BuildError,
    build_variant,
    cached_damage,
    damage,
    default_cache_dir,
    family_key,
)
from attn_core.native.family import Family
from attn_core.native.toolchain import DEFAULT_COREX_ARCH, Toolchain, find_toolchain

log = logging.getLogger("attn_core.native")
PREBUILT = Path(__file__).resolve().parent / "_prebuilt"


@dataclass(frozen=True)
class NativeStatus:
    """Whether a native library is usable here, and how it was obtained or why not.

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
    """A native call failed (the library's error string is in the message)."""


class NativeLibrary:
    """A family's library loaded with ctypes, its functions given their C signatures.

    A family's binding subclasses this with :attr:`FAMILY`, :attr:`FUNCTIONS` (C name ->
    ``(restype, argtypes)``), :attr:`VERIFY_KIND` (its check in the verify-once registry) and
    :meth:`probe` (a cheap call that fails where the library has no code for the device).

    Raises:
        OSError: ``path`` does not load, or its ABI version is not the family's.
    """

    FAMILY: ClassVar[Family]
    FUNCTIONS: ClassVar[dict[str, tuple[Any, list]]] = {}
    VERIFY_KIND: ClassVar[str]

    def __init__(self, path: Path) -> None:
        self.path = path
        prefix = self.FAMILY.prefix
        self._lib = ctypes.CDLL(str(path))
        abi.declare(self._lib, prefix, self.FUNCTIONS)
        version = getattr(self._lib, f"{prefix}_abi_version")()
        if version != self.FAMILY.abi_version:
            raise OSError(
                f"{path} has ABI version {version}, attn-core needs {self.FAMILY.abi_version}"
            )
        self.platform: str = getattr(self._lib, f"{prefix}_platform")().decode()
        self._error_string = getattr(self._lib, f"{prefix}_error_string")

    def error_string(self, code: int) -> str:
        """The library's name for the nonzero ``code`` one of its calls returned."""
        return self._error_string(code).decode()

    def check(self, rc: int, what: str) -> None:
        """``NativeError`` naming ``what`` and the library's error for a nonzero ``rc``."""
        if rc:
            raise NativeError(f"{what} failed: {self.error_string(rc)} ({rc})")

    def read_kernel_info(self, export: str, *args: int) -> abi.KernelFacts:
        """The driver's facts of one kernel from the family's kernel-info ``export`` (its
        arguments before the :class:`~attn_core.native.abi.KernelInfo` it fills)."""
        info = abi.KernelInfo()
        self.check(getattr(self._lib, export)(*args, ctypes.byref(info)), f"{export}{args}")
        return abi.KernelFacts(
            num_regs=info.num_regs,
            smem_bytes=info.smem_bytes,
            local_bytes=info.local_bytes,
            threads_per_block=info.threads_per_block,
            blocks_per_sm=info.blocks_per_sm,
        )

    def probe(self) -> None:
        """Raise (``NativeError``) unless the library has code for the current device."""

    def verify_config(self, shape: Any) -> tuple:
        """The verify-once registry's ``config`` of this library for ``shape`` (the file name
        names the family and variant); an attention family's ``shape`` is an
        :class:`~attn_core.core.shapes.AttentionShape`, another family's is its own."""
        return (
            self.path.name, shape.dtype, shape.kv_cache_dtype, shape.head_size,
            shape.block_size, shape.group,
        )  # fmt: skip


Library = TypeVar("Library", bound=NativeLibrary)


def cuda_index(device: torch.device) -> tuple[Optional[int], str]:
    """``(CUDA device index, "")`` (the current device for a bare ``cuda``), or
    ``(None, why not)``."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, f"needs a CUDA device, got {device.type}"
    return (device.index if device.index is not None else torch.cuda.current_device()), ""


def device_arch(index: int, forced: Optional[str]) -> str:
    """The build target for CUDA device ``index``: ``forced`` (``ATTN_CORE_NATIVE_ARCH``),
    CoreX's default architecture on an Iluvatar GPU, else ``sm_<major><minor>``."""
    if forced:
        return forced
    if is_iluvatar(torch.device("cuda", index)):
        return DEFAULT_COREX_ARCH
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def cache_root(cache_dir: Optional[str]) -> Path:
    """The build cache: ``cache_dir`` (``ATTN_CORE_NATIVE_CACHE``, ``~`` expanded) or the
    default."""
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


_LOCK = threading.Lock()


def load_library(
    cls: type[Library],
    variant: str,
    settings: NativeSettings,
    device: torch.device,
    *,
    library_dir: Optional[str] = None,
) -> tuple[Optional[Library], NativeStatus]:
    """``cls``'s ``variant`` library for ``device`` (kept per process), with its status.
    ``library_dir``: load it from there and nowhere else (benchmarks and tests carry libraries
    compiled on a machine without a GPU)."""
    cls.FAMILY.library_name(variant)  # validates the variant
    index, why = cuda_index(torch.device(device))
    if index is None:
        return None, NativeStatus(False, why)
    key = (cls, variant, settings, device_arch(index, settings.arch), library_dir)
    with _LOCK:
        return _load(key)  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def _load(key: tuple) -> tuple[Optional[NativeLibrary], NativeStatus]:
    """:func:`_locate` once per ``(class, variant, settings, arch, library_dir)``; a library
    that is not there is said once, in the log."""
    lib, status = _locate(*key)
    if lib is None:
        log.warning(
            "attn-core native %s (%s) unavailable, the torch path runs: %s",
            key[0].FAMILY.name, key[1], status.detail,
        )  # fmt: skip
    return lib, status


def _locate(
    cls: type[Library],
    variant: str,
    settings: NativeSettings,
    arch: str,
    library_dir: Optional[str],
) -> tuple[Optional[Library], NativeStatus]:
    family = cls.FAMILY
    name = family.library_name(variant)
    if library_dir is not None:
        return _open(cls, Path(library_dir) / name, "prebuilt", None)
    tried = []
    prebuilt = PREBUILT / name
    if prebuilt.is_file():
        # the install's own build wrote the record; what it vouches for here is the bytes
        broken = damage(prebuilt)
        lib, status = (None, NativeStatus(False, f"damaged: {broken}")) if broken else (
            _open(cls, prebuilt, "prebuilt", None))  # fmt: skip
        if lib is not None:
            return lib, status
        tried.append(f"prebuilt {prebuilt}: {status.detail}")
    toolchain, why = find_toolchain(settings.cuda_home, (arch,))
    if toolchain is None:
        return None, NativeStatus(False, "; ".join([*tried, why]))
    cache = cache_root(settings.cache_dir)
    out_dir = cache / family_key(toolchain, family)
    # `python -m attn_core.native build` on a machine without a GPU (an image build) targets
    # the platform's default architectures; that library serves this device too.
    every, _ = find_toolchain(settings.cuda_home)
    if every is not None and arch in every.archs:
        built = cache / family_key(every, family)
        whole = not cached_damage(every, built / name, family, variant)
        if whole and cached_damage(toolchain, out_dir / name, family, variant):
            toolchain, out_dir = every, built
    described = _describe(toolchain)
    if not settings.build:
        # a cached library is used only when its build record vouches for it (a truncated one
        # was once reported as a cached build and loaded)
        broken = cached_damage(toolchain, out_dir / name, family, variant)
        if broken and (out_dir / name).exists():
            detail = f"cached build is damaged: {broken} (ATTN_CORE_NATIVE_BUILD is off)"
            return None, NativeStatus(False, "; ".join([*tried, detail]), toolchain=described)
        if broken:
            detail = "no cached build and ATTN_CORE_NATIVE_BUILD is off"
            return None, NativeStatus(False, "; ".join([*tried, detail]), toolchain=described)
    try:
        path, seconds = build_variant(toolchain, out_dir, family, variant)
    except (BuildError, OSError, ValueError) as exc:  # ValueError: a bad lock limit, named
        return None, NativeStatus(False, "; ".join([*tried, str(exc)]), toolchain=described)
    how = f"built in {seconds:.1f} s" if seconds else "cached build"
    lib, status = _open(cls, path, how, described)
    if lib is None:
        return None, NativeStatus(False, "; ".join([*tried, status.detail]), str(path), described)
    return lib, status


def _open(
    cls: type[Library], path: Path, how: str, toolchain: Optional[str]
) -> tuple[Optional[Library], NativeStatus]:
    """Load ``path`` and make sure it has code for the current device."""
    if not path.is_file():
        return None, NativeStatus(False, f"no library at {path}", toolchain=toolchain)
    try:
        lib = cls(path)
        lib.probe()
    except OSError as exc:
        return None, NativeStatus(False, f"cannot load: {exc}", str(path), toolchain)
    except NativeError as exc:
        return None, NativeStatus(False, f"no code for this device: {exc}", str(path), toolchain)
    return lib, NativeStatus(True, how, str(path), toolchain, lib.platform)


def _describe(toolchain: Toolchain) -> str:
    return f"{toolchain.kind} {toolchain.version} {','.join(toolchain.archs)}"


def verify_config(lib: NativeLibrary, shape: Any) -> tuple:
    """The verify-once registry's ``config`` of ``lib`` for ``shape``
    (:meth:`NativeLibrary.verify_config`)."""
    return lib.verify_config(shape)


def verify(lib: NativeLibrary, device: torch.device, shape: Any) -> verify_once.Verdict:
    """The kept verdict of ``lib`` for ``shape`` on ``device``, checking it now if none."""
    return verify_once.verdict(lib.VERIFY_KIND, device, verify_config(lib, shape), lib)


def native_ready(
    cls: type[Library],
    variant: str,
    settings: NativeSettings,
    device: torch.device,
    shape: Any,
) -> tuple[Optional[Library], str]:
    """``(library, "")`` when ``cls``'s ``variant`` may serve ``shape`` on ``device``: loaded
    and matched the float64 reference here; else ``(None, why)``."""
    if device.type != "cuda":
        return None, f"needs a CUDA device, got {device.type}"
    lib, status = load_library(cls, variant, settings, device)
    if lib is None:
        return None, f"not available ({status.detail})"
    verdict = verify(lib, device, shape)
    if not verdict.ok:
        return None, f"not verified: it did not match the float64 reference ({verdict.detail})"
    return lib, ""
