"""Upstream clang in CUDA mode against a ``--cuda-path`` made of the registry's wheels is a
toolchain (CI builds one library with it from the installed package: ``nox -s clang``)."""

from __future__ import annotations

from pathlib import Path

from attn_core.native import build
from attn_core.native.family import DECODE, PREFILL
from attn_core.native.toolchain import CLANG_FTZ, Toolchain, foreign_archs

CLANG = Toolchain("clang", "clang++-16", "/farm", ("sm_80",), "Ubuntu clang version 16.0.6")


def test_upstream_clang_builds_cuda_against_its_cuda_path_with_a_static_runtime() -> None:
    (cmd,) = CLANG.commands(Path("k.cu"), Path("inc"), Path("lib.so"), ("ATTN_GROUP_SLOTS=1",))
    flags = ("-x", "cuda", "--cuda-path=/farm", "--cuda-gpu-arch=sm_80", "-shared", "-fPIC")
    flags += ("-DATTN_GROUP_SLOTS=1", "-L/farm/lib64", "-lcudart_static", "-Xcuda-ptxas")
    for flag in flags:
        assert flag in cmd, (flag, cmd)
    assert cmd[cmd.index("-o") + 1] == "lib.so" and cmd[-1] != "ivcore"
    (flushed,) = CLANG.commands(Path("k.cu"), Path("inc"), Path("lib.so"), flush_denormals=True)
    assert CLANG_FTZ in flushed and CLANG_FTZ not in cmd


def test_upstream_clang_builds_nvidia_targets_only() -> None:
    assert foreign_archs("clang", ("sm_80", "sm_90")) == []
    assert foreign_archs("clang", ("ivcore10",)) == ["ivcore10"]


def test_every_family_has_variants_for_upstream_clang_and_a_stable_key() -> None:
    assert DECODE.variants_for("clang")
    assert PREFILL.variants_for("clang")
    assert build.family_key(CLANG, DECODE) == build.family_key(CLANG, DECODE)
