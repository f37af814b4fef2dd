"""What loading shares across kernel families (attn_core.native.loader), on any machine: the
ABI check and error strings of a loaded library (a stand-in compiled with the host C compiler),
the "cached or built now" answers, and the CPU refusal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from native_stand_in import stand_in

from attn_core.core.settings import NativeSettings
from attn_core.native import build, loader
from attn_core.native.build import BuildError
from attn_core.native.decode import DecodeLibrary
from attn_core.native.family import DECODE, PREFILL
from attn_core.native.prefill import PrefillLibrary
from attn_core.native.toolchain import Toolchain


def test_libraries_of_this_abi_load_with_their_identity(tmp_path: Path) -> None:
    path = stand_in(tmp_path, DECODE.abi_version, PREFILL.abi_version)
    decode, prefill = DecodeLibrary(path), PrefillLibrary(path)
    assert (decode.path, decode.platform, decode.slots) == (path, "stand-in", 6)
    assert (prefill.path, prefill.platform, prefill.mma) == (path, "stand-in", "wmma")
    assert decode.error_string(2) == prefill.error_string(2) == "out of memory"


def test_a_stale_abi_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = stand_in(tmp_path, DECODE.abi_version + 1, PREFILL.abi_version + 7)
    with pytest.raises(OSError, match=f"ABI version {DECODE.abi_version + 1}, attn-core needs"):
        DecodeLibrary(path)
    with pytest.raises(OSError, match=f"needs {PREFILL.abi_version}$"):
        PrefillLibrary(path)


def test_a_missing_library_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        DecodeLibrary(tmp_path / "absent.so")


class _Probed(DecodeLibrary):
    """The stand-in's kernel entries fail (it has no kernels): its probe is taken as passed."""

    def probe(self) -> None:
        pass


def test_cached_or_built_answers(tmp_path: Path, monkeypatch) -> None:
    """The cache-or-build step of :func:`loader._locate`: building switched off and nothing
    cached is a reason and no compiler runs; a failed build is its error; a build is timed; a
    cached library loads whatever the switch says."""
    library = stand_in(tmp_path, DECODE.abi_version, PREFILL.abi_version)
    toolchain = Toolchain("nvcc", "/opt/nvcc", "/opt", ("sm_90",), "stand-in 1.0")
    monkeypatch.setattr(loader, "PREBUILT", tmp_path / "no-prebuilt")
    monkeypatch.setattr(loader, "find_toolchain", lambda home, archs=None: (toolchain, ""))
    calls: list[str] = []
    outcome: dict = {"seconds": 1.0}

    def compile_library(tc, source, target, defines, failed, *, flush_denormals=False):
        if target.is_file():
            return target, 0.0
        calls.append(target.name)
        if outcome.get("fail"):
            raise BuildError(f"{failed}: cc\nboom")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(library.read_bytes())
        # the build record a real build leaves beside the library, which a cache hit checks
        key = build.library_key(tc, source, target.name, defines, flush_denormals=flush_denormals)
        data = target.read_bytes()
        record = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        build.record_path(target).write_text(json.dumps(record))
        return target, outcome["seconds"]

    monkeypatch.setattr(build, "compile_library", compile_library)
    cache = tmp_path / "cache"
    expected = cache / build.family_key(toolchain, DECODE) / DECODE.library_name("g6")

    def locate(build_on: bool):
        settings = NativeSettings(build=build_on, cache_dir=str(cache))
        return loader._locate(_Probed, "g6", settings, "sm_90", None)

    lib, status = locate(False)
    assert lib is None and status.detail == "no cached build and ATTN_CORE_NATIVE_BUILD is off"
    assert calls == []  # switched off: no compiler runs
    outcome["fail"] = True
    lib, status = locate(True)
    assert lib is None and status.detail.endswith(": cc\nboom")
    assert status.detail.startswith("building the native decode kernel (g6) failed")
    outcome.update(fail=False, seconds=34.06)
    lib, status = locate(True)
    assert lib is not None and status.available
    assert (status.detail, status.path) == ("built in 34.1 s", str(expected))
    assert calls == [DECODE.library_name("g6")] * 2
    # once there, the switch does not matter: the build step finds it (0 seconds)
    lib, status = locate(False)
    assert lib is not None and (status.detail, status.path) == ("cached build", str(expected))
    assert len(calls) == 2


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


@pytest.mark.parametrize("cls", (DecodeLibrary, PrefillLibrary), ids=("decode", "prefill"))
def test_every_family_builds_for_the_devices_arch(cls, monkeypatch) -> None:
    """On an Iluvatar GPU every family's build targets CoreX's architecture (the prefill loader
    asked CoreX clang for sm_<major><minor> before 2026-12-02), and a forced arch wins."""
    seen = []
    monkeypatch.setattr(loader, "cuda_index", lambda device: (0, ""))
    monkeypatch.setattr(loader, "is_iluvatar", lambda device: True)

    def locate(family_cls, variant, settings, arch, library_dir):
        seen.append(arch)
        return None, loader.NativeStatus(False, "stubbed")

    monkeypatch.setattr(loader, "_locate", locate)
    loader._load.cache_clear()  # every answer below comes from this test's stub, none is kept
    try:
        variant = next(iter(cls.FAMILY.variants))
        cuda = torch.device("cuda", 0)
        loader.load_library(cls, variant, NativeSettings(), cuda)
        loader.load_library(cls, variant, NativeSettings(arch="ivcore11"), cuda)
    finally:
        loader._load.cache_clear()
    assert seen == [loader.DEFAULT_COREX_ARCH, "ivcore11"]
