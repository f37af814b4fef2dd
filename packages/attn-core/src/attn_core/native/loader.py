"""What the decode and prefill loaders share (:mod:`.library`, :mod:`.prefill_library`).

Opening a library through its ABI mirror (a stale build is refused, not misread), the CUDA
device a load is for, the build cache, and the "cached or built now" step under the build
switch. Each loader keeps its own typed entry points, per-process cache of loaded libraries
and return contract (decode: :class:`~attn_core.native.library.NativeStatus`; prefill:
``(library, how)``); none of this raises for a missing toolkit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch

from attn_core.device.iluvatar import is_iluvatar
from attn_core.native.build import BuildError, default_cache_dir
from attn_core.native.toolchain import DEFAULT_COREX_ARCH


class CLibrary:
    """A native library loaded with ctypes and given its C signatures by its ABI mirror.

    Every library exports ``<prefix>_abi_version``, ``<prefix>_platform`` and
    ``<prefix>_error_string`` (``csrc/attn_decode_abi.h``: ``attn_native``;
    ``csrc/attn_prefill_abi.h``: ``attn_prefill``).

    Raises:
        OSError: ``path`` does not load, or its ABI version is not ``abi_version``.
    """

    def __init__(
        self,
        path: Path,
        declare: Callable[[ctypes.CDLL], ctypes.CDLL],
        prefix: str,
        abi_version: int,
    ) -> None:
        self.path = path
        self._lib = declare(ctypes.CDLL(str(path)))
        version = getattr(self._lib, f"{prefix}_abi_version")()
        if version != abi_version:
            raise OSError(f"{path} has ABI version {version}, attn-core needs {abi_version}")
        self.platform: str = getattr(self._lib, f"{prefix}_platform")().decode()
        self._error_string = getattr(self._lib, f"{prefix}_error_string")

    def error_string(self, code: int) -> str:
        """The library's name for the nonzero ``code`` one of its calls returned."""
        return self._error_string(code).decode()


def cuda_index(device: torch.device) -> tuple[Optional[int], str]:
    """``(CUDA device index, "")`` (the current device for a bare ``cuda``), or
    ``(None, why not)``."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, f"needs a CUDA device, got {device.type}"
    return (device.index if device.index is not None else torch.cuda.current_device()), ""


def cache_root(cache_dir: Optional[str]) -> Path:
    """The build cache: ``cache_dir`` (``ATTN_CORE_NATIVE_CACHE``) or the default."""
    return Path(cache_dir) if cache_dir else default_cache_dir()


def cached_or_built(
    target: Path, may_build: bool, build_off: str, build: Callable[[], tuple[Path, float]]
) -> tuple[Optional[Path], str]:
    """``(path, "cached build" or "built in 34.1 s")``, or ``(None, why not)``.

    Args:
        target: where the library is when it was built before.
        may_build: whether ``build`` may compile a missing ``target`` now.
        build_off: the reason given when it is missing and may not be built.
        build: makes ``target`` (or finds it, 0 seconds); ``(path, seconds)``.
    """
    if not target.is_file() and not may_build:
        return None, build_off
    try:
        path, seconds = build()
    except (BuildError, OSError) as exc:
        return None, str(exc)
    return path, f"built in {seconds:.1f} s" if seconds else "cached build"


def device_arch(index: int, forced: Optional[str]) -> str:
    """The build target for CUDA device ``index``: ``forced`` (``ATTN_CORE_NATIVE_ARCH``),
    CoreX's default architecture on an Iluvatar GPU, else ``sm_<major><minor>``."""
    if forced:
        return forced
    if is_iluvatar(torch.device("cuda", index)):
        return DEFAULT_COREX_ARCH
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"
