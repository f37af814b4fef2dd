"""A regular (non-editable) install carries every kernel source and the recorded facts, the
next family's included (the wheel is what pip installs)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]
NATIVE = PACKAGE / "src" / "attn_core" / "native"
DATA_SUFFIXES = (".cu", ".cuh", ".h")


def _copy_package(dest: Path) -> Path:
    """The package's own files in ``dest`` (a build writes build/ and *.egg-info beside them)."""
    root = dest / "attn-core"
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_prebuilt", "tests")
    shutil.copytree(PACKAGE, root, ignore=ignore)
    return root


def _can_build_wheels() -> bool:
    """Whether this environment builds a wheel offline (``--no-build-isolation``): setuptools
    70.1 or later has bdist_wheel, older ones need the ``wheel`` package."""
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _wheel(root: Path, out: Path, **env: str) -> list[str]:
    """The file list of the wheel ``pip wheel`` builds from ``root``."""
    if not _can_build_wheels():
        pytest.skip("building a wheel offline needs setuptools >= 70.1 or the wheel package")
    environ = {**os.environ, "ATTN_CORE_NATIVE_BUILD": "0", **env}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "-q", "-w", str(out), str(root)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=environ, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("attn_core-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_ships_every_kernel_source_and_the_recorded_facts(tmp_path: Path) -> None:
    names = set(_wheel(_copy_package(tmp_path), tmp_path / "dist"))
    sources = [p for p in (NATIVE / "csrc").iterdir() if p.suffix in DATA_SUFFIXES]
    assert sources, "no kernel sources found"
    missing = [p.name for p in sources if f"attn_core/native/csrc/{p.name}" not in names]
    assert not missing, f"the wheel lacks csrc files {missing}"
    assert "attn_core/native/kernel_facts.json" in names


def test_the_next_family_s_files_ship_without_a_packaging_change(tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    csrc = root / "src" / "attn_core" / "native" / "csrc"
    for name in ("paged_next.cu", "next_tile.cuh", "attn_next_abi.h"):
        (csrc / name).write_text("// a future family\n")
    names = set(_wheel(root, tmp_path / "dist"))
    for name in ("paged_next.cu", "next_tile.cuh", "attn_next_abi.h"):
        assert f"attn_core/native/csrc/{name}" in names, name
