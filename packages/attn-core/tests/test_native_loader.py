"""What the decode and prefill loaders share (attn_core.native.loader), on any machine: the
ABI check and error strings of a loaded library (a stand-in compiled with the host C compiler),
the "cached or built now" answers, and the CPU refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from native_stand_in import stand_in

from attn_core.native import abi, loader
from attn_core.native import prefill_abi as pabi
from attn_core.native.build import BuildError
from attn_core.native.library import NativeLibrary
from attn_core.native.prefill_library import PrefillLibrary


def test_libraries_of_this_abi_load_with_their_identity(tmp_path: Path) -> None:
    path = stand_in(tmp_path, abi.ABI_VERSION, pabi.ABI_VERSION)
    decode, prefill = NativeLibrary(path), PrefillLibrary(path)
    assert (decode.path, decode.platform, decode.slots) == (path, "stand-in", 6)
    assert (prefill.path, prefill.platform, prefill.mma) == (path, "stand-in", "wmma")
    assert decode.error_string(2) == prefill.error_string(2) == "out of memory"


def test_a_stale_abi_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = stand_in(tmp_path, abi.ABI_VERSION + 1, pabi.ABI_VERSION + 7)
    with pytest.raises(OSError, match=f"ABI version {abi.ABI_VERSION + 1}, attn-core needs"):
        NativeLibrary(path)
    with pytest.raises(OSError, match=f"needs {pabi.ABI_VERSION}$"):
        PrefillLibrary(path)


def test_a_missing_library_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        NativeLibrary(tmp_path / "absent.so")


def test_cached_or_built_answers(tmp_path: Path) -> None:
    target = tmp_path / "lib.so"
    calls: list[str] = []

    def built(seconds: float):
        def build() -> tuple[Path, float]:
            calls.append("build")
            target.write_bytes(b"")
            return target, seconds

        return build

    def failing() -> tuple[Path, float]:
        raise BuildError("building the stand-in failed: cc\nboom")

    assert loader.cached_or_built(target, False, "building is off", built(1.0)) == (
        None, "building is off",
    )  # fmt: skip
    assert calls == []  # switched off: no compiler runs
    assert loader.cached_or_built(target, True, "off", failing) == (
        None, "building the stand-in failed: cc\nboom",
    )  # fmt: skip
    assert loader.cached_or_built(target, True, "off", built(34.06)) == (target, "built in 34.1 s")
    # once there, the switch does not matter: the build step finds it (0 seconds)
    assert loader.cached_or_built(target, False, "off", built(0.0)) == (target, "cached build")


def test_cache_root_and_cpu_refusal(tmp_path: Path) -> None:
    assert loader.cache_root(str(tmp_path)) == tmp_path
    assert loader.cache_root(None) == loader.cache_root("") == Path.home() / ".cache/attn_core"
    assert loader.cuda_index(torch.device("cpu")) == (None, "needs a CUDA device, got cpu")


def test_device_arch_forced_then_corex_then_the_devices_own(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(loader, "is_iluvatar", lambda device: False)
    assert loader.device_arch(0, None) == "sm_90"
    assert loader.device_arch(0, "sm_80") == "sm_80"
    monkeypatch.setattr(loader, "is_iluvatar", lambda device: True)
    assert loader.device_arch(0, None) == loader.DEFAULT_COREX_ARCH
    assert loader.device_arch(0, "ivcore11") == "ivcore11"


def test_the_prefill_loader_builds_for_the_decode_loaders_arch(monkeypatch) -> None:
    """On an Iluvatar GPU the prefill build targets CoreX's architecture, as decode's does (it
    asked CoreX clang for sm_<major><minor> before 2026-12-02), and a forced arch wins."""
    from attn_core.native import prefill_library

    seen = []
    monkeypatch.setattr(prefill_library, "cuda_index", lambda device: (0, ""))
    monkeypatch.setattr(loader, "is_iluvatar", lambda device: True)
    monkeypatch.setattr(prefill_library, "_load", lambda mma, arch, *rest: seen.append(arch))
    prefill_library.load_prefill("fma", torch.device("cuda", 0))
    prefill_library.load_prefill("fma", torch.device("cuda", 0), arch="ivcore11")
    assert seen == [loader.DEFAULT_COREX_ARCH, "ivcore11"]
